"""Errors a client raises.

Wire errors come from ``common.errors`` (one class per Kafka code, with a
``retriable`` flag); this module adds the client-side conditions Kafka's
clients also have: a record that could not be delivered in time, no reachable
broker, and bad arguments.
"""

from __future__ import annotations

from common.errors import ErrorCode, MinibrokerError, error_for

__all__ = [
    "BufferExhaustedError",
    "ClientError",
    "DeliveryTimeoutError",
    "ErrorCode",
    "MinibrokerError",
    "NoBrokersAvailableError",
    "ProducerClosedError",
    "error_for",
    "error_name",
]


class ClientError(MinibrokerError):
    """A client-side failure that is not a wire code."""


class DeliveryTimeoutError(ClientError):
    """``delivery.timeout.ms`` passed before the record was acknowledged (Kafka's TimeoutException)."""

    code = ErrorCode.REQUEST_TIMED_OUT


class NoBrokersAvailableError(ClientError):
    """None of the bootstrap or known brokers answered."""

    code = ErrorCode.NETWORK_EXCEPTION


class BufferExhaustedError(ClientError):
    """``buffer.memory`` stayed full for ``max.block.ms`` (Kafka's BufferExhaustedException)."""

    code = ErrorCode.REQUEST_TIMED_OUT


class ProducerClosedError(ClientError):
    """``send`` after ``close``."""


def error_name(exc: BaseException) -> str:
    """The short name used in delivery reports: the wire code's name, else the class name."""
    if isinstance(exc, DeliveryTimeoutError):
        return "DELIVERY_TIMEOUT"
    if isinstance(exc, BufferExhaustedError):
        return "BUFFER_EXHAUSTED"
    if isinstance(exc, NoBrokersAvailableError):
        return "NO_BROKERS_AVAILABLE"
    if isinstance(exc, MinibrokerError) and not isinstance(exc, ClientError):
        return exc.code.name
    return type(exc).__name__
