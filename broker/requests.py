"""Decoding of broker request bodies into typed values (docs/protocol.md).

Each ``parse_*`` takes the decoded msgpack map and returns a frozen request or
raises ``common.wire.BadRequest`` (HTTP 400) naming the bad field. Sizes and
offsets are bounded here so the replica manager never sees a negative size or
an absurd value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from common.config import ConfigError, validate_topic_configs
from common.wire import (
    MAX_FETCH_WAIT_MS,
    MAX_INT32,
    MAX_TOPIC_NAME_LENGTH,
    BadRequest,
    TopicPartition,
    field,
    host_field,
    int_field,
    int_list,
    list_field,
    map_items,
    topic_name_error,
)

MAX_PARTITIONS_PER_REQUEST = 10_000


def topic_name(body: Mapping[str, Any], name: str = "topic") -> str:
    """A topic name with Kafka's legal characters (it becomes a directory name on disk)."""
    topic = field(body, name, str)
    if topic_name_error(topic) is not None:
        raise BadRequest(f"invalid topic name {topic[:60]!r}: use [a-zA-Z0-9._-], at most {MAX_TOPIC_NAME_LENGTH}")
    return topic
MAX_TIMEOUT_MS = 5 * 60 * 1000


def _topic_partitions(body: Mapping[str, Any], name: str = "topics") -> list[tuple[TopicPartition, dict[str, Any]]]:
    out: list[tuple[TopicPartition, dict[str, Any]]] = []
    for t in map_items(list_field(body, name), name):
        topic = field(t, "topic", str)
        for p in map_items(list_field(t, "partitions"), "partitions"):
            out.append((TopicPartition(topic, int_field(p, "partition", lo=0, hi=MAX_INT32)), p))
            if len(out) > MAX_PARTITIONS_PER_REQUEST:
                raise BadRequest(f"more than {MAX_PARTITIONS_PER_REQUEST} partitions in one request")
    _refuse_duplicates(tp for tp, _ in out)
    return out


def _refuse_duplicates(tps: Iterable[TopicPartition]) -> None:
    """A partition named twice in one request is refused whole (Kafka's INVALID_REQUEST): which of the two
    would apply is anyone's guess."""
    seen: set[TopicPartition] = set()
    for tp in tps:
        if tp in seen:
            raise BadRequest(f"partition {tp} appears more than once in one request")
        seen.add(tp)


class ProduceRequest(NamedTuple):
    """A NamedTuple, not a frozen dataclass like the other requests: built on every produce, and a frozen
    dataclass costs three times as much to build (~0.9 us against 0.3)."""

    acks: int
    timeout_ms: int
    partitions: dict[TopicPartition, bytes]


def parse_produce(body: Mapping[str, Any]) -> ProduceRequest:
    fast = _parse_produce_fast(body)
    return fast if fast is not None else _parse_produce_general(body)


def _parse_produce_general(body: Mapping[str, Any]) -> ProduceRequest:
    acks = int_field(body, "acks", lo=-MAX_INT32, hi=MAX_INT32)
    timeout_ms = int_field(body, "timeout_ms", 30_000, lo=0, hi=MAX_TIMEOUT_MS)
    parts: dict[TopicPartition, bytes] = {}
    for tp, p in _topic_partitions(body):
        parts[tp] = field(p, "records", bytes)
    return ProduceRequest(acks, timeout_ms, parts)


