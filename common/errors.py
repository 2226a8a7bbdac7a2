"""Wire error codes.

The numbers are Kafka's (``org.apache.kafka.common.protocol.Errors``) and never
change. ``retriable`` follows Kafka's ``RetriableException`` hierarchy: a client
may retry the same request (usually after refreshing metadata) and expect it to
succeed eventually.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    STALE_CONTROLLER_EPOCH = 11
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14  # InitProducerId before the broker has producer ids to hand out
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    INVALID_TIMESTAMP = 32
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    KAFKA_STORAGE_ERROR = 56
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    INVALID_RECORD = 87
    INVALID_UPDATE_VERSION = 95
    DUPLICATE_BROKER_REGISTRATION = 101
    BROKER_ID_NOT_REGISTERED = 102
    INCONSISTENT_CLUSTER_ID = 104
    INELIGIBLE_REPLICA = 107

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE

    @classmethod
    def of(cls, code: int) -> ErrorCode:
        """Map a wire integer to a code; unknown numbers become UNKNOWN_SERVER_ERROR."""
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


_RETRIABLE = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
    }
)


class MinibrokerError(Exception):
    """An error that carries a wire code. Subclasses pick the code."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", code: ErrorCode | None = None) -> None:
        super().__init__(message or (code or self.code).name)
        if code is not None:
            self.code = code

    @property
    def retriable(self) -> bool:
        return self.code.retriable


def error_for(code: int, message: str = "") -> MinibrokerError:
    """The exception a client raises for a wire code (one class per code, made on demand)."""
    ec = ErrorCode.of(code)
    return _ERROR_CLASSES[ec](message or ec.name)


def _make_classes() -> dict[ErrorCode, type[MinibrokerError]]:
    classes: dict[ErrorCode, type[MinibrokerError]] = {}
    for ec in ErrorCode:
        name = "".join(part.capitalize() for part in ec.name.split("_")) + "Error"
        classes[ec] = type(name, (MinibrokerError,), {"code": ec})
    return classes


_ERROR_CLASSES = _make_classes()
