"""Fetcher metrics: Prometheus series plus plain counters tests and benchmarks read.

Series live in the registry the manager is given (the broker's own registry, so
several brokers can share a test process), else in prometheus_client's default
one. They are labelled by the local ``broker_id`` and the ``leader`` / ``fetcher``
of a task. Nothing leaks (Kafka removes a partition's fetcher metrics when
it leaves the fetcher, and a fetcher thread's when the thread shuts down):
per-partition series (lag, truncations) go when the partition leaves its
task, per-task ones (requests, bytes, backoffs, partition errors) when the
last live task with their labels stops. Each registry records which task owns
a partition's series and how many live tasks share a task label set (a leader
address change makes a new task with the same labels before the old one has
stopped), so a late stop never removes series another task still updates.
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
        # live tasks per (broker_id, leader, fetcher), and who owns each partition's series
        self.tasks: dict[tuple[str, str, str], _TaskSeries] = {}
        self.partitions: dict[tuple[str, TopicPartition], _PartitionSeries] = {}

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


@dataclass(slots=True)
class _TaskSeries:
    """The series of one (broker_id, leader, fetcher) label set, shared by the live tasks with it."""

    users: int = 0
    errors: set[str] = field(default_factory=set)  # "error" label values created


@dataclass(slots=True)
class _PartitionSeries:
    """The series of one partition of one broker: its last owner and the children created."""

    owner: TaskMetrics
    lag: Any = None
    reasons: set[str] = field(default_factory=set)  # "reason" label values of truncations


class TaskMetrics:
    """One task's view of the series; ``forget`` when a partition leaves it, ``close`` when it stops."""

    def __init__(self, broker_id: int, leader_id: int, fetcher_id: int,
                 registry: CollectorRegistry | None = None) -> None:
        self._m = FetcherMetrics.of(registry)
        self._broker = str(broker_id)
        labels = (self._broker, str(leader_id), str(fetcher_id))
        self._labels = labels
        series = self._m.tasks.get(labels)
        if series is None:
            series = self._m.tasks[labels] = _TaskSeries()
        series.users += 1
        self._series = series
        self._closed = False
        self.requests = self._m.requests.labels(*labels)
        self.bytes = self._m.bytes.labels(*labels)
        self.backoffs = self._m.backoffs.labels(*labels)
        self._claimed: set[TopicPartition] = set()

    def error(self, error: str) -> None:
        self._series.errors.add(error)
        self._m.errors.labels(*self._labels, error).inc()

    def _claim(self, tp: TopicPartition) -> _PartitionSeries:
        key = (self._broker, tp)
        series = self._m.partitions.get(key)
        if series is None:
            series = self._m.partitions[key] = _PartitionSeries(self)
        series.owner = self
        self._claimed.add(tp)
        return series

    def truncation(self, tp: TopicPartition, reason: str) -> None:
        self._claim(tp).reasons.add(reason)
        self._m.truncations.labels(self._broker, tp.topic, str(tp.partition), reason).inc()

    def lag(self, tp: TopicPartition, lag: int) -> None:
        series = self._claim(tp)
        if series.lag is None:
            series.lag = self._m.lag.labels(self._broker, tp.topic, str(tp.partition))
        series.lag.set(lag)

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` left this task: remove its series, unless another task of the broker took them over."""
        self._claimed.discard(tp)
        key = (self._broker, tp)
        series = self._m.partitions.get(key)
        if series is None or series.owner is not self:
            return
        del self._m.partitions[key]
        labels = (self._broker, tp.topic, str(tp.partition))
        if series.lag is not None:
            with contextlib.suppress(KeyError):
                self._m.lag.remove(*labels)
        for reason in series.reasons:
            with contextlib.suppress(KeyError):
                self._m.truncations.remove(*labels, reason)

    def close(self) -> None:
        """The task stopped: forget its partitions; the task series go with the last task using them."""
        if self._closed:
            return
        self._closed = True
        for tp in list(self._claimed):
            self.forget(tp)
        self._series.users -= 1
        if self._series.users > 0:
            return  # a newer task with the same labels (leader address change) still counts in them
        if self._m.tasks.get(self._labels) is self._series:
            del self._m.tasks[self._labels]
        for metric in (self._m.requests, self._m.bytes, self._m.backoffs):
            with contextlib.suppress(KeyError):
                metric.remove(*self._labels)
        for error in self._series.errors:
            with contextlib.suppress(KeyError):
                self._m.errors.remove(*self._labels, error)
