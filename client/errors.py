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
    "CorruptRecordError",
    "DeliveryTimeoutError",
    "ErrorCode",
    "MinibrokerError",
    "NoBrokersAvailableError",
    "ProducerClosedError",
    "ProducerIdUnavailableError",
    "UnsupportedVersionError",
    "error_for",
    "error_name",
    "is_definite_failure",
]


class ClientError(MinibrokerError):
    """A client-side failure that is not a wire code. ``report_name``: its name in delivery reports, in the
    style of the wire codes' names (``error_name``); None for the class name."""

    report_name: str | None = None


class DeliveryTimeoutError(ClientError):
    """``delivery.timeout.ms`` passed before the record was acknowledged (Kafka's TimeoutException)."""

    code = ErrorCode.REQUEST_TIMED_OUT
    report_name = "DELIVERY_TIMEOUT"


class NoBrokersAvailableError(ClientError):
    """None of the bootstrap or known brokers answered."""

    code = ErrorCode.NETWORK_EXCEPTION
    report_name = "NO_BROKERS_AVAILABLE"


class BufferExhaustedError(ClientError):
    """``buffer.memory`` stayed full for ``max.block.ms`` (Kafka's BufferExhaustedException)."""

    code = ErrorCode.REQUEST_TIMED_OUT
    report_name = "BUFFER_EXHAUSTED"


class ProducerClosedError(ClientError):
    """``send`` after ``close``."""

    report_name = "PRODUCER_CLOSED"


class ProducerIdUnavailableError(ClientError):
    """An idempotent producer got no producer id within ``max.block.ms`` (every broker unreachable, or still
    answering COORDINATOR_LOAD_IN_PROGRESS); the records waiting for one fail with it, never sent (Kafka's
    TimeoutException "Timeout expired after ...ms while awaiting InitProducerId")."""

    code = ErrorCode.REQUEST_TIMED_OUT
    report_name = "PRODUCER_ID_UNAVAILABLE"


class UnsupportedVersionError(ClientError):
    """The broker does not know an API the client needs (HTTP 404): here ``init_producer_id`` for
    ``enable.idempotence=true`` (Kafka's UnsupportedVersionException, fatal for the producer)."""

    code = ErrorCode.INVALID_REQUEST
    report_name = "UNSUPPORTED_VERSION"


class CorruptRecordError(ClientError):
    """A fetched batch's records do not decode (Kafka's consumer: "Received exception when fetching the
    next record ... If needed, please seek past the record to continue consumption")."""

    code = ErrorCode.CORRUPT_MESSAGE


# Answers a leader gives before it appends anything: a send that only ever got these (or was never sent)
# definitely did not write. Anything else (a timeout, a lost connection, NOT_LEADER_OR_FOLLOWER, which a
# delayed produce also returns after its append) leaves the outcome unknown. OUT_OF_ORDER_SEQUENCE_NUMBER and
# INVALID_PRODUCER_EPOCH are deliberately not here: the leader appended nothing for *this* attempt, but they
# come after an earlier attempt of the same batch whose answer was lost or refused, and that attempt may be
# in the log (SPEC: not definite failures).
NOT_APPENDED = frozenset({
    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE,
    ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_REQUIRED_ACKS, ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_TIMESTAMP,
})


def is_definite_failure(exc: BaseException) -> bool:
    """True when the producer knows no attempt of the failed send can have been written (Jepsen's
    ``fail``); False when it may have been (``info``)."""
    return bool(getattr(exc, "definite_failure", False))


def error_name(exc: BaseException) -> str:
    """The short name used in delivery reports: the wire code's name, the ``report_name`` of a client-side
    condition (any exception class may carry one), else the class name."""
    name = getattr(exc, "report_name", None)
    if isinstance(name, str):
        return name
    if isinstance(exc, MinibrokerError) and not isinstance(exc, ClientError):
        return exc.code.name
    return type(exc).__name__
