"""Controller operations as pure functions: (image, request, liveness) -> records + answer.

Each function reads the current ``MetadataImage`` and returns a ``Plan``: the
records to commit (one journal frame) and what to answer. The shell
(controller/controller.py) commits the records, applies them to the image, then
answers and propagates. Nothing here does I/O or reads the clock.

Epoch rules (DESIGN.md, KRaft's ``PartitionChangeBuilder``): every leader change
bumps leader_epoch; every change of a partition (leader or ISR) bumps
partition_epoch. An ISR change without a leader change keeps the leader epoch,
so a leader's in-flight acks=all produces are not failed by a follower being
fenced. Brokers accept a LeaderAndIsr with the same leader epoch and a newer
partition epoch as an ISR update (broker/replica_manager.py ``_is_newer``).
ISR changes the leader asked for (AlterPartition) are not sent back to it as
LeaderAndIsr (it learns them from the answer); every broker gets UpdateMetadata.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.config import ConfigError, validate_topic_configs
from common.errors import ErrorCode
from common.wire import TopicPartition, topic_name_error
from controller import rules
from controller.rules import ElectionReason
from controller.state import (
    NO_LEADER,
    BrokerFencingRecord,
    MetadataImage,
    PartitionRecord,
    PartitionState,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)


@dataclass(frozen=True, slots=True)
class LeaderChange:
    """One partition change, for logs and metrics."""

    tp: TopicPartition
    old: PartitionState | None
    new: PartitionState
    reason: ElectionReason
    requested_by_leader: bool = False  # AlterPartition: the leader knows already

    @property
    def leader_changed(self) -> bool:
        return self.old is None or self.old.leader != self.new.leader

    @property
    def isr_changed(self) -> bool:
        return self.old is None or self.old.isr != self.new.isr


@dataclass(slots=True)
class Plan:
    records: list[Record] = field(default_factory=list)
    changes: list[LeaderChange] = field(default_factory=list)

    def change(self, tp: TopicPartition, old: PartitionState | None, new: PartitionState,
               reason: ElectionReason, *, requested_by_leader: bool = False) -> None:
        self.records.append(PartitionRecord.of(tp, new))
        self.changes.append(LeaderChange(tp, old, new, reason, requested_by_leader))


def unclean_enabled(image: MetadataImage, topic: str, default: bool) -> bool:
    value = image.topics.get(topic, {}).get("unclean.leader.election.enable", default)
    return bool(value)


def _bumped(st: PartitionState, leader: int, isr: tuple[int, ...], *, new_term: bool = False) -> PartitionState:
    """The next state: partition epoch always +1, leader epoch +1 when the leader changes (or ``new_term``:
    the same broker leads as a new incarnation)."""
    leader_epoch = st.leader_epoch + 1 if leader != st.leader or new_term else st.leader_epoch
    return PartitionState(st.replicas, isr, leader, leader_epoch, st.partition_epoch + 1)


def _reason(st: PartitionState, election: rules.Election, cause: ElectionReason) -> ElectionReason:
    """The cause of a change (an ISR-only change keeps its cause: fencing, re-registration, ...)."""
    return ElectionReason.UNCLEAN if election.unclean else cause


def remove_broker(image: MetadataImage, plan: Plan, broker: int, live: Collection[int], *,
                  reason: ElectionReason, unclean_default: bool) -> None:
    """``broker`` leaves every ISR (never emptying one); new leaders where it led, none (offline, the ISR
    kept) where no other replica may lead."""
    eligible = set(live) - {broker}
    for tp, st in image.partitions_of_broker(broker):
        if broker not in st.isr and st.leader != broker:
            continue
        election = rules.remove_from_isr(st.replicas, st.isr, broker, eligible, current_leader=st.leader,
                                         unclean_enabled=unclean_enabled(image, tp.topic, unclean_default))
        if election.leader == st.leader and election.isr == st.isr:
            continue
        plan.change(tp, st, _bumped(st, election.leader, election.isr), _reason(st, election, reason))


def elect_offline(image: MetadataImage, plan: Plan, live: Collection[int], *, unclean_default: bool,
                  only_broker: int | None = None) -> None:
    """Partitions without a leader get one if a candidate is now live."""
    for tp, st in sorted(image.partitions.items()):
        if st.leader != NO_LEADER or (only_broker is not None and only_broker not in st.replicas):
            continue
        election = rules.elect_leader(st.replicas, st.isr, live,
                                      unclean_enabled=unclean_enabled(image, tp.topic, unclean_default))
        if election.offline:
            continue
        reason = ElectionReason.UNCLEAN if election.unclean else ElectionReason.OFFLINE
        plan.change(tp, st, _bumped(st, election.leader, election.isr), reason)


def register_broker(image: MetadataImage, node_id: int, host: str, port: int, incarnation_id: str,
                    live: Collection[int], *, unclean_default: bool) -> tuple[Plan, int]:
    """A new incarnation: a new broker epoch, out of every ISR (never emptying one), new leaders where it
    led; partitions left offline may now be led by it (it is live again)."""
    epoch = image.last_broker_epoch + 1
    plan = Plan([RegisterBrokerRecord(node_id, host, port, incarnation_id, epoch)])
    others = set(live) - {node_id}
    now_live = others | {node_id}
    for tp, st in image.partitions_of_broker(node_id):
        new_isr = tuple(r for r in st.isr if r != node_id) or st.isr
        if st.leader not in (node_id, NO_LEADER) and st.leader in others:
            election = rules.Election(st.leader, new_isr)
        else:
            election = rules.elect_leader(st.replicas, new_isr, now_live,
                                          unclean_enabled=unclean_enabled(image, tp.topic, unclean_default))
        if election.leader == st.leader and election.isr == st.isr and st.leader != node_id:
            continue
        # A partition the old incarnation led gets a new leader epoch even when the new incarnation keeps
        # leading it (the sole ISR member): its followers then learn the leader's new address with the
        # LeaderAndIsr, and nothing from the old incarnation's term is taken for the new one's. Kafka gets
        # the same bump from fencing the old incarnation and unfencing the new one.
        default = ElectionReason.OFFLINE if st.leader == NO_LEADER else ElectionReason.REREGISTRATION
        plan.change(tp, st, _bumped(st, election.leader, election.isr, new_term=st.leader == node_id),
                    _reason(st, election, default))
    return plan, epoch


PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE


def allocate_producer_ids(image: MetadataImage, broker_id: int, broker_epoch: int) -> tuple[Plan, int]:
    """The next block of producer ids for a broker (Kafka's ProducerIdControlManager.generateNextProducerId):
    one record moves ``next_producer_id`` past it. -> (plan, first id of the block). The caller has checked
    the broker epoch."""
    start = image.next_producer_id
    return Plan([ProducerIdsRecord(broker_id, broker_epoch, start + PRODUCER_ID_BLOCK_SIZE)]), start


def fence_broker(image: MetadataImage, node_id: int, live: Collection[int], *, unclean_default: bool) -> Plan:
    reg = image.brokers[node_id]
    plan = Plan([BrokerFencingRecord(node_id, reg.broker_epoch, True)])
    remove_broker(image, plan, node_id, live, reason=ElectionReason.OFFLINE, unclean_default=unclean_default)
    return plan


def unfence_broker(image: MetadataImage, node_id: int, live: Collection[int], *, unclean_default: bool) -> Plan:
    """A fenced broker heartbeats again with its current epoch (KRaft unfences it); it leads offline partitions."""
    reg = image.brokers[node_id]
    plan = Plan([BrokerFencingRecord(node_id, reg.broker_epoch, False)])
    elect_offline(image, plan, set(live) | {node_id}, unclean_default=unclean_default, only_broker=node_id)
    return plan


def controlled_shutdown(image: MetadataImage, node_id: int, live: Collection[int], *,
                        unclean_default: bool) -> tuple[Plan, list[TopicPartition]]:
    """Move leadership off ``node_id`` and take it out of ISRs; what it must keep leading is returned.

    Where no other replica may lead (``node_id`` is the last live ISR member) the partition goes offline
    (leader -1, the ISR kept, so ``node_id`` leads it again when it is back), as KRaft's
    ``handleBrokerShutdown`` does, so nothing is left and the broker goes at once. The ZooKeeper-era
    controller left such leaders in place and the broker retried until ``controlled.shutdown.max.retries``
    ran out: the same outcome later, and a whole-cluster stop (``cluster down``) took the brokers'
    ``controlled.shutdown.max.wait.ms`` (30 s) every time."""
    plan = Plan()
    remove_broker(image, plan, node_id, live, reason=ElectionReason.CONTROLLED_SHUTDOWN,
                  unclean_default=unclean_default)
    planned = {c.tp: c.new for c in plan.changes}
    remaining = [tp for tp, st in image.partitions_of_broker(node_id) if planned.get(tp, st).leader == node_id]
    return plan, remaining


def preferred_elections(image: MetadataImage, live: Collection[int], threshold_percent: int) -> Plan:
    """Kafka's auto leader rebalance: for brokers over the imbalance threshold, move leadership back."""
    plan = Plan()
    imbalance = rules.preferred_imbalance((st.preferred, st.leader) for st in image.partitions.values())
    over = rules.brokers_over_imbalance(imbalance, threshold_percent)
    for tp, st in sorted(image.partitions.items()):
        if st.preferred not in over:
            continue
        leader = rules.preferred_election(st.replicas, st.isr, st.leader, live)
        if leader is not None:
            plan.change(tp, st, _bumped(st, leader, st.isr), ElectionReason.PREFERRED)
    return plan


@dataclass(frozen=True, slots=True)
class TopicResult:
    name: str
    error: ErrorCode
    message: str = ""


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: Any
    num_partitions: Any
    replication_factor: Any
    configs: Any


def create_topics(image: MetadataImage, topics: Sequence[NewTopic], live: Sequence[int], *,
                  default_partitions: int, default_rf: int, start_index: int,
                  replica_shift: int) -> tuple[Plan, list[TopicResult]]:
    plan = Plan()
    results: list[TopicResult] = []
    seen: set[str] = set()
    brokers = sorted(live)
    # Kafka's topicsWithCollisionChars: '.' and '_' collide in metric names, so a name that equals an existing
    # one with either read as the other is refused (one pass over the names per request, not per topic)
    colliding = {_collision_key(n): n for n in image.topics if "." in n or "_" in n}
    for t in topics:
        result = _check_topic(image, t, seen, brokers, default_partitions, default_rf)
        if result is None and isinstance(t.name, str):
            other = colliding.get(_collision_key(t.name))
            if other is not None:
                result = TopicResult(t.name, ErrorCode.INVALID_TOPIC_EXCEPTION,
                                     f"topic {t.name!r} collides with existing topic {other!r} ('.' and '_' "
                                     "are the same in metric names)")
        if result is not None:
            results.append(result)
            continue
        try:
            configs = validate_topic_configs(t.configs or {})
        except ConfigError as exc:
            results.append(TopicResult(t.name, ErrorCode.INVALID_CONFIG, str(exc)))
            continue
        # only what was asked for, as Kafka keeps a topic's overrides: the brokers' min.insync.replicas and the
        # controller's unclean.leader.election.enable apply to the rest, also when changed later (copied in
        # here, the brokers' setting never took effect)
        n = t.num_partitions if t.num_partitions not in (None, -1) else default_partitions
        rf = t.replication_factor if t.replication_factor not in (None, -1) else default_rf
        seen.add(t.name)
        if "." in t.name or "_" in t.name:
            colliding[_collision_key(t.name)] = t.name
        plan.records.append(TopicRecord(t.name, configs))
        assignment = rules.assign_replicas(n, rf, brokers, start_index=start_index, replica_shift=replica_shift)
        first_epoch = image.leader_epoch_floors.get(t.name, 0)  # above a deleted namesake's epochs
        for p, replicas in enumerate(assignment):
            st = PartitionState(replicas, replicas, replicas[0], first_epoch, 0)
            plan.change(TopicPartition(t.name, p), None, st, ElectionReason.NEW_PARTITION)
        results.append(TopicResult(t.name, ErrorCode.NONE))
    return plan, results


def _collision_key(name: str) -> str:
    return name.replace(".", "_")


def _check_topic(image: MetadataImage, t: NewTopic, seen: set[str], brokers: Sequence[int],
                 default_partitions: int, default_rf: int) -> TopicResult | None:
    name = t.name if isinstance(t.name, str) else str(t.name)
    problem = topic_name_error(t.name)
    if problem is not None:
        return TopicResult(name, ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
    if t.name in image.topics or t.name in seen:
        return TopicResult(name, ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
    if t.name in image.deleting:
        # Kafka: "marked for deletion"; a new topic must not reuse replicas a broker has not deleted yet
        waiting = sorted(image.deleting[t.name])
        return TopicResult(name, ErrorCode.TOPIC_ALREADY_EXISTS,
                           f"topic {name!r} is still being deleted (waiting for brokers {waiting})")
    n = t.num_partitions if t.num_partitions not in (None, -1) else default_partitions
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 10_000:
        return TopicResult(name, ErrorCode.INVALID_PARTITIONS, f"num_partitions must be 1..10000, got {n!r}")
    rf = t.replication_factor if t.replication_factor not in (None, -1) else default_rf
    if not isinstance(rf, int) or isinstance(rf, bool) or rf < 1:
        return TopicResult(name, ErrorCode.INVALID_REPLICATION_FACTOR,
                           f"replication_factor must be a positive integer, got {rf!r}")
    if rf > len(brokers):
        return TopicResult(name, ErrorCode.INVALID_REPLICATION_FACTOR,
                           f"replication factor {rf} larger than the {len(brokers)} live brokers")
    if not isinstance(t.configs, Mapping | None):
        return TopicResult(name, ErrorCode.INVALID_CONFIG, "configs must be a map")
    return None


def delete_topics(image: MetadataImage, names: Sequence[Any]) -> tuple[Plan, list[TopicResult]]:
    plan = Plan()
    results: list[TopicResult] = []
    for name in names:
        if not isinstance(name, str) or name not in image.topics:
            results.append(TopicResult(str(name), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}"))
            continue
        if any(isinstance(r, RemoveTopicRecord) and r.name == name for r in plan.records):
            results.append(TopicResult(name, ErrorCode.NONE))
            continue
        pending: dict[int, list[int]] = {}
        for tp in image.topic_partitions(name):
            for b in image.partitions[tp].replicas:
                pending.setdefault(b, []).append(tp.partition)
        plan.records.append(RemoveTopicRecord(name, pending))
        results.append(TopicResult(name, ErrorCode.NONE))
    return plan, results


@dataclass(frozen=True, slots=True)
class AlterItem:
    tp: TopicPartition
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    new_isr_broker_epochs: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class AlterResult:
    tp: TopicPartition
    error: ErrorCode
    state: PartitionState | None


def alter_partition(image: MetadataImage, broker_id: int, items: Sequence[AlterItem],
                    eligible: Collection[int]) -> tuple[Plan, list[AlterResult]]:
    """Check each item (rules.check_alter_isr) and plan the accepted ISR changes."""
    plan = Plan()
    results: list[AlterResult] = []
    epochs = {b: reg.broker_epoch for b, reg in image.brokers.items()}
    for item in items:
        st = image.partitions.get(item.tp)
        if st is None:
            results.append(AlterResult(item.tp, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None))
            continue
        view = rules.PartitionView(st.replicas, st.isr, st.leader, st.leader_epoch, st.partition_epoch)
        req = rules.AlterIsrRequest(broker_id, item.leader_epoch, item.partition_epoch, item.new_isr,
                                    item.new_isr_broker_epochs)
        check = rules.check_alter_isr(req, view, eligible=eligible, broker_epochs=epochs)
        if check is not rules.IsrCheck.OK:
            results.append(AlterResult(item.tp, ErrorCode[check.value], st))
            continue
        if rules.same_isr(item.new_isr, st.isr):  # nothing to change (or a resend of an applied change)
            results.append(AlterResult(item.tp, ErrorCode.NONE, st))
            continue
        new = PartitionState(st.replicas, item.new_isr, st.leader, st.leader_epoch, st.partition_epoch + 1)
        plan.change(item.tp, st, new, ElectionReason.ISR_CHANGE, requested_by_leader=True)
        results.append(AlterResult(item.tp, ErrorCode.NONE, new))
    return plan, results
