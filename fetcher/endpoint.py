"""The leader as a fetcher sees it: ``LeaderEndpoint`` and its HTTP implementation.

Kafka's ``LeaderEndPoint``: Fetch, OffsetsForLeaderEpoch and ListOffsets
(earliest / latest) with typed values in and out. ``HttpLeaderEndpoint``
speaks ``docs/protocol.md`` over ``common.http.RpcClient``; tests drive a
fetcher task against a fake leader implementing the same protocol.

Failures:
- per partition: an ``ErrorCode`` in the typed answer (the task parks the partition);
- whole request (unreachable peer, timeout, HTTP 4xx, a malformed answer):
  ``LeaderUnavailableError`` (the task backs off as a whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from broker.requests import FetchRequest as FetchRequest  # the broker's request shape, re-exported: the interface
from common.errors import ErrorCode
from common.http import RpcClient, RpcError, fetch_response_limit
from common.wire import TopicPartition
from fetcher.api import BrokerEndpoint
from fetcher.state import EpochEndOffset

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


class LeaderUnavailableError(Exception):
    """The whole request failed: connection, timeout, rejected body or a malformed answer."""


@dataclass(frozen=True, slots=True)
class FetchPartitionData:
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    diverging_epoch: EpochEndOffset | None = None
    records: bytes = b""


@dataclass(frozen=True, slots=True)
class FetchResponse:
    error: ErrorCode
    partitions: Mapping[TopicPartition, FetchPartitionData]


@dataclass(frozen=True, slots=True)
class EpochRequest:
    current_leader_epoch: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class EpochAnswer:
    error: ErrorCode
    epoch_end: EpochEndOffset


@dataclass(frozen=True, slots=True)
class OffsetAnswer:
    error: ErrorCode
    offset: int


class LeaderEndpoint(Protocol):
    @property
    def broker(self) -> BrokerEndpoint: ...

    async def fetch(self, request: FetchRequest) -> FetchResponse: ...

    async def offsets_for_leader_epoch(self, replica_id: int,
                                       requests: Mapping[TopicPartition, EpochRequest]
                                       ) -> dict[TopicPartition, EpochAnswer]: ...

    async def list_offset(self, replica_id: int, tp: TopicPartition, current_leader_epoch: int,
                          timestamp: int) -> OffsetAnswer:
        """``timestamp``: LATEST_TIMESTAMP (the leader's LEO for a replica) or EARLIEST_TIMESTAMP."""
        ...

    async def close(self) -> None: ...


# --- HTTP -----------------------------------------------------------------------------------


def _nest(items: Mapping[TopicPartition, dict[str, Any]]) -> list[dict[str, Any]]:
    """``{tp: fields}`` -> ``[{topic, partitions: [{partition, **fields}]}]`` keeping order."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for tp, fields in items.items():
        topics.setdefault(tp.topic, []).append({"partition": tp.partition, **fields})
    return [{"topic": topic, "partitions": parts} for topic, parts in topics.items()]


def _int(obj: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = obj.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise LeaderUnavailableError(f"malformed answer: field {name!r} is {type(value).__name__}")
    return value


def _unnest(body: Mapping[str, Any]) -> list[tuple[TopicPartition, Mapping[str, Any]]]:
    out: list[tuple[TopicPartition, Mapping[str, Any]]] = []
    topics = body.get("topics", [])
    if not isinstance(topics, list):
        raise LeaderUnavailableError("malformed answer: 'topics' is not a list")
    for t in topics:
        if not isinstance(t, dict) or not isinstance(t.get("topic"), str) or not isinstance(t.get("partitions"), list):
            raise LeaderUnavailableError("malformed answer: bad topic entry")
        for p in t["partitions"]:
            if not isinstance(p, dict):
                raise LeaderUnavailableError("malformed answer: bad partition entry")
            out.append((TopicPartition(t["topic"], _int(p, "partition")), p))
    return out


def encode_fetch(request: FetchRequest) -> dict[str, Any]:
    return {
        "replica_id": request.replica_id,
        "broker_epoch": request.broker_epoch,
        "max_wait_ms": request.max_wait_ms,
        "min_bytes": request.min_bytes,
        "max_bytes": request.max_bytes,
        "topics": _nest({tp: {"fetch_offset": p.fetch_offset,
                              "current_leader_epoch": p.current_leader_epoch,
                              "last_fetched_epoch": p.last_fetched_epoch,
                              "log_start_offset": p.log_start_offset,
                              "partition_max_bytes": p.partition_max_bytes}
                         for tp, p in request.partitions.items()}),
    }


def decode_fetch(body: Mapping[str, Any]) -> FetchResponse:
    partitions: dict[TopicPartition, FetchPartitionData] = {}
    for tp, p in _unnest(body):
        diverging = p.get("diverging_epoch")
        epoch_end = None
        if isinstance(diverging, dict):
            epoch_end = EpochEndOffset(_int(diverging, "epoch"), _int(diverging, "end_offset"))
        records = p.get("records") or b""
        if not isinstance(records, bytes):
            raise LeaderUnavailableError(f"malformed answer: records of {tp} are {type(records).__name__}")
        partitions[tp] = FetchPartitionData(
            error=ErrorCode.of(_int(p, "error", 0)),
            high_watermark=_int(p, "high_watermark", -1),
            log_start_offset=_int(p, "log_start_offset", -1),
            log_end_offset=_int(p, "log_end_offset", -1),
            diverging_epoch=epoch_end,
            records=records,
        )
    return FetchResponse(ErrorCode.of(_int(body, "error", 0)), partitions)


class HttpLeaderEndpoint:
    """A leader broker reached over HTTP; one keep-alive session per fetcher task."""

    def __init__(self, broker: BrokerEndpoint, *, timeout_ms: int = 30_000) -> None:
        self._broker = broker
        self._timeout_s = timeout_ms / 1000
        self._rpc = RpcClient(limit_per_host=2, timeout_s=self._timeout_s)

    @property
    def broker(self) -> BrokerEndpoint:
        return self._broker

    async def _call(self, api: str, body: dict[str, Any], timeout_s: float | None = None,
                    max_response_bytes: int | None = None) -> dict[str, Any]:
        try:
            return await self._rpc.call(self._broker.address, api, body, timeout_s=timeout_s,
                                        max_response_bytes=max_response_bytes)
        except (RpcError, ValueError) as exc:  # msgpack's decode errors are ValueErrors
            raise LeaderUnavailableError(str(exc)) from exc

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        # The long poll may legitimately take max_wait_ms; the socket timeout comes on top.
        timeout_s = self._timeout_s + request.max_wait_ms / 1000
        return decode_fetch(await self._call("fetch", encode_fetch(request), timeout_s,
                                             fetch_response_limit(request.max_bytes)))

    async def offsets_for_leader_epoch(self, replica_id: int,
                                       requests: Mapping[TopicPartition, EpochRequest]
                                       ) -> dict[TopicPartition, EpochAnswer]:
        body = {"replica_id": replica_id,
                "topics": _nest({tp: {"current_leader_epoch": r.current_leader_epoch,
                                      "leader_epoch": r.leader_epoch} for tp, r in requests.items()})}
        answer = await self._call("offsets_for_leader_epoch", body)
        top_error = ErrorCode.of(_int(answer, "error", 0))
        out: dict[TopicPartition, EpochAnswer] = {}
        for tp, p in _unnest(answer):
            error = ErrorCode.of(_int(p, "error", 0))
            out[tp] = EpochAnswer(error if error is not ErrorCode.NONE else top_error,
                                  EpochEndOffset(_int(p, "leader_epoch", -1), _int(p, "end_offset", -1)))
        for tp in requests:  # a partition the leader left out is an error, never "no truncation"
            if tp not in out:
                code = top_error if top_error is not ErrorCode.NONE else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                out[tp] = EpochAnswer(code, EpochEndOffset(-1, -1))
        return out

    async def list_offset(self, replica_id: int, tp: TopicPartition, current_leader_epoch: int,
                          timestamp: int) -> OffsetAnswer:
        body = {"replica_id": replica_id, "isolation_level": 0,
                "topics": _nest({tp: {"current_leader_epoch": current_leader_epoch, "timestamp": timestamp}})}
        answer = await self._call("list_offsets", body)
        for got, p in _unnest(answer):
            if got == tp:
                return OffsetAnswer(ErrorCode.of(_int(p, "error", 0)), _int(p, "offset", -1))
        return OffsetAnswer(ErrorCode.of(_int(answer, "error", 0)) or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)

    async def close(self) -> None:
        await self._rpc.close()
