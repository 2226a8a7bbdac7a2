"""Pure partition state: role, epochs, ISR, high watermark and the leader's view of its followers.

No I/O and no clock: every function takes the times and offsets it needs and
returns a new frozen value (Kafka's ``Partition`` without the log and locks).

Rules (DESIGN.md "Replication"; Kafka ``Partition.scala``):

- HW = min LEO over the *maximal* ISR (the committed ISR plus additions that
  were requested but not yet committed) and the leader's own LEO; the HW
  never moves back.
- A follower is *caught up* at a fetch when its fetch offset reaches the
  leader's LEO, or the LEO the leader had at the follower's previous fetch
  (Kafka's ``lastCaughtUpTimeMs`` rule).
- ISR expansion candidate: not in the maximal ISR, LEO >= HW and LEO >= the
  start offset of the current leader epoch.
- ISR shrink candidate: in the ISR (not the leader), LEO behind the leader and
  not caught up for ``replica.lag.time.max.ms``. Shrinks are applied only when
  the controller commits them, so until then the HW still waits for them.
- One ISR change in flight per partition (``pending``).
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
from typing import NamedTuple


class Role(enum.Enum):
    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"


class ReplicaState(NamedTuple):
    """The leader's view of one follower."""

    broker_id: int
    log_end_offset: int = -1
    log_start_offset: int = -1
    last_fetch_ms: int = -1
    last_fetch_leader_leo: int = -1
    last_caught_up_ms: int = -1
    broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class PendingIsrChange:
    """An AlterPartition sent and not yet answered."""

    new_isr: tuple[int, ...]
    is_expand: bool


class PartitionState(NamedTuple):
    """NamedTuples, not frozen dataclasses, for this value and ``ReplicaState``: a new one is made on every
    follower fetch and, with the leader alone in the ISR, on every produce, and a 12-field frozen dataclass
    costs ~1.7 us to build against ~0.5 for a tuple (several times that inside a loaded broker: see
    docs/benchmarks/broker.md, tenth session). Changed copies come from ``_replace``; the two hot ones below."""

    broker_id: int
    role: Role = Role.NONE
    leader: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1
    isr: tuple[int, ...] = ()
    replicas: tuple[int, ...] = ()
    high_watermark: int = 0
    leader_epoch_start_offset: int = -1
    pending: PendingIsrChange | None = None
    followers: tuple[ReplicaState, ...] = ()
    # (broker id, broker epoch) pairs the controller refused to add (INELIGIBLE_REPLICA: fenced or
    # shutting down). Not proposed again until that broker fetches with a new broker epoch, so a dead
    # replica's last fetch cannot keep re-entering the maximal ISR and pinning the HW (KIP-841).
    ineligible: frozenset[tuple[int, int]] = frozenset()

    @property
    def maximal_isr(self) -> frozenset[int]:
        """ISR plus pending additions (a pending shrink still counts its outgoing replica)."""
        if self.pending is None:
            return frozenset(self.isr)
        return frozenset(self.isr) | frozenset(self.pending.new_isr)

    # The two copies made on every follower fetch and produce, by position: ``_replace`` costs three times
    # as much. Tests compare them with ``_replace``.
    def with_followers(self, followers: tuple[ReplicaState, ...]) -> PartitionState:
        return _new_state(PartitionState, (*self[:_FOLLOWERS], followers, *self[_FOLLOWERS + 1:]))

    def with_high_watermark(self, high_watermark: int) -> PartitionState:
        return _new_state(PartitionState, (*self[:_HIGH_WATERMARK], high_watermark, *self[_HIGH_WATERMARK + 1:]))

    def follower(self, broker_id: int) -> ReplicaState | None:
        for r in self.followers:
            if r.broker_id == broker_id:
                return r
        return None


_new_state = tuple.__new__
_FOLLOWERS = PartitionState._fields.index("followers")
_HIGH_WATERMARK = PartitionState._fields.index("high_watermark")


def become_leader(state: PartitionState, *, leader_epoch: int, partition_epoch: int, isr: tuple[int, ...],
                  replicas: tuple[int, ...], leader_end_offset: int, high_watermark: int,
                  now_ms: int) -> PartitionState:
    """Kafka ``makeLeader``: fresh follower states (ISR members count as caught up now) on a new
    leader epoch; an ISR-only update (same leader epoch) keeps what the leader knows of its followers."""
    epoch_changed = leader_epoch != state.leader_epoch or state.role is not Role.LEADER
    known = {} if epoch_changed else {r.broker_id: r for r in state.followers}
    followers = tuple(
        known.get(b) or ReplicaState(broker_id=b, last_caught_up_ms=now_ms if b in isr else -1)
        for b in replicas if b != state.broker_id
    )
    start = leader_end_offset if epoch_changed else state.leader_epoch_start_offset
    return state._replace(role=Role.LEADER, leader=state.broker_id, leader_epoch=leader_epoch,
                          partition_epoch=partition_epoch, isr=isr, replicas=replicas,
                          high_watermark=min(high_watermark, leader_end_offset),
                          leader_epoch_start_offset=start, pending=None, followers=followers,
                          ineligible=state.ineligible if not epoch_changed else frozenset())


def become_follower(state: PartitionState, *, leader: int, leader_epoch: int, partition_epoch: int,
                    isr: tuple[int, ...], replicas: tuple[int, ...], log_end_offset: int) -> PartitionState:
    return state._replace(role=Role.FOLLOWER, leader=leader, leader_epoch=leader_epoch,
                          partition_epoch=partition_epoch, isr=isr, replicas=replicas,
                          high_watermark=min(state.high_watermark, log_end_offset),
                          leader_epoch_start_offset=-1, pending=None, followers=())


