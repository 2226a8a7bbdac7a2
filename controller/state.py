"""The controller's metadata image and the records that change it (pure; no I/O).

Like KRaft's metadata log, every change is a record; the image is what applying
the records in order gives. ``MetadataImage.apply`` is deterministic, so replaying
the journal (controller/journal.py) rebuilds exactly the image that was
acknowledged. Records carry full new values (a ``PartitionRecord`` is the whole
partition state), never deltas, so applying one twice is harmless.

Records (``type`` on the wire):
  controller_epoch  {epoch}
  register_broker   {node_id, host, port, incarnation_id, broker_epoch}
  broker_fencing    {node_id, broker_epoch, fenced}
  topic             {name, configs}
  partition         {topic, partition, replicas, isr, leader, leader_epoch, partition_epoch}
  remove_topic      {name, pending: {broker: [partition, ...]}}   replicas still to confirm the delete
  topic_stopped     {name, broker}                 that broker deleted its replicas of the topic
  producer_ids      {broker_id, broker_epoch, next_producer_id}  a block of producer ids was handed to that
                    broker; ids below next_producer_id are taken (Kafka's ProducerIdsRecord)

Liveness (heartbeat times) is not part of the image: it lives in the shell and is
rebuilt after a restart by treating every unfenced broker as alive until its
session timeout (as KRaft keeps brokers unfenced from the log).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from common.wire import TopicPartition

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    node_id: int
    host: str
    port: int
    incarnation_id: str
    broker_epoch: int
    fenced: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def endpoint(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": self.host, "port": self.port}


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int

    @property
    def preferred(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER


# --- records -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ControllerEpochRecord:
    epoch: int


@dataclass(frozen=True, slots=True)
class RegisterBrokerRecord:
    node_id: int
    host: str
    port: int
    incarnation_id: str
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class BrokerFencingRecord:
    node_id: int
    broker_epoch: int
    fenced: bool


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    configs: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def state(self) -> PartitionState:
        return PartitionState(self.replicas, self.isr, self.leader, self.leader_epoch, self.partition_epoch)

    @classmethod
    def of(cls, tp: TopicPartition, st: PartitionState) -> PartitionRecord:
        return cls(tp.topic, tp.partition, st.replicas, st.isr, st.leader, st.leader_epoch, st.partition_epoch)


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord:
    """The topic is gone from metadata; ``pending`` brokers still have to delete their replicas
    (StopReplica with delete), so the name cannot be reused before they confirm."""

    name: str
    pending: Mapping[int, Sequence[int]]


@dataclass(frozen=True, slots=True)
class TopicStoppedRecord:
    name: str
    broker: int


@dataclass(frozen=True, slots=True)
class ProducerIdsRecord:
    """Kafka's ProducerIdsRecord: the ids below ``next_producer_id`` are handed out (the last block to
    ``broker_id``). Carries the full new value, so applying it twice is harmless; it never moves back."""

    broker_id: int
    broker_epoch: int
    next_producer_id: int


@dataclass(frozen=True, slots=True)
class ClusterIdRecord:
    """The cluster's id, journalled once at the first start (as KRaft's metadata log knows its cluster id);
    the data dir's meta.properties is a copy of it."""

    cluster_id: str


Record = (ControllerEpochRecord | RegisterBrokerRecord | BrokerFencingRecord | TopicRecord | PartitionRecord
          | RemoveTopicRecord | TopicStoppedRecord | ProducerIdsRecord | ClusterIdRecord)

