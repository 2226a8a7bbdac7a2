"""Pure controller rules: leader election, replica assignment, ISR changes, fencing, preferred leaders.

Nothing here does I/O or reads a clock; every function takes plain values and
returns plain values, so the rules are tested as tables (tests/controller/test_rules.py).

Election (Kafka's ``PartitionLeaderElectionAlgorithms.offlinePartitionLeaderElection``):
the first replica *in assignment order* that is alive and in the ISR; if none and
unclean election is enabled, the first live replica (the ISR then becomes just
that replica, as Kafka does); otherwise no leader (-1, the partition is offline).

Assignment (Kafka's ``AdminUtils.assignReplicasToBrokersRackUnaware``): the first
replica of partition p is broker ``(p + start_index) % n``; followers are spread
with a shift that grows by one every ``n`` partitions, so preferred leaders and
replicas both spread evenly.

Fencing / controlled shutdown: the broker leaves every ISR it is in, except that
an ISR never becomes empty (the last member stays, so a later clean election can
bring the partition back when that broker returns); partitions it led get a new
leader by the election rule above.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

NO_LEADER = -1


class ElectionReason(enum.Enum):
    """Why a leader was (re)elected; a label of the ``elections`` metric and the ``leader_elected`` event."""

    NEW_PARTITION = "new_partition"
    OFFLINE = "offline"  # the leader died or was fenced
    UNCLEAN = "unclean"
    CONTROLLED_SHUTDOWN = "controlled_shutdown"
    PREFERRED = "preferred"
    ISR_CHANGE = "isr_change"  # the leader asked for it (AlterPartition)
    REREGISTRATION = "reregistration"


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    """The leader/ISR part of a partition's state."""

    leader: int
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Election:
    leader: int
    isr: tuple[int, ...]
    unclean: bool = False

    @property
    def offline(self) -> bool:
        return self.leader == NO_LEADER


def elect_leader(replicas: Sequence[int], isr: Sequence[int], live: Collection[int], *,
                 unclean_enabled: bool = False) -> Election:
    """The first live ISR member in assignment order; else an unclean pick or offline.

    When the partition goes offline the ISR is kept as it was (Kafka keeps the
    last ISR so a clean election can happen when one of them returns).
    """
    in_isr = set(isr)
    for r in replicas:
        if r in in_isr and r in live:
            return Election(r, tuple(isr))
    if unclean_enabled:
        for r in replicas:
            if r in live:
                return Election(r, (r,), unclean=True)
    return Election(NO_LEADER, tuple(isr))


def remove_from_isr(replicas: Sequence[int], isr: Sequence[int], broker: int, live: Collection[int], *,
                    current_leader: int, unclean_enabled: bool = False) -> Election:
    """The broker leaves the ISR (never emptying it); a new leader is chosen if it led or no leader exists.

    ``live`` must already exclude ``broker``.
    """
    assert broker not in live, "the broker being removed must not count as live"
    new_isr = tuple(r for r in isr if r != broker) or tuple(isr)
    if current_leader != broker and current_leader != NO_LEADER and current_leader in live:
        return Election(current_leader, new_isr)
    return elect_leader(replicas, new_isr, live, unclean_enabled=unclean_enabled)


def assign_replicas(num_partitions: int, replication_factor: int, brokers: Sequence[int], *,
                    start_index: int, replica_shift: int, start_partition: int = 0) -> list[tuple[int, ...]]:
    """Kafka's rack-unaware assignment; ``brokers`` are the live broker ids (sorted by the caller).

    ``start_index`` and ``replica_shift`` are Kafka's random choices, injected so the
    result is deterministic for a given input.
    """
    n = len(brokers)
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    if replication_factor <= 0 or replication_factor > n:
        raise ValueError(f"replication factor {replication_factor} outside 1..{n} live brokers")
    start_index %= n
    shift = replica_shift % n if n > 1 else 0
    out: list[tuple[int, ...]] = []
    current = max(0, start_partition)
    for _ in range(num_partitions):
        if current > 0 and current % n == 0:
            shift += 1
        first = (current + start_index) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[_replica_index(first, shift, j, n)])
        out.append(tuple(replicas))
        current += 1
    return out


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    step = 1 + (shift + j) % (n - 1)
    return (first + step) % n


