"""Helpers shared by the client tests."""

from __future__ import annotations

from typing import Any

from client import ProducerConfig


def fast(**kw: Any) -> ProducerConfig:
    """Producer settings for tests: short linger, backoff and timeouts. ``delivery.timeout.ms`` must cover
    ``linger.ms + request.timeout.ms`` (Kafka's rule), so a short delivery timeout gets a shorter request
    timeout, and a long linger a longer delivery timeout, unless the test sets them itself."""
    base: dict[str, Any] = {"linger_ms": 2, "retry_backoff_ms": 20, "delivery_timeout_ms": 10_000,
                            "request_timeout_ms": 5_000}
    base.update(kw)
    if "request_timeout_ms" not in kw and "delivery_timeout_ms" in kw:  # a long linger alone moves the latter
        base["request_timeout_ms"] = max(1, min(5_000, base["delivery_timeout_ms"] - base["linger_ms"]))
    if "delivery_timeout_ms" not in kw:
        base["delivery_timeout_ms"] = max(10_000, base["linger_ms"] + base["request_timeout_ms"])
    return ProducerConfig(**base)
