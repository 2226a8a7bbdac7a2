"""Fakes behind the fetcher's real interfaces, with real storage ``Log``s underneath.

- ``FakeLeader`` implements ``fetcher.endpoint.LeaderEndpoint``: it answers from real
  leader ``Log``s the way a broker does (epoch checks, KIP-320 diverging epoch,
  out-of-range, KIP-279 epoch end offsets, ListOffsets earliest/latest).
- ``LocalFollower`` implements ``fetcher.api.FollowerPartitions`` over real follower logs.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.clock import ManualClock
from common.config import broker_config
from common.errors import ErrorCode
from common.wire import TopicPartition
from fetcher.api import BrokerEndpoint
from fetcher.endpoint import (
    EARLIEST_TIMESTAMP,
    EpochAnswer,
    EpochRequest,
    FetchPartitionData,
    FetchRequest,
    FetchResponse,
    LeaderUnavailableError,
    OffsetAnswer,
)
from fetcher.state import EpochEndOffset
from storage.log import Log, LogConfig
from storage.record_batch import build_batch

TP = TopicPartition("t", 0)
_counter = itertools.count()


def open_log(root: Path, name: str, clock: ManualClock, tp: TopicPartition = TP) -> Log:
    d = root / name / f"{tp.topic}-{tp.partition}"
    d.parent.mkdir(parents=True, exist_ok=True)
    return Log.open(d, LogConfig.from_config(broker_config()), clock)


def batch(n: int, clock: ManualClock, size: int = 20) -> bytes:
    """``n`` distinct records in one batch (values are unique across the test run)."""
    return build_batch([(None, f"{next(_counter):0{size}d}".encode()) for _ in range(n)],
                       timestamp_ms=clock.now_ms())


def write(log: Log, epoch: int, batches: int, clock: ManualClock, records: int = 3) -> None:
    """Append ``batches`` batches as leader in ``epoch`` (the log's epoch cache learns it)."""
    for _ in range(batches):
        log.append_as_leader(batch(records, clock), epoch)


def log_bytes(log: Log, upto: int | None = None) -> bytes:
    """The raw batches of ``log`` from its start to ``upto`` (exclusive; default LEO)."""
    end = log.log_end_offset if upto is None else upto
    out = b""
    offset = log.log_start_offset
    while offset < end:
        data = log.read(offset, 1 << 20, max_offset=end)
        if not data.records:
            break
        out += data.records
        from storage.record_batch import iter_batches
        last = offset
        for _pos, header in iter_batches(data.records):
            last = header.last_offset + 1
        offset = last
    return out


@dataclass
class LeaderPartition:
    log: Log
    leader_epoch: int
    high_watermark: int = 0
    error: ErrorCode = ErrorCode.NONE  # forced per-partition error for fetches


class FakeLeader:
    """A leader broker in-process; ``hook`` runs while a request is 'in flight'."""

    def __init__(self, broker_id: int = 1, *, diverging_epoch: bool = True, epochs: bool = True) -> None:
        self._broker = BrokerEndpoint(broker_id, "127.0.0.1", 9000 + broker_id)
        self.partitions: dict[TopicPartition, LeaderPartition] = {}
        self.diverging_epoch = diverging_epoch  # answer KIP-320 diverging_epoch in Fetch
        self.epochs = epochs  # False: OffsetsForLeaderEpoch answers UNDEFINED (a leader without epoch info)
        self.down = False
        self.hook: Callable[[str], Awaitable[None]] | None = None
        self.fetches: list[FetchRequest] = []
        self.epoch_requests: list[Mapping[TopicPartition, EpochRequest]] = []
        self.closed = False
        self.response_max_bytes: int | None = None

    @property
    def broker(self) -> BrokerEndpoint:
        return self._broker

    def lead(self, tp: TopicPartition, log: Log, leader_epoch: int) -> LeaderPartition:
        p = LeaderPartition(log, leader_epoch, high_watermark=log.log_end_offset)
        self.partitions[tp] = p
        return p

    async def _in_flight(self, api: str) -> None:
        if self.down:
            raise LeaderUnavailableError(f"{api}: connection refused (fake)")
        if self.hook is not None:
            await self.hook(api)

    def _epoch_error(self, tp: TopicPartition, current_leader_epoch: int) -> ErrorCode:
        p = self.partitions.get(tp)
        if p is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch >= 0 and current_leader_epoch < p.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if current_leader_epoch > p.leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
        return ErrorCode.NONE

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        self.fetches.append(request)
        answers: dict[TopicPartition, FetchPartitionData] = {}
        budget = request.max_bytes
        for tp, part in request.partitions.items():
            answers[tp] = self._fetch_one(tp, part, budget)
            budget -= len(answers[tp].records)
        await self._in_flight("fetch")
        return FetchResponse(ErrorCode.NONE, answers)

    def _fetch_one(self, tp: TopicPartition, part: Any, budget: int) -> FetchPartitionData:
        error = self._epoch_error(tp, part.current_leader_epoch)
        p = self.partitions.get(tp)
        if error is not ErrorCode.NONE or p is None:
            return FetchPartitionData(error)
        if p.error is not ErrorCode.NONE:
            return FetchPartitionData(p.error)
        log = p.log
        common: dict[str, Any] = {"high_watermark": p.high_watermark, "log_start_offset": log.log_start_offset,
                                  "log_end_offset": log.log_end_offset}
        if self.diverging_epoch and part.last_fetched_epoch >= 0:
            epoch, end = log.end_offset_for_epoch(part.last_fetched_epoch)
            if epoch != part.last_fetched_epoch or end < part.fetch_offset:
                return FetchPartitionData(ErrorCode.NONE, diverging_epoch=EpochEndOffset(epoch, end), **common)
        if not log.log_start_offset <= part.fetch_offset <= log.log_end_offset:
            return FetchPartitionData(ErrorCode.OFFSET_OUT_OF_RANGE, **common)
        records = b""
        if budget > 0 and part.fetch_offset < log.log_end_offset:
            records = log.read(part.fetch_offset, min(part.partition_max_bytes, budget)).records
        return FetchPartitionData(ErrorCode.NONE, records=records, **common)

    async def offsets_for_leader_epoch(self, replica_id: int, requests: Mapping[TopicPartition, EpochRequest]
                                       ) -> dict[TopicPartition, EpochAnswer]:
        self.epoch_requests.append(dict(requests))
        out: dict[TopicPartition, EpochAnswer] = {}
        for tp, r in requests.items():
            error = self._epoch_error(tp, r.current_leader_epoch)
            if error is not ErrorCode.NONE:
                out[tp] = EpochAnswer(error, EpochEndOffset(-1, -1))
            elif not self.epochs:
                out[tp] = EpochAnswer(ErrorCode.NONE, EpochEndOffset(-1, -1))
            else:
                out[tp] = EpochAnswer(ErrorCode.NONE, EpochEndOffset(*self.partitions[tp].log.end_offset_for_epoch(
                    r.leader_epoch)))
        await self._in_flight("offsets_for_leader_epoch")
        return out

    async def list_offset(self, replica_id: int, tp: TopicPartition, current_leader_epoch: int,
                          timestamp: int) -> OffsetAnswer:
        error = self._epoch_error(tp, current_leader_epoch)
        await self._in_flight("list_offsets")
        if error is not ErrorCode.NONE:
            return OffsetAnswer(error, -1)
        log = self.partitions[tp].log
        return OffsetAnswer(ErrorCode.NONE, log.log_start_offset if timestamp == EARLIEST_TIMESTAMP
                            else log.log_end_offset)

    async def close(self) -> None:
        self.closed = True


@dataclass
class FollowerPartition:
    log: Log
    leader_epoch: int
    high_watermark: int = 0


@dataclass
class LocalFollower:
    """The broker side of a follower (``FollowerPartitions``), over real logs."""

    broker_id: int = 2
    broker_epoch: int = 7
    partitions: dict[TopicPartition, FollowerPartition] = field(default_factory=dict)
    truncations: list[tuple[TopicPartition, int, str]] = field(default_factory=list)
    appended_calls: int = 0
    # ("truncated", tp), ("truncations_done", None), ("appended", tp) in call order
    events: list[tuple[str, TopicPartition | None]] = field(default_factory=list)

    def follow(self, tp: TopicPartition, log: Log, leader_epoch: int, high_watermark: int = 0) -> None:
        self.partitions[tp] = FollowerPartition(log, leader_epoch, high_watermark)

    def follower_log(self, tp: TopicPartition, leader_epoch: int) -> Log | None:
        p = self.partitions.get(tp)
        return p.log if p is not None and p.leader_epoch == leader_epoch else None

    def follower_high_watermark(self, tp: TopicPartition) -> int | None:
        p = self.partitions.get(tp)
        return p.high_watermark if p is not None else None

    def on_follower_appended(self, tp: TopicPartition, leader_high_watermark: int,
                             leader_log_start_offset: int) -> None:
        self.appended_calls += 1
        self.events.append(("appended", tp))
        p = self.partitions[tp]
        p.high_watermark = max(p.high_watermark, min(p.log.log_end_offset, leader_high_watermark))
        if leader_log_start_offset > p.log.log_start_offset:
            p.log.maybe_increment_log_start_offset(min(leader_log_start_offset, p.high_watermark))

    def on_follower_truncated(self, tp: TopicPartition, offset: int, reason: str) -> None:
        p = self.partitions[tp]
        p.high_watermark = min(p.high_watermark, p.log.log_end_offset)
        self.truncations.append((tp, offset, reason))
        self.events.append(("truncated", tp))

    def truncations_done(self) -> None:
        self.events.append(("truncations_done", None))