def _parse_produce_fast(body: Mapping[str, Any]) -> ProduceRequest | None:
    """A well-formed produce body in a few exact type checks, or None: the general path then parses it and
    names what is wrong. The same answer as the general path for every body it accepts (a property test
    holds them to that); it exists because the general path's helpers cost ~2 us per request in a loop
    and several times that inside a loaded broker (docs/benchmarks/broker.md, tenth session).
    ``type(x) is int`` also refuses bool, as ``int_field`` does; msgpack decodes to exact types."""
    acks = body.get("acks")
    timeout_ms = body.get("timeout_ms", 30_000)
    topics = body.get("topics")
    if (type(acks) is not int or type(timeout_ms) is not int or type(topics) is not list
            or not -MAX_INT32 <= acks <= MAX_INT32 or not 0 <= timeout_ms <= MAX_TIMEOUT_MS):
        return None
    parts: dict[TopicPartition, bytes] = {}
    for t in topics:
        if type(t) is not dict:
            return None
        topic = t.get("topic")
        partitions = t.get("partitions")
        if type(topic) is not str or type(partitions) is not list:
            return None
        for p in partitions:
            if type(p) is not dict:
                return None
            partition = p.get("partition")
            records = p.get("records")
            if type(partition) is not int or not 0 <= partition <= MAX_INT32 or type(records) is not bytes:
                return None
            tp = TopicPartition(topic, partition)
            if tp in parts:
                return None
            parts[tp] = records
    if len(parts) > MAX_PARTITIONS_PER_REQUEST:
        return None
    return ProduceRequest(acks, timeout_ms, parts)


@dataclass(frozen=True, slots=True)
class FetchPartitionRequest:
    fetch_offset: int
    current_leader_epoch: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    replica_id: int
    broker_epoch: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: dict[TopicPartition, FetchPartitionRequest]

    @property
    def is_follower(self) -> bool:
        return self.replica_id >= 0


def parse_fetch(body: Mapping[str, Any]) -> FetchRequest:
    parts: dict[TopicPartition, FetchPartitionRequest] = {}
    for tp, p in _topic_partitions(body):
        parts[tp] = FetchPartitionRequest(
            fetch_offset=int_field(p, "fetch_offset", lo=0),
            current_leader_epoch=int_field(p, "current_leader_epoch", -1, lo=-1, hi=MAX_INT32),
            last_fetched_epoch=int_field(p, "last_fetched_epoch", -1, lo=-1, hi=MAX_INT32),
            log_start_offset=int_field(p, "log_start_offset", -1, lo=-1),
            partition_max_bytes=int_field(p, "partition_max_bytes", 1024 * 1024, lo=0, hi=MAX_INT32),
        )
    return FetchRequest(
        replica_id=int_field(body, "replica_id", -1, lo=-1, hi=MAX_INT32),
        broker_epoch=int_field(body, "broker_epoch", -1, lo=-1),
        max_wait_ms=int_field(body, "max_wait_ms", 0, lo=0, hi=MAX_FETCH_WAIT_MS),
        min_bytes=int_field(body, "min_bytes", 1, lo=0, hi=MAX_INT32),
        max_bytes=int_field(body, "max_bytes", 50 * 1024 * 1024, lo=0, hi=MAX_INT32),
        partitions=parts,
    )


@dataclass(frozen=True, slots=True)
class ListOffsetsPartition:
    current_leader_epoch: int
    timestamp: int


def parse_list_offsets(body: Mapping[str, Any]) -> tuple[int, dict[TopicPartition, ListOffsetsPartition]]:
    replica_id = int_field(body, "replica_id", -1, lo=-1, hi=MAX_INT32)
    parts = {
        tp: ListOffsetsPartition(int_field(p, "current_leader_epoch", -1, lo=-1, hi=MAX_INT32),
                                 int_field(p, "timestamp", lo=-3))  # -3: MAX_TIMESTAMP (KIP-734)
        for tp, p in _topic_partitions(body)
    }
    return replica_id, parts


def parse_offsets_for_leader_epoch(body: Mapping[str, Any]) -> tuple[int, dict[TopicPartition, tuple[int, int]]]:
    """-> (replica_id, {tp: (current_leader_epoch, leader_epoch)})."""
    replica_id = int_field(body, "replica_id", -1, lo=-1, hi=MAX_INT32)
    parts = {
        tp: (int_field(p, "current_leader_epoch", -1, lo=-1, hi=MAX_INT32),
             int_field(p, "leader_epoch", lo=-1, hi=MAX_INT32))
        for tp, p in _topic_partitions(body)
    }
    return replica_id, parts


@dataclass(frozen=True, slots=True)
class PartitionStateMsg:
    """One entry of leader_and_isr / update_metadata ``partition_states``."""

    tp: TopicPartition
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int
    replicas: tuple[int, ...]
    is_new: bool


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int


