"""argparse types for numeric flags.

A value out of range is refused while the command line is parsed: one usage
line and exit status 2, before any process starts or any file is written,
instead of a traceback (or a silent nonsense run) later.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)

# No count, size, offset or duration of ours goes beyond a signed 64-bit integer (the wire's and Kafka's
# LONG); a larger value is refused here rather than failing in msgpack's encoder later.
INT64_MAX = 2**63 - 1


def _int(text: str) -> int:
    """``int`` of ASCII digits only: ``int`` also reads other scripts' digits ('٣' is 3)."""
    if not text.isascii():
        raise ValueError(text)
    return int(text)


def _show(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bounded(name: str, convert: Callable[[str], N], kind: str, low: N, high: N | None,
             strict: bool) -> Callable[[str], N]:
    def parse(text: str) -> N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {kind}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):  # inf or nan: no run is meant to last forever
            raise argparse.ArgumentTypeError(f"{name} must be a finite number, got {text}")
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"{name} must be {'>' if strict else '>='} {_show(low)}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{name} must be at most {_show(high)}, got {text}")
        return value
    return parse


def positive(name: str) -> Callable[[str], int]:
    """An integer > 0."""
    return _bounded(name, _int, "an integer", 0, INT64_MAX, strict=True)


def non_negative(name: str) -> Callable[[str], int]:
    """An integer >= 0."""
    return _bounded(name, _int, "an integer", 0, INT64_MAX, strict=False)


def int_range(name: str, low: int, high: int) -> Callable[[str], int]:
    """An integer from ``low`` to ``high`` (an id of Kafka's int32, say)."""
    return _bounded(name, _int, "an integer", low, high, strict=False)


def number(name: str) -> Callable[[str], float]:
    """Any finite number (e.g. a rate where -1 means "no limit")."""
    return _bounded(name, float, "a number", float("-inf"), None, strict=False)


def positive_float(name: str) -> Callable[[str], float]:
    """A number > 0 (seconds, rates)."""
    return _bounded(name, float, "a number", 0.0, None, strict=True)


def non_negative_float(name: str) -> Callable[[str], float]:
    """A number >= 0."""
    return _bounded(name, float, "a number", 0.0, None, strict=False)


def port(name: str) -> Callable[[str], int]:
    """A TCP port, 1-65535."""
    return _bounded(name, _int, "a port number", 1, 65535, strict=False)
