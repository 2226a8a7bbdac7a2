"""Consumer position bookkeeping (pure: no I/O).

For every assigned partition the consumer keeps a position (the next offset
to return) or ``None`` while it must be reset: by the strategy a
``seek_to_beginning``/``seek_to_end`` asked for, else by ``auto.offset.reset``.
``accept`` turns decoded records of one fetch into the ones to return and
moves the position past them; it drops records below the position (a batch
may start before it) and a whole response if the position moved while the
fetch was in flight (seek, or a concurrent poll). So a record is returned at
most once per position history, which makes "never twice in one session"
hold unless the user seeks backwards on purpose.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from common.wire import TopicPartition


class OffsetReset(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"


class NotAssignedError(KeyError, ValueError):
    """An operation on a partition the consumer is not assigned (Kafka's IllegalStateException "No current
    assignment for partition"). A KeyError for callers that caught the old error, a ValueError as bad input."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "No current assignment for partition"


class ConsumerRecord(NamedTuple):
    """One record as ``poll`` returns it. A NamedTuple, not a frozen dataclass: one is built per record
    on the consume path, and a frozen dataclass's ``__init__`` costs several times more."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionPosition:
    offset: int | None  # None: needs a reset
    leader_epoch: int = -1  # epoch of the last record returned (-1 unknown)
    high_watermark: int = -1
    reset: OffsetReset | None = None  # with no offset: the reset asked for (seek_to_*), else auto.offset.reset


class Positions:
    def __init__(self) -> None:
        self._state: dict[TopicPartition, PartitionPosition] = {}  # in the order fetches list them
        self._assigned: list[TopicPartition] = []  # in the order assigned
        self.paused: set[TopicPartition] = set()  # not fetched, and their records not handed out (Kafka's pause)

    def assign(self, tps: Iterable[TopicPartition]) -> None:
        new = list(dict.fromkeys(tps))
        self._state = {tp: self._state.get(tp, PartitionPosition(None)) for tp in new}
        self._assigned = new
        self.paused &= set(new)  # a partition that stays assigned stays paused, as in Kafka

    def assigned(self) -> list[TopicPartition]:
        return list(self._assigned)

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self._state

    def get(self, tp: TopicPartition) -> PartitionPosition:
        state = self._state.get(tp)
        if state is None:
            raise NotAssignedError(f"No current assignment for partition {tp} (assign it first)")
        return state

    def seek(self, tp: TopicPartition, offset: int | None) -> None:
        self.get(tp)
        if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool)):
            raise TypeError(f"offset must be an int, got {type(offset).__name__} {offset!r}")
        # negative: Kafka's seek refuses it too; beyond 2**63 - 1 no fetch request could carry it
        if offset is not None and not 0 <= offset <= 2**63 - 1:
            raise ValueError(f"offset must be >= 0 and < 2**63, got {offset}")
        self._state[tp] = PartitionPosition(offset)

    def request_reset(self, tp: TopicPartition, strategy: OffsetReset) -> None:
        """Kafka's ``requestOffsetReset`` (seekToBeginning/seekToEnd): the position is dropped at once, so no
        fetch goes on from the old one, and the next lookup for ``tp`` uses ``strategy``."""
        self.get(tp)
        self._state[tp] = PartitionPosition(None, reset=strategy)

    def reset_strategy(self, tp: TopicPartition, default: OffsetReset) -> OffsetReset:
        """How to find ``tp``'s position: the reset asked for, or ``default`` (auto.offset.reset)."""
        return self.get(tp).reset or default

    def move_to_end(self, tp: TopicPartition) -> None:
        """``tp`` goes last in the order fetches list partitions (Kafka's ``movePartitionToEnd`` once a
        partition's records were handed out): a broker fills a fetch in the order it lists them, so without
        it a partition with a backlog could starve the ones listed after it."""
        s = self._state.pop(tp, None)
        if s is not None:
            self._state[tp] = s

    def needs_reset(self) -> list[TopicPartition]:
        return [tp for tp, s in self._state.items() if s.offset is None]

    def fetchable(self) -> list[TopicPartition]:
        return [tp for tp, s in self._state.items() if s.offset is not None and tp not in self.paused]

    def set_high_watermark(self, tp: TopicPartition, hw: int) -> None:
        s = self._state.get(tp)
        if s is not None:
            self._state[tp] = PartitionPosition(s.offset, s.leader_epoch, hw, s.reset)

    def accept(self, tp: TopicPartition, fetch_offset: int,
               records: list[tuple[int, ConsumerRecord]]) -> list[ConsumerRecord]:
        """``records`` are (leader_epoch, record) in log order from a fetch at ``fetch_offset``."""
        s = self._state.get(tp)
        if s is None or s.offset != fetch_offset:
            return []  # unassigned or moved while the fetch was in flight: discard
        out: list[ConsumerRecord] = []
        position = s.offset
        epoch = s.leader_epoch
        for leader_epoch, rec in records:
            if rec.offset < position:
                continue
            out.append(rec)
            position = rec.offset + 1
            epoch = leader_epoch
        self._state[tp] = PartitionPosition(position, epoch, s.high_watermark)
        return out

    def validated(self, tp: TopicPartition, fetch_offset: int, offset: int, leader_epoch: int) -> bool:
        """The leader said where the epoch of the last record returned ends (KIP-320): the position moves to
        ``offset`` (the first offset known to diverge, when it is below the position) and takes
        ``leader_epoch``, the leader's own epoch there. False if the position moved meanwhile."""
        s = self._state.get(tp)
        if s is None or s.offset != fetch_offset:
            return False
        self._state[tp] = PartitionPosition(offset, leader_epoch, s.high_watermark)
        return True

    def advance_to(self, tp: TopicPartition, fetch_offset: int, next_offset: int) -> None:
        """A batch with no visible records (e.g. all below position) still moves past its end."""
        s = self._state.get(tp)
        if s is not None and s.offset == fetch_offset and next_offset > fetch_offset:
            self._state[tp] = PartitionPosition(next_offset, s.leader_epoch, s.high_watermark)
