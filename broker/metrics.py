"""Prometheus metrics of one broker (its own registry, so several brokers can live in one test process).

The series counted on every produce and fetch (requests, latency, bytes and
messages in and out) are plain integers and floats that a collector turns into
Prometheus families at scrape time. prometheus-client's ``Counter.inc`` and
``Histogram.observe`` take a lock and check their arguments on each call: about
2 us of Python per produce request, measured in a loop, and five times that
inside a loaded broker (docs/benchmarks/broker.md, tenth session). All of them
are updated and scraped on the broker's event loop thread, so they need no lock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

API_NAMES = ("produce", "fetch", "list_offsets", "offsets_for_leader_epoch", "metadata", "leader_and_isr",
             "stop_replica", "update_metadata", "init_producer_id")
# Fetches are also counted by who sent them, as Kafka's request metrics FetchConsumer and FetchFollower:
# followers' long polls would otherwise hide the consumers' latency in the one "fetch" histogram.
FETCH_KINDS = ("fetch_consumer", "fetch_follower")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BUCKET_LABELS = (*(repr(b) for b in LATENCY_BUCKETS), "+Inf")  # as prometheus-client writes them: "1.0"


class RequestStats:
    """Requests of one API by HTTP status, those answered UNKNOWN_SERVER_ERROR, and their latency histogram."""

    __slots__ = ("buckets", "errors", "ok", "other", "seconds")

    def __init__(self) -> None:
        self.ok = 0
        self.other: dict[int, int] = {}  # HTTP status (400, 413) -> requests
        self.errors = 0  # answered UNKNOWN_SERVER_ERROR (HTTP 200) after an unexpected exception
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # per bucket, not cumulative; the last is +Inf
        self.seconds = 0.0

    def observe(self, status: int, seconds: float) -> None:
        if status == 200:
            self.ok += 1
        else:
            self.other[status] = self.other.get(status, 0) + 1
        # the first bound >= seconds: Prometheus buckets are "less than or equal"
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.seconds += seconds


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.isr_shrinks = Counter("minibroker_isr_shrinks", "ISR shrinks committed", registry=r)
        self.isr_expands = Counter("minibroker_isr_expands", "ISR expansions committed", registry=r)
        self.bytes_in = 0  # record bytes appended as leader
        self.bytes_out = 0  # record bytes sent to consumers
        self.replication_bytes_out = 0  # record bytes sent to followers
        self.messages_in = 0  # records appended as leader
        self.requests = {api: RequestStats() for api in (*API_NAMES, *FETCH_KINDS)}
        r.register(_Collector(self))
        self.under_replicated = Gauge("minibroker_under_replicated_partitions",
                                      "led partitions with ISR smaller than the replica set", registry=r)
        # Kafka's OfflinePartitionsCount is the active controller's alone; every broker reports this one from
        # its metadata (the same partitions), so do not sum it over brokers
        self.offline = Gauge("minibroker_offline_partitions", "partitions with no leader in this broker's metadata "
                             "(every broker sees the same ones; the cluster count is "
                             "minibroker_controller_offline_partitions)", registry=r)
        self.delayed = Gauge("minibroker_delayed_operations", "delayed operations waiting", ["purgatory"],
                             registry=r)

    def bind(self, under_replicated: Callable[[], int], offline: Callable[[], int],
             produce_waiting: Callable[[], int], fetch_waiting: Callable[[], int]) -> None:
        """Gauges computed at scrape time."""
        self.under_replicated.set_function(lambda: float(under_replicated()))
        self.offline.set_function(lambda: float(offline()))
        self.delayed.labels("produce").set_function(lambda: float(produce_waiting()))
        self.delayed.labels("fetch").set_function(lambda: float(fetch_waiting()))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Collector:
    """The plain counters of a ``BrokerMetrics`` as Prometheus families."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        yield CounterMetricFamily("minibroker_bytes_in", "record bytes appended as leader", value=m.bytes_in)
        # Kafka's BytesOutPerSec counts client fetches only; followers' are ReplicationBytesOutPerSec
        yield CounterMetricFamily("minibroker_bytes_out", "record bytes sent to consumers by fetch",
                                  value=m.bytes_out)
        yield CounterMetricFamily("minibroker_replication_bytes_out", "record bytes sent to followers by fetch",
                                  value=m.replication_bytes_out)
        yield CounterMetricFamily("minibroker_messages_in", "records appended as leader", value=m.messages_in)
        requests = CounterMetricFamily("minibroker_requests", "requests per API and HTTP status (fetches also "
                                       "as fetch_consumer and fetch_follower)", labels=["api", "status"])
        errors = CounterMetricFamily("minibroker_request_errors", "requests answered UNKNOWN_SERVER_ERROR after "
                                     "an unexpected exception (HTTP 200 with that error code; see the log)",
                                     labels=["api"])
        latency = HistogramMetricFamily("minibroker_request_latency_seconds", "request latency per API",
                                        labels=["api"])
        for api, stats in m.requests.items():
            requests.add_metric([api, "200"], stats.ok)
            for status in sorted({400, *stats.other}):
                requests.add_metric([api, str(status)], stats.other.get(status, 0))
            errors.add_metric([api], stats.errors)
            buckets = list(zip(_BUCKET_LABELS, accumulate(stats.buckets), strict=True))  # Prometheus: cumulative
            latency.add_metric([api], buckets, sum_value=stats.seconds)
        yield requests
        yield errors
        yield latency
