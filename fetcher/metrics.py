"""Fetcher metrics: Prometheus series plus plain counters tests and benchmarks read.

Series live in the registry the manager is given (the broker's own registry, so
several brokers can share a test process), else in prometheus_client's default
one. They are labelled by the local ``broker_id`` and the ``leader`` / ``fetcher``
of a task; per-partition series are removed when the partition leaves the
fetcher so they do not leak.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from common.wire import TopicPartition


class FetcherMetrics:
    """The fetcher's series in one registry (created once per registry)."""

    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, FetcherMetrics] = weakref.WeakKeyDictionary()

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter("minibroker_fetcher_requests", "Fetch requests sent by replica fetchers",
                                ["broker_id", "leader", "fetcher"], registry=r)
        self.bytes = Counter("minibroker_fetcher_bytes", "Record bytes appended by replica fetchers",
                             ["broker_id", "leader", "fetcher"], registry=r)
        self.errors = Counter("minibroker_fetcher_partition_errors", "Partitions parked after an error",
                              ["broker_id", "leader", "fetcher", "error"], registry=r)
        self.backoffs = Counter("minibroker_fetcher_backoffs", "Whole-task backoffs (leader unreachable)",
                                ["broker_id", "leader", "fetcher"], registry=r)
        self.truncations = Counter("minibroker_fetcher_truncations", "Follower log truncations",
                                   ["broker_id", "topic", "partition", "reason"], registry=r)
        self.lag = Gauge("minibroker_fetcher_partition_lag", "Leader HW minus the follower fetch offset",
                         ["broker_id", "topic", "partition"], registry=r)

    @classmethod
    def of(cls, registry: CollectorRegistry | None) -> FetcherMetrics:
        registry = registry if registry is not None else REGISTRY
        found = cls._by_registry.get(registry)
        if found is None:
            found = cls._by_registry[registry] = cls(registry)
        return found


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
    def __init__(self, broker_id: int, leader_id: int, fetcher_id: int,
                 registry: CollectorRegistry | None = None) -> None:
        self._m = FetcherMetrics.of(registry)
        self._broker = str(broker_id)
        labels = (self._broker, str(leader_id), str(fetcher_id))
        self._labels = labels
        self.requests = self._m.requests.labels(*labels)
        self.bytes = self._m.bytes.labels(*labels)
        self.backoffs = self._m.backoffs.labels(*labels)
        self._lag: dict[TopicPartition, Any] = {}

    def error(self, error: str) -> None:
        self._m.errors.labels(*self._labels, error).inc()

    def truncation(self, tp: TopicPartition, reason: str) -> None:
        self._m.truncations.labels(self._broker, tp.topic, str(tp.partition), reason).inc()

    def lag(self, tp: TopicPartition, lag: int) -> None:
        gauge = self._lag.get(tp)
        if gauge is None:
            gauge = self._lag[tp] = self._m.lag.labels(self._broker, tp.topic, str(tp.partition))
        gauge.set(lag)

    def forget(self, tp: TopicPartition) -> None:
        if self._lag.pop(tp, None) is None:
            return
        with contextlib.suppress(KeyError):
            self._m.lag.remove(self._broker, tp.topic, str(tp.partition))