class IsrCheck(enum.Enum):
    """The outcome of validating an AlterPartition item (error names match common.errors.ErrorCode)."""

    OK = "NONE"
    STALE_BROKER_EPOCH = "STALE_BROKER_EPOCH"
    NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
    FENCED_LEADER_EPOCH = "FENCED_LEADER_EPOCH"
    INVALID_UPDATE_VERSION = "INVALID_UPDATE_VERSION"
    INELIGIBLE_REPLICA = "INELIGIBLE_REPLICA"
    INVALID_REQUEST = "INVALID_REQUEST"


@dataclass(frozen=True, slots=True)
class AlterIsrRequest:
    broker_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    new_isr_broker_epochs: Mapping[int, int]  # broker id -> the broker epoch the leader saw (-1 = unknown)


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What the ISR check needs to know about a partition."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int


def same_isr(a: Sequence[int], b: Sequence[int]) -> bool:
    """The same replicas, whatever their order."""
    return len(a) == len(b) and set(a) == set(b)


def check_alter_isr(req: AlterIsrRequest, part: PartitionView, *, eligible: Collection[int],
                    broker_epochs: Mapping[int, int]) -> IsrCheck:
    """Kafka's ``ReplicationControlManager.alterPartition`` checks, in Kafka's order.

    ``eligible`` are brokers that are registered, unfenced and not shutting down;
    ``broker_epochs`` their current epochs. Only *added* replicas must be eligible:
    the leader may always shrink the ISR.
    """
    if req.broker_id != part.leader:
        return IsrCheck.NOT_LEADER_OR_FOLLOWER
    if req.leader_epoch != part.leader_epoch:
        return IsrCheck.FENCED_LEADER_EPOCH
    if req.partition_epoch != part.partition_epoch and not same_isr(req.new_isr, part.isr):
        # A stale partition epoch asking for the ISR the partition already has is a resend of a change
        # that was applied and whose answer was lost: it is answered with the committed state, as Kafka's
        # ZooKeeper-mode controller does (LeaderAndIsr.equalsAllowStalePartitionEpoch). Refusing it would
        # leave the leader believing the change failed while the controller counts the new ISR.
        return IsrCheck.INVALID_UPDATE_VERSION
    if not req.new_isr or len(set(req.new_isr)) != len(req.new_isr):
        return IsrCheck.INVALID_REQUEST
    if req.leader_epoch >= 0 and part.leader not in req.new_isr:
        return IsrCheck.INVALID_REQUEST
    if any(r not in part.replicas for r in req.new_isr):
        return IsrCheck.INVALID_REQUEST
    current = set(part.isr)
    for r in req.new_isr:
        if r in current:
            continue
        if r not in eligible:
            return IsrCheck.INELIGIBLE_REPLICA
        seen = req.new_isr_broker_epochs.get(r, -1)
        if seen != -1 and seen != broker_epochs.get(r):
            return IsrCheck.INELIGIBLE_REPLICA
    return IsrCheck.OK


def preferred_imbalance(leaders: Iterable[tuple[int, int]]) -> dict[int, float]:
    """Per preferred broker: the fraction of the partitions it prefers that it does not lead.

    ``leaders`` are (preferred replica, current leader) pairs, one per partition.
    """
    total: dict[int, int] = {}
    misplaced: dict[int, int] = {}
    for preferred, leader in leaders:
        total[preferred] = total.get(preferred, 0) + 1
        if leader != preferred:
            misplaced[preferred] = misplaced.get(preferred, 0) + 1
    return {b: misplaced.get(b, 0) / n for b, n in total.items()}


def brokers_over_imbalance(imbalance: Mapping[int, float], threshold_percent: int) -> set[int]:
    """Kafka's ``checkAndTriggerAutoLeaderRebalance``: brokers whose ratio exceeds the threshold."""
    return {b for b, ratio in imbalance.items() if ratio * 100 > threshold_percent}


def preferred_election(replicas: Sequence[int], isr: Sequence[int], leader: int, live: Collection[int]) -> int | None:
    """The preferred replica if it should take over now (alive, in the ISR, not leading); else None."""
    if not replicas:
        return None
    preferred = replicas[0]
    if preferred == leader or preferred not in live or preferred not in isr:
        return None
    return preferred


def expired_brokers(last_heard_ms: Mapping[int, int], now_ms: int, session_timeout_ms: int) -> list[int]:
    """Brokers silent for longer than the session timeout, in id order."""
    return sorted(b for b, t in last_heard_ms.items() if now_ms - t > session_timeout_ms)
