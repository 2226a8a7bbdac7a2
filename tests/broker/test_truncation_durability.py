"""A follower's truncation and the recovery-point checkpoint: the real ReplicaManager over a real LogManager."""

from __future__ import annotations

from pathlib import Path

from broker.metadata_cache import MetadataCache
from broker.metrics import BrokerMetrics
from broker.replica_manager import ReplicaManager
from common.clock import ManualClock
from common.config import broker_config
from common.wire import TopicPartition
from storage import checkpoint
from storage.log import LogConfig
from storage.log_manager import RECOVERY_CHECKPOINT, LogManager
from storage.record_batch import build_batch

TP = TopicPartition("t", 0)
TS = 1_700_000_000_000


async def test_truncation_lowers_the_recovery_point_on_disk_at_once(tmp_path: Path) -> None:
    # Kafka's LogManager.truncateTo checkpoints at once: a checkpoint still at 100 after a cut to 50 would
    # let a restart after a power loss skip the checks of batches 50.. appended since, never fsynced
    clock = ManualClock(TS)
    lm = LogManager(tmp_path, broker_config(), clock)
    await lm.load()
    rm = ReplicaManager(1, broker_config(), clock, lm, MetadataCache("c"), BrokerMetrics())
    lg = await lm.get_or_create_log(TP, LogConfig())
    for _ in range(10):
        lg.append_as_leader(build_batch([(None, b"x" * 100, TS)] * 10, timestamp_ms=TS), 1)
    lg.flush()
    lm.checkpoint_recovery_points_and_log_starts()
    assert checkpoint.read_offsets(tmp_path / RECOVERY_CHECKPOINT) == {TP: 100}
    lg.truncate_to(50)  # what the fetcher does, then it tells the replica manager
    rm.on_follower_truncated(TP, 50, "test")
    assert checkpoint.read_offsets(tmp_path / RECOVERY_CHECKPOINT) == {TP: 50}
    await lm.close()
