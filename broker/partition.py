"""One hosted partition: its local log plus its pure ``PartitionState`` (the mutable shell).

The replica manager replaces ``state`` with new frozen values from
``broker.partition_state``; this object only ties the value to the log and the
per-topic config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.partition_state import PartitionState, Role
from common.config import Config
from common.wire import TopicPartition

if TYPE_CHECKING:
    from storage.log import Log


@dataclass
class Partition:
    tp: TopicPartition
    log: Log
    state: PartitionState
    config: Config

    @property
    def is_leader(self) -> bool:
        return self.state.role is Role.LEADER

    @property
    def log_end_offset(self) -> int:
        return int(self.log.log_end_offset)

    @property
    def log_start_offset(self) -> int:
        return int(self.log.log_start_offset)

    @property
    def min_insync_replicas(self) -> int:
        return self.config.get_int("min.insync.replicas")

    @property
    def max_message_bytes(self) -> int:
        return self.config.get_int("message.max.bytes")

    @property
    def log_append_time(self) -> bool:
        """``message.timestamp.type`` is LogAppendTime: the leader stamps its time on each batch."""
        return self.config.get_str("log.message.timestamp.type") == "LogAppendTime"

    @property
    def timestamp_bounds_ms(self) -> tuple[int, int]:
        """How far behind and ahead of the broker's time a batch's timestamps may be."""
        return (self.config.get_int("log.message.timestamp.before.max.ms"),
                self.config.get_int("log.message.timestamp.after.max.ms"))

    def status(self, now_ms: int) -> dict[str, Any]:
        s = self.state
        return {
            "topic": self.tp.topic, "partition": self.tp.partition, "role": s.role.value, "leader": s.leader,
            "leader_epoch": s.leader_epoch, "partition_epoch": s.partition_epoch, "isr": list(s.isr),
            "replicas": list(s.replicas), "high_watermark": s.high_watermark,
            "log_end_offset": self.log_end_offset, "log_start_offset": self.log_start_offset,
            "pending_isr": list(s.pending.new_isr) if s.pending else None,
            "followers": [
                {"broker": r.broker_id, "log_end_offset": r.log_end_offset, "log_start_offset": r.log_start_offset,
                 "last_caught_up_ms_ago": now_ms - r.last_caught_up_ms if r.last_caught_up_ms >= 0 else None}
                for r in s.followers
            ],
        }