def update_follower(state: PartitionState, *, broker_id: int, fetch_offset: int, log_start_offset: int,
                    now_ms: int, leader_end_offset: int, broker_epoch: int) -> PartitionState:
    """Record a follower fetch (Kafka ``Replica.updateFetchState``)."""
    old = state.follower(broker_id)
    assert old is not None, "caller checks the follower is a replica"
    caught_up = old.last_caught_up_ms
    if fetch_offset >= leader_end_offset:
        caught_up = max(caught_up, now_ms)
    elif fetch_offset >= old.last_fetch_leader_leo and old.last_fetch_ms >= 0:
        caught_up = max(caught_up, old.last_fetch_ms)
    # A positional constructor, not _replace: this runs on every follower fetch.
    new = ReplicaState(broker_id, fetch_offset, log_start_offset, now_ms, leader_end_offset, caught_up, broker_epoch)
    followers = tuple(new if r.broker_id == broker_id else r for r in state.followers)
    return state.with_followers(followers)


def compute_high_watermark(state: PartitionState, leader_end_offset: int) -> int:
    """min LEO over the maximal ISR (leader included); never below the current HW."""
    if not state.followers or (state.pending is None and len(state.isr) == 1):
        return max(state.high_watermark, leader_end_offset)  # the leader alone is the ISR
    candidate = leader_end_offset
    isr, pending = state.isr, state.pending
    for r in state.followers:
        if r.broker_id in isr or (pending is not None and r.broker_id in pending.new_isr):
            leo = r.log_end_offset if r.log_end_offset > 0 else 0
            if leo < candidate:
                candidate = leo
    return max(state.high_watermark, candidate)


def advance_high_watermark(state: PartitionState, leader_end_offset: int) -> PartitionState:
    hw = compute_high_watermark(state, leader_end_offset)
    return state if hw == state.high_watermark else state.with_high_watermark(hw)


def follower_high_watermark(*, log_start_offset: int, log_end_offset: int, leader_high_watermark: int) -> int:
    """Follower HW = the leader's HW within [log start, local LEO], as Kafka's follower sets it from every fetch
    answer (``UnifiedLog.maybeUpdateHighWatermark``): it follows a new leader whose HW is still below the old
    leader's down (a follower HW that never moved back showed offsets the current leader had not committed)."""
    return max(log_start_offset, min(log_end_offset, leader_high_watermark))


def expansion_candidates(state: PartitionState, alive: Collection[int] | None = None) -> tuple[int, ...]:
    """Followers that may join the ISR now (Kafka ``isFollowerInSync`` + epoch start check), of the brokers
    ``alive`` when given (the metadata's live brokers: Kafka's ``isReplicaIsrEligible``, KIP-841; the state
    kept for a broker that crashed can look caught up on a partition nobody writes to)."""
    if state.role is not Role.LEADER:
        return ()
    members = state.maximal_isr
    return tuple(
        r.broker_id for r in state.followers
        if r.broker_id not in members
        and (alive is None or r.broker_id in alive)
        and (r.broker_id, r.broker_epoch) not in state.ineligible
        and r.log_end_offset >= state.high_watermark
        and r.log_end_offset >= state.leader_epoch_start_offset
    )


def shrink_candidates(state: PartitionState, *, now_ms: int, leader_end_offset: int,
                      replica_lag_time_max_ms: int) -> tuple[int, ...]:
    """ISR followers that have not caught up for the lag time (Kafka ``getOutOfSyncReplicas``)."""
    if state.role is not Role.LEADER:
        return ()
    out = []
    for r in state.followers:
        if r.broker_id not in state.isr:
            continue
        if r.log_end_offset != leader_end_offset and now_ms - r.last_caught_up_ms > replica_lag_time_max_ms:
            out.append(r.broker_id)
    return tuple(out)


def next_isr_change(state: PartitionState, *, now_ms: int, leader_end_offset: int, replica_lag_time_max_ms: int,
                    alive: Collection[int] | None = None) -> PendingIsrChange | None:
    """The AlterPartition to send now, if any (none while one is in flight). Expansion first, one follower at a
    time (Kafka's ``maybeExpandIsr``): a refusal then concerns that follower alone, never one caught up beside
    an ineligible one."""
    if state.role is not Role.LEADER or state.pending is not None:
        return None
    grow = expansion_candidates(state, alive)
    if grow:
        return PendingIsrChange(new_isr=(*state.isr, grow[0]), is_expand=True)
    shrink = shrink_candidates(state, now_ms=now_ms, leader_end_offset=leader_end_offset,
                               replica_lag_time_max_ms=replica_lag_time_max_ms)
    if shrink:
        return PendingIsrChange(new_isr=tuple(b for b in state.isr if b not in shrink), is_expand=False)
    return None


def isr_change_refused(state: PartitionState, *, ineligible: bool) -> PartitionState:
    """The controller refused the pending change; with INELIGIBLE_REPLICA the replicas it would have
    added (at the broker epochs they fetched with) are not proposed again."""
    if state.pending is None:
        return state
    refused: frozenset[tuple[int, int]] = frozenset()
    if ineligible:
        added = set(state.pending.new_isr) - set(state.isr)
        refused = frozenset((r.broker_id, r.broker_epoch) for r in state.followers if r.broker_id in added)
    return state._replace(pending=None, ineligible=state.ineligible | refused)


def isr_change_committed(state: PartitionState, *, leader_epoch: int, isr: tuple[int, ...],
                         partition_epoch: int) -> PartitionState:
    """The controller accepted an AlterPartition: apply its answer if it is newer."""
    if leader_epoch != state.leader_epoch or partition_epoch < state.partition_epoch:
        return state._replace(pending=None)
    return state._replace(isr=isr, partition_epoch=partition_epoch, pending=None)
