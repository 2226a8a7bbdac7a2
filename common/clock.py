"""Injected time. Logic takes a Clock; only the shell uses SystemClock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (timestamps, segment.ms, retention.ms)."""
        ...

    def monotonic_ms(self) -> int:
        """Monotonic milliseconds (timeouts, lag, liveness)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, now_ms: int = 1_700_000_000_000, monotonic_ms: int = 0) -> None:
        self._now_ms = now_ms
        self._monotonic_ms = monotonic_ms

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> int:
        return self._monotonic_ms

    def advance(self, ms: int) -> None:
        assert ms >= 0, "time only moves forward"
        self._now_ms += ms
        self._monotonic_ms += ms
