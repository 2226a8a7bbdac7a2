"""Pure fetch state of one followed partition, and the decisions a fetcher takes.

No I/O, no asyncio, no clock: callers pass ``now_ms`` and what they read from
the local log. Kafka's ``PartitionFetchState`` is the model: an immutable value
replaced on every change.

States (``FetchStatus``)::

    TRUNCATING --(truncation complete)--> FETCHING
    FETCHING   --(diverging epoch in a Fetch answer)--> TRUNCATING
    either     --(error: park until now + replica.fetch.backoff.ms)--> same status, parked
    either     --(FENCED_LEADER_EPOCH: park until re-added at a new epoch)--> same status, parked

A newly added partition starts TRUNCATING: before its first fetch the follower
asks the leader (OffsetsForLeaderEpoch) where its latest epoch ends and cuts a
divergent tail (KIP-101/KIP-279). Truncation to the high watermark is used only
when the leader has no epoch information for the follower's epoch.

``decide_truncation`` is KIP-279's ``getOffsetTruncationState``;
``decide_out_of_range`` is Kafka's ``fetchOffsetAndTruncate``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from common.wire import TopicPartition

UNDEFINED_EPOCH = -1
# parked_until_ms of a partition that waits to be added again (Kafka's failed partitions): no time reaches it
PARKED_UNTIL_READDED = 2**62
UNDEFINED_OFFSET = -1


class FetchStatus(enum.Enum):
    TRUNCATING = "truncating"
    FETCHING = "fetching"


@dataclass(frozen=True, slots=True)
class PartitionFetchState:
    """Where a follower fetches one partition from, and whether it may fetch now."""

    fetch_offset: int
    current_leader_epoch: int
    status: FetchStatus = FetchStatus.TRUNCATING
    last_fetched_epoch: int | None = None  # latest epoch in the local log (KIP-320)
    lag: int | None = None  # leader HW - fetch offset, as of the last answer
    parked_until_ms: int | None = None  # not fetched nor truncated before this

    @classmethod
    def initial(cls, fetch_offset: int, leader_epoch: int, last_fetched_epoch: int | None) -> PartitionFetchState:
        return cls(fetch_offset=fetch_offset, current_leader_epoch=leader_epoch,
                   last_fetched_epoch=last_fetched_epoch)

    def is_parked(self, now_ms: int) -> bool:
        return self.parked_until_ms is not None and now_ms < self.parked_until_ms

    def is_fetchable(self, now_ms: int) -> bool:
        return self.status is FetchStatus.FETCHING and not self.is_parked(now_ms)

    def is_truncating(self, now_ms: int) -> bool:
        return self.status is FetchStatus.TRUNCATING and not self.is_parked(now_ms)

    def parked(self, until_ms: int) -> PartitionFetchState:
        return replace(self, parked_until_ms=until_ms)

    def fetched(self, fetch_offset: int, last_fetched_epoch: int | None, lag: int) -> PartitionFetchState:
        """After a successful append (or an empty answer). Positional: this runs once per fetched partition."""
        return PartitionFetchState(fetch_offset, self.current_leader_epoch, self.status, last_fetched_epoch, lag, None)

    def truncated(self, fetch_offset: int, last_fetched_epoch: int | None, completed: bool) -> PartitionFetchState:
        status = FetchStatus.FETCHING if completed else FetchStatus.TRUNCATING
        return replace(self, fetch_offset=fetch_offset, last_fetched_epoch=last_fetched_epoch,
                       status=status, parked_until_ms=None)

    def must_truncate(self) -> PartitionFetchState:
        return replace(self, status=FetchStatus.TRUNCATING, parked_until_ms=None)


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """The leader's answer for one epoch: the largest epoch <= the asked one and where it ends.

    ``(-1, -1)`` means the leader knows no such epoch (UNDEFINED).
    """

    leader_epoch: int
    end_offset: int

    @property
    def undefined(self) -> bool:
        return self.end_offset == UNDEFINED_OFFSET


@dataclass(frozen=True, slots=True)
class TruncationDecision:
    offset: int  # truncate the local log to this offset (no-op when >= LEO)
    completed: bool  # False: ask the leader again (the follower lacked the leader's epoch)
    reason: str
    next_epoch: int | None = None  # when not completed: the epoch to ask about next (strictly smaller)


def decide_truncation(leader: EpochEndOffset, follower_for_leader_epoch: EpochEndOffset,
                      log_end_offset: int, high_watermark: int | None) -> TruncationDecision:
    """KIP-279: where to cut the local log given the leader's epoch end offset.

    ``follower_for_leader_epoch`` is the local log's ``end_offset_for_epoch(leader.leader_epoch)``
    (ignored when the leader's answer is undefined). ``high_watermark`` is the local HW if known.
    """
    if leader.undefined:
        # The leader has no epoch <= ours: the only fallback left is the HW (pre-KIP-101 rule).
        # With no known HW we keep the log; an out-of-range answer resolves the rest.
        target = log_end_offset if high_watermark is None else min(high_watermark, log_end_offset)
        return TruncationDecision(target, True, "leader_epoch_undefined_high_watermark")
    if leader.leader_epoch == UNDEFINED_EPOCH:
        # An end offset without an epoch: the leader's history starts after everything we know
        # (Kafka's UNDEFINED_EPOCH case); keep only what lies below that offset.
        return TruncationDecision(min(leader.end_offset, log_end_offset), True, "leader_epoch_unknown_end_offset")
    if follower_for_leader_epoch.undefined:
        # The follower has no epoch <= the leader's: everything it has may diverge past the leader's end.
        return TruncationDecision(min(leader.end_offset, log_end_offset), True, "follower_lacks_epoch")
    if follower_for_leader_epoch.leader_epoch != leader.leader_epoch:
        # The follower never had the leader's epoch: cut to where its own earlier epoch ends
        # and ask again with that (now latest) epoch (KIP-279 fast double failover).
        # Asking next about the follower's own epoch (< the leader's answer <= the asked epoch)
        # makes every round ask a strictly smaller epoch, so the loop ends.
        return TruncationDecision(min(follower_for_leader_epoch.end_offset, log_end_offset), False,
                                  "follower_lacks_leader_epoch", follower_for_leader_epoch.leader_epoch)
    target = min(leader.end_offset, follower_for_leader_epoch.end_offset, log_end_offset)
    return TruncationDecision(target, True, "leader_epoch_end_offset")


class OutOfRangeAction(enum.Enum):
    TRUNCATE_TO = "truncate_to"  # leader end < local LEO: only legal after an unclean election
    TRUNCATE_FULLY = "truncate_fully"  # local LEO < leader start: the leader deleted what we lack
    RETRY = "retry"  # neither (the leader moved meanwhile): fetch again from the local LEO


@dataclass(frozen=True, slots=True)
class OutOfRangeDecision:
    action: OutOfRangeAction
    offset: int


def decide_out_of_range_by_end(log_end_offset: int, leader_end_offset: int) -> OutOfRangeDecision | None:
    """First half of Kafka's fetchOffsetAndTruncate: a leader shorter than us. None -> ask its start."""
    if 0 <= leader_end_offset < log_end_offset:
        return OutOfRangeDecision(OutOfRangeAction.TRUNCATE_TO, leader_end_offset)
    return None


def decide_out_of_range_by_start(log_end_offset: int, leader_start_offset: int) -> OutOfRangeDecision:
    """Second half: a leader whose log starts after our end (we were away while it deleted segments)."""
    if leader_start_offset > log_end_offset:
        return OutOfRangeDecision(OutOfRangeAction.TRUNCATE_FULLY, leader_start_offset)
    return OutOfRangeDecision(OutOfRangeAction.RETRY, log_end_offset)


def decide_out_of_range(log_end_offset: int, leader_end_offset: int, leader_start_offset: int) -> OutOfRangeDecision:
    """Both halves at once (seed 000): what to do after OFFSET_OUT_OF_RANGE."""
    by_end = decide_out_of_range_by_end(log_end_offset, leader_end_offset)
    return by_end if by_end is not None else decide_out_of_range_by_start(log_end_offset, leader_start_offset)


def fetch_lag(leader_high_watermark: int, fetch_offset: int) -> int:
    return max(0, leader_high_watermark - fetch_offset)


class PartitionStates:
    """The partitions of one fetcher in round-robin order (Kafka's ``PartitionStates``).

    Partitions answered by the leader move to the end, so a partition early in the
    list cannot starve the others of a response's byte budget.
    """

    def __init__(self) -> None:
        self._states: dict[TopicPartition, PartitionFetchState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, tp: object) -> bool:
        return tp in self._states

    def get(self, tp: TopicPartition) -> PartitionFetchState | None:
        return self._states.get(tp)

    def items(self) -> list[tuple[TopicPartition, PartitionFetchState]]:
        return list(self._states.items())

    def tps(self) -> list[TopicPartition]:
        return list(self._states)

    def set(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        """Replace in place (keeps the position); a new partition goes to the end."""
        self._states[tp] = state

    def update_and_move_to_end(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        self._states.pop(tp, None)
        self._states[tp] = state

    def remove(self, tp: TopicPartition) -> PartitionFetchState | None:
        return self._states.pop(tp, None)

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        """The earliest future time a parked partition becomes usable again, if any is parked."""
        times = [s.parked_until_ms for s in self._states.values()
                 if s.parked_until_ms is not None and s.parked_until_ms > now_ms]
        return min(times) if times else None