def _partition_states(body: Mapping[str, Any]) -> list[PartitionStateMsg]:
    out = []
    for p in map_items(list_field(body, "partition_states", []), "partition_states"):
        msg = PartitionStateMsg(
            tp=TopicPartition(topic_name(p), int_field(p, "partition", lo=0, hi=MAX_INT32)),
            leader=int_field(p, "leader", lo=-MAX_INT32 - 1, hi=MAX_INT32),
            leader_epoch=int_field(p, "leader_epoch", lo=-MAX_INT32 - 1, hi=MAX_INT32),
            isr=tuple(int_list(p, "isr")),
            partition_epoch=int_field(p, "partition_epoch", 0, lo=-MAX_INT32 - 1, hi=MAX_INT32),
            replicas=tuple(int_list(p, "replicas")),
            is_new=field(p, "is_new", bool, False),
        )
        problem = _partition_state_problem(msg)
        if problem is not None:
            raise BadRequest(f"partition state of {msg.tp}: {problem}")
        out.append(msg)
    _refuse_duplicates(msg.tp for msg in out)
    return out


def _partition_state_problem(msg: PartitionStateMsg) -> str | None:
    """Why a partition state cannot be applied, or None. What the controller sends (controller/ops.py,
    controller/rules.py) always passes: a leader in the ISR, the ISR a subset of the replicas; an offline
    partition has leader -1 and keeps its last ISR (which then need not hold a leader); after an unclean
    election the ISR is the leader alone. A broker that applied any other state could not get out of it
    (a leader outside its own ISR, an ISR naming brokers that hold no replica)."""
    if msg.leader < -1:
        return f"leader {msg.leader} is not a broker id (>= 0) nor -1 (no leader)"
    for name, value in (("leader_epoch", msg.leader_epoch), ("partition_epoch", msg.partition_epoch)):
        if value < 0:
            return f"{name} {value} is negative: a leader epoch and a partition epoch start at 0"
    for name, ids in (("replicas", msg.replicas), ("isr", msg.isr)):
        for b in ids:
            if not 0 <= b <= MAX_INT32:
                return f"{name} {_ids(ids)}: broker id {b} outside [0, {MAX_INT32}]"
        if len(set(ids)) != len(ids):
            return f"{name} {_ids(ids)} names a broker more than once"
    replicas = set(msg.replicas)
    outside = [b for b in msg.isr if b not in replicas]
    if outside:
        return f"isr {_ids(msg.isr)} is not a subset of replicas {_ids(msg.replicas)} (has {_ids(outside)})"
    if msg.leader >= 0:  # -1: no leader (offline), the ISR kept
        if msg.leader not in replicas:
            return f"leader {msg.leader} is not one of the replicas {_ids(msg.replicas)}"
        if not msg.isr:
            return f"leader {msg.leader} with an empty isr: a leader is always in the isr"
        if msg.leader not in msg.isr:
            return f"leader {msg.leader} is not in the isr {_ids(msg.isr)}"
    return None


def _ids(ids: Iterable[int], most: int = 10) -> str:
    """Broker ids for an error message, at most ``most`` of them."""
    shown = list(ids)
    return str(shown) if len(shown) <= most else f"[{', '.join(map(str, shown[:most]))}, ... ({len(shown)} ids)]"


def _brokers(body: Mapping[str, Any], name: str) -> list[BrokerInfo]:
    return [
        BrokerInfo(int_field(b, "node_id", lo=0, hi=MAX_INT32), host_field(b),
                   int_field(b, "port", lo=0, hi=65535))
        for b in map_items(list_field(body, name, []), name)
    ]


