"""Fetcher metrics: Prometheus series (default registry) plus plain counters tests and benchmarks read.

Series are labelled by the local ``broker_id`` (several brokers may share a test
process) and the ``leader`` / ``fetcher`` of a task; per-partition series are
removed when the partition leaves the fetcher so they do not leak.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge

from common.wire import TopicPartition

FETCH_REQUESTS = Counter("minibroker_fetcher_requests", "Fetch requests sent by replica fetchers",
                         ["broker_id", "leader", "fetcher"])
FETCH_BYTES = Counter("minibroker_fetcher_bytes", "Record bytes appended by replica fetchers",
                      ["broker_id", "leader", "fetcher"])
FETCH_ERRORS = Counter("minibroker_fetcher_partition_errors", "Partitions parked after an error",
                       ["broker_id", "leader", "fetcher", "error"])
FETCHER_BACKOFFS = Counter("minibroker_fetcher_backoffs", "Whole-task backoffs (leader unreachable)",
                           ["broker_id", "leader", "fetcher"])
TRUNCATIONS = Counter("minibroker_fetcher_truncations", "Follower log truncations",
                      ["broker_id", "topic", "partition", "reason"])
PARTITION_LAG = Gauge("minibroker_fetcher_partition_lag", "Leader HW minus the follower fetch offset",
                      ["broker_id", "topic", "partition"])


@dataclass(slots=True)
class FetcherStats:
    """Plain counters of one task (read by tests and the benchmark; not a wire contract)."""

    fetch_requests: int = 0
    fetches_interrupted: int = 0
    epoch_requests: int = 0
    bytes_appended: int = 0
    appends: int = 0
    truncations: int = 0
    partition_errors: int = 0
    backoffs: int = 0
    first_append_delays_ms: list[int] = field(default_factory=list)  # partition added -> first append


class TaskMetrics:
    def __init__(self, broker_id: int, leader_id: int, fetcher_id: int) -> None:
        self._broker = str(broker_id)
        labels = (self._broker, str(leader_id), str(fetcher_id))
        self._labels = labels
        self.requests = FETCH_REQUESTS.labels(*labels)
        self.bytes = FETCH_BYTES.labels(*labels)
        self.backoffs = FETCHER_BACKOFFS.labels(*labels)
        self._lag: dict[TopicPartition, Any] = {}

    def error(self, error: str) -> None:
        FETCH_ERRORS.labels(*self._labels, error).inc()

    def truncation(self, tp: TopicPartition, reason: str) -> None:
        TRUNCATIONS.labels(self._broker, tp.topic, str(tp.partition), reason).inc()

    def lag(self, tp: TopicPartition, lag: int) -> None:
        gauge = self._lag.get(tp)
        if gauge is None:
            gauge = self._lag[tp] = PARTITION_LAG.labels(self._broker, tp.topic, str(tp.partition))
        gauge.set(lag)

    def forget(self, tp: TopicPartition) -> None:
        if self._lag.pop(tp, None) is None:
            return
        with contextlib.suppress(KeyError):
            PARTITION_LAG.remove(self._broker, tp.topic, str(tp.partition))
