"""What UpdateMetadata / LeaderAndIsr told this broker about the cluster (Kafka ``MetadataCache``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.requests import BrokerInfo, PartitionStateMsg
from common.errors import ErrorCode
from common.wire import TopicPartition, topic_name_error


@dataclass
class MetadataCache:
    cluster_id: str
    controller_id: int = -1
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    partitions: dict[TopicPartition, PartitionStateMsg] = field(default_factory=dict)
    topic_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # True once an UpdateMetadata listed the live brokers: ``brokers`` is then the cluster's live set (before,
    # only the leaders LeaderAndIsr requests named)
    live_brokers_known: bool = False

    def update(self, controller_id: int, brokers: list[BrokerInfo] | None, states: list[PartitionStateMsg],
               topic_configs: dict[str, dict[str, Any]], deleted_topics: list[str], *, full: bool = False) -> None:
        """``full``: ``states`` and ``topic_configs`` are the whole cluster's (a controller's sync after this
        broker registered, was unfenced or the controller started): partitions and topics they leave out are
        gone. A broker that missed a deletion's UpdateMetadata (fenced, or the controller restarted) kept the
        topic for ever, and a re-created one with fewer partitions kept the extra ones (Kafka's FULL
        UpdateMetadata, KIP-866, has the broker drop what it does not list)."""
        self.controller_id = controller_id
        if brokers is not None:  # UpdateMetadata carries every live broker; LeaderAndIsr passes None
            self.brokers = {b.node_id: b for b in brokers}
            self.live_brokers_known = True
        if full:
            self.partitions = {}
            self.topic_configs = {}
        for s in states:
            self.partitions[s.tp] = s
        self.topic_configs.update(topic_configs)
        for topic in deleted_topics:
            self.topic_configs.pop(topic, None)
            for tp in [tp for tp in self.partitions if tp.topic == topic]:
                del self.partitions[tp]

    def add_brokers(self, brokers: list[BrokerInfo]) -> None:
        for b in brokers:
            self.brokers[b.node_id] = b

    def metadata_response(self, topics: list[str] | None) -> dict[str, Any]:
        by_topic: dict[str, list[PartitionStateMsg]] = {}
        for tp, s in sorted(self.partitions.items()):
            by_topic.setdefault(tp.topic, []).append(s)
        names = sorted(by_topic) if topics is None else topics
        out = []
        for name in names:
            parts = by_topic.get(name)
            if parts is None:
                # Kafka's KafkaApis.getTopicMetadata: a name no topic can have is INVALID_TOPIC_EXCEPTION, which a
                # client gives up on at once; UNKNOWN_TOPIC_OR_PARTITION had it wait for the topic to appear
                error = (ErrorCode.INVALID_TOPIC_EXCEPTION if topic_name_error(name)
                         else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                out.append({"topic": name, "error": int(error), "partitions": []})
                continue
            out.append({"topic": name, "error": 0, "partitions": [self._partition(s) for s in parts]})
        return {
            "cluster_id": self.cluster_id,
            "controller_id": self.controller_id,
            "brokers": [{"node_id": b.node_id, "host": b.host, "port": b.port}
                        for b in sorted(self.brokers.values(), key=lambda b: b.node_id)],
            "topics": out,
        }

    def _partition(self, s: PartitionStateMsg) -> dict[str, Any]:
        offline = [r for r in s.replicas if r not in self.brokers]
        return {"partition": s.tp.partition, "error": 5 if s.leader < 0 else 0, "leader": s.leader,
                "leader_epoch": s.leader_epoch, "replicas": list(s.replicas), "isr": list(s.isr),
                "offline_replicas": offline}