_TYPES: dict[str, type[Any]] = {
    "controller_epoch": ControllerEpochRecord,
    "register_broker": RegisterBrokerRecord,
    "broker_fencing": BrokerFencingRecord,
    "topic": TopicRecord,
    "partition": PartitionRecord,
    "remove_topic": RemoveTopicRecord,
    "topic_stopped": TopicStoppedRecord,
    "producer_ids": ProducerIdsRecord,
    "cluster_id": ClusterIdRecord,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def record_to_dict(rec: Record) -> dict[str, Any]:
    out: dict[str, Any] = {"type": _NAMES[type(rec)]}
    for name in rec.__dataclass_fields__:
        value = getattr(rec, name)
        out[name] = list(value) if isinstance(value, tuple) else (dict(value) if isinstance(value, Mapping)
                                                                   else value)
    return out


def record_from_dict(d: Mapping[str, Any]) -> Record:
    """Inverse of ``record_to_dict``; ``ValueError`` on an unknown type or missing field."""
    cls = _TYPES.get(str(d.get("type")))
    if cls is None:
        raise ValueError(f"unknown record type {d.get('type')!r}")
    kwargs: dict[str, Any] = {}
    for name in cls.__dataclass_fields__:
        if name not in d:
            raise ValueError(f"record {d.get('type')} lacks {name!r}")
        value = d[name]
        kwargs[name] = tuple(value) if isinstance(value, list) else value
    rec: Record = cls(**kwargs)
    return rec


# --- the image -----------------------------------------------------------------------------------

MAX_LEADER_EPOCH_FLOORS = 10_000  # deleted topic names remembered (a client that knew an older one has moved on)

@dataclass(slots=True)
class MetadataImage:
    """Everything the controller knows durably. Mutated only by ``apply``."""

    controller_epoch: int = 0
    last_broker_epoch: int = 0
    cluster_id: str | None = None  # set once, never changed
    brokers: dict[int, BrokerRegistration] = field(default_factory=dict)
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> topic configs
    partitions: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    deleting: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)  # topic -> broker -> partitions
    last_producer_ids: ProducerIdsRecord | None = None  # the last block's record (kept in snapshots)
    # deleted topic name -> the leader epoch its partitions start at if the name is created again: above every
    # epoch the deleted topic had, so a client or broker that knew the old topic takes the new one's leaders
    # as newer, not stale (Kafka tells the two apart by topic id, KIP-516; this keeps the wire as it is)
    leader_epoch_floors: dict[str, int] = field(default_factory=dict)
    # topic -> its partition numbers (as ``partitions`` holds them), so one topic's partitions cost their own
    # number, not a scan of every partition (metadata of all topics was quadratic: 8 s at 16,000 topics)
    _partitions_by_topic: dict[str, set[int]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def next_producer_id(self) -> int:
        """The first producer id not yet handed out."""
        return 0 if self.last_producer_ids is None else self.last_producer_ids.next_producer_id

    def apply(self, rec: Record) -> None:
        if isinstance(rec, ControllerEpochRecord):
            self.controller_epoch = max(self.controller_epoch, rec.epoch)
        elif isinstance(rec, RegisterBrokerRecord):
            self.brokers[rec.node_id] = BrokerRegistration(rec.node_id, rec.host, rec.port, rec.incarnation_id,
                                                           rec.broker_epoch)
            self.last_broker_epoch = max(self.last_broker_epoch, rec.broker_epoch)
        elif isinstance(rec, BrokerFencingRecord):
            reg = self.brokers.get(rec.node_id)
            if reg is not None and reg.broker_epoch == rec.broker_epoch:
                self.brokers[rec.node_id] = replace(reg, fenced=rec.fenced)
        elif isinstance(rec, TopicRecord):
            self.topics[rec.name] = dict(rec.configs)
            self.leader_epoch_floors.pop(rec.name, None)  # its partitions' records carry their epochs now
        elif isinstance(rec, PartitionRecord):
            self.partitions[rec.tp] = rec.state()
            self._partitions_by_topic.setdefault(rec.tp.topic, set()).add(rec.tp.partition)
        elif isinstance(rec, RemoveTopicRecord):
            self.topics.pop(rec.name, None)
            for tp in self.topic_partitions(rec.name):
                floor = max(self.leader_epoch_floors.pop(rec.name, 0), self.partitions[tp].leader_epoch + 1)
                self.leader_epoch_floors[rec.name] = floor  # (re)inserted last: the newest deletion
                del self.partitions[tp]
            self._partitions_by_topic.pop(rec.name, None)
            while len(self.leader_epoch_floors) > MAX_LEADER_EPOCH_FLOORS:  # the oldest deletions go first
                del self.leader_epoch_floors[next(iter(self.leader_epoch_floors))]
            pending = {int(b): tuple(ps) for b, ps in rec.pending.items() if ps}
            if pending:
                self.deleting[rec.name] = pending
            else:
                self.deleting.pop(rec.name, None)
        elif isinstance(rec, ProducerIdsRecord):
            if rec.next_producer_id >= self.next_producer_id:
                self.last_producer_ids = rec
        elif isinstance(rec, ClusterIdRecord):
            if self.cluster_id is None:
                self.cluster_id = rec.cluster_id
        elif isinstance(rec, TopicStoppedRecord):
            left = self.deleting.get(rec.name)
            if left is not None:
                left.pop(rec.broker, None)
                if not left:
                    del self.deleting[rec.name]
        else:  # pragma: no cover - exhaustiveness
            raise AssertionError(f"unknown record {rec!r}")

    def topic_partitions(self, topic: str) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for p in sorted(self._partitions_by_topic.get(topic, ()))]

    def partitions_of_broker(self, broker: int) -> Iterator[tuple[TopicPartition, PartitionState]]:
        for tp, st in sorted(self.partitions.items()):
            if broker in st.replicas:
                yield tp, st

    def unfenced(self) -> list[int]:
        return sorted(b for b, reg in self.brokers.items() if not reg.fenced)

    def to_snapshot(self) -> dict[str, Any]:
        """The image as records (what a snapshot file holds)."""
        records: list[Record] = [ControllerEpochRecord(self.controller_epoch)]
        if self.cluster_id is not None:
            records.append(ClusterIdRecord(self.cluster_id))
        for reg in self.brokers.values():
            records.append(RegisterBrokerRecord(reg.node_id, reg.host, reg.port, reg.incarnation_id,
                                                reg.broker_epoch))
            if reg.fenced:
                records.append(BrokerFencingRecord(reg.node_id, reg.broker_epoch, True))
        for name, configs in self.topics.items():
            records.append(TopicRecord(name, configs))
        for tp, st in self.partitions.items():
            records.append(PartitionRecord.of(tp, st))
        for name, pending in self.deleting.items():
            records.append(RemoveTopicRecord(name, {b: list(ps) for b, ps in pending.items()}))
        if self.last_producer_ids is not None:
            records.append(self.last_producer_ids)
        return {"last_broker_epoch": self.last_broker_epoch, "records": [record_to_dict(r) for r in records],
                "leader_epoch_floors": dict(self.leader_epoch_floors)}

    @classmethod
    def from_snapshot(cls, doc: Mapping[str, Any]) -> MetadataImage:
        image = cls()
        for d in doc.get("records") or []:
            image.apply(record_from_dict(d))
        image.last_broker_epoch = max(image.last_broker_epoch, int(doc.get("last_broker_epoch", 0)))
        floors = doc.get("leader_epoch_floors") or {}
        image.leader_epoch_floors = {str(name): int(epoch) for name, epoch in floors.items()}
        return image