def _topic_configs(body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    raw = field(body, "topic_configs", dict, {})
    out: dict[str, dict[str, Any]] = {}
    for topic, cfg in raw.items():
        if not isinstance(topic, str) or not isinstance(cfg, dict) or not all(isinstance(k, str) for k in cfg):
            raise BadRequest("topic_configs must map topic names to maps")
        try:  # refused whole, before any state changes, rather than half applied
            validate_topic_configs(cfg)
        except ConfigError as exc:
            raise BadRequest(f"topic_configs of {topic!r}: {exc}") from None
        out[topic] = cfg
    return out


@dataclass(frozen=True, slots=True)
class ControlHeader:
    controller_id: int
    controller_epoch: int
    broker_epoch: int


def _control_header(body: Mapping[str, Any]) -> ControlHeader:
    return ControlHeader(int_field(body, "controller_id", lo=-1, hi=MAX_INT32),
                         int_field(body, "controller_epoch", lo=0, hi=MAX_INT32),
                         int_field(body, "broker_epoch", -1, lo=-1))


@dataclass(frozen=True, slots=True)
class LeaderAndIsrRequest:
    header: ControlHeader
    partition_states: list[PartitionStateMsg]
    live_leaders: list[BrokerInfo]
    topic_configs: dict[str, dict[str, Any]]


def parse_leader_and_isr(body: Mapping[str, Any]) -> LeaderAndIsrRequest:
    return LeaderAndIsrRequest(_control_header(body), _partition_states(body), _brokers(body, "live_leaders"),
                               _topic_configs(body))


@dataclass(frozen=True, slots=True)
class StopReplicaPartition:
    tp: TopicPartition
    leader_epoch: int
    delete: bool


def parse_stop_replica(body: Mapping[str, Any]) -> tuple[ControlHeader, list[StopReplicaPartition]]:
    parts = [
        StopReplicaPartition(TopicPartition(topic_name(p), int_field(p, "partition", lo=0, hi=MAX_INT32)),
                             int_field(p, "leader_epoch", -1, lo=-2, hi=MAX_INT32), field(p, "delete", bool, False))
        for p in map_items(list_field(body, "partitions"), "partitions")
    ]
    _refuse_duplicates(p.tp for p in parts)
    return _control_header(body), parts


@dataclass(frozen=True, slots=True)
class UpdateMetadataRequest:
    header: ControlHeader
    brokers: list[BrokerInfo]
    partition_states: list[PartitionStateMsg]
    topic_configs: dict[str, dict[str, Any]]
    deleted_topics: list[str]
    # the whole cluster's metadata (Kafka's FULL UpdateMetadata, KIP-866): a topic it does not list is gone
    full: bool = False


def parse_update_metadata(body: Mapping[str, Any]) -> UpdateMetadataRequest:
    deleted = list_field(body, "deleted_topics", [])
    if not all(isinstance(t, str) for t in deleted):
        raise BadRequest("deleted_topics must be a list of strings")
    return UpdateMetadataRequest(_control_header(body), _brokers(body, "brokers"), _partition_states(body),
                                 _topic_configs(body), deleted, field(body, "full", bool, False))


def parse_metadata(body: Mapping[str, Any]) -> list[str] | None:
    topics = body.get("topics")
    if topics is None:
        return None
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise BadRequest("topics must be a list of strings or nil")
    return topics


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest:
    """Kafka's InitProducerId, idempotence only: ``producer_id``/``producer_epoch`` are read and ignored (every
    call gets a new id with epoch 0; no epoch bump), as is ``transaction_timeout_ms``."""

    transaction_timeout_ms: int
    producer_id: int
    producer_epoch: int


def parse_init_producer_id(body: Mapping[str, Any]) -> InitProducerIdRequest:
    """Every field may be left out (defaults: nil, -1, -1, -1); one that is there must have its type."""
    if body.get("transactional_id") is not None:
        if not isinstance(body["transactional_id"], str):
            raise BadRequest("field 'transactional_id' must be nil")
        raise BadRequest("transactions are not supported: transactional_id must be nil")
    return InitProducerIdRequest(
        transaction_timeout_ms=int_field(body, "transaction_timeout_ms", -1, lo=-MAX_INT32 - 1, hi=MAX_INT32),
        producer_id=int_field(body, "producer_id", -1),  # int64
        producer_epoch=int_field(body, "producer_epoch", -1, lo=-(2**15), hi=2**15 - 1),  # int16
    )
