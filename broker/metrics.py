"""Prometheus metrics of one broker (its own registry, so several brokers can live in one test process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

API_NAMES = ("produce", "fetch", "list_offsets", "offsets_for_leader_epoch", "metadata", "leader_and_isr",
             "stop_replica", "update_metadata")


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.isr_shrinks = Counter("minibroker_isr_shrinks", "ISR shrinks committed", registry=r)
        self.isr_expands = Counter("minibroker_isr_expands", "ISR expansions committed", registry=r)
        self.bytes_in = Counter("minibroker_bytes_in", "record bytes appended as leader", registry=r)
        self.bytes_out = Counter("minibroker_bytes_out", "record bytes sent by fetch", registry=r)
        self.messages_in = Counter("minibroker_messages_in", "records appended as leader", registry=r)
        self.requests = Counter("minibroker_requests", "requests per API and HTTP status", ["api", "status"],
                                registry=r)
        self.latency = Histogram("minibroker_request_latency_seconds", "request latency per API", ["api"],
                                 registry=r, buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                      0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
        self.under_replicated = Gauge("minibroker_under_replicated_partitions",
                                      "led partitions with ISR smaller than the replica set", registry=r)
        self.offline = Gauge("minibroker_offline_partitions", "partitions with no leader (metadata)", registry=r)
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
