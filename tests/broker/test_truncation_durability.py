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
    lg.truncate_to(50)  # what the fetcher does, then it tells the replica manager, then it ends the round
    rm.on_follower_truncated(TP, 50, "test")
    rm.truncations_done()
    assert checkpoint.read_offsets(tmp_path / RECOVERY_CHECKPOINT) == {TP: 50}
    await lm.close()


async def test_a_full_truncation_moves_the_high_watermark_to_the_new_log_start(tmp_path: Path) -> None:
    """A follower far behind the leader's log start restarts its log there (truncate fully); its HW follows
    (Kafka's truncateFullyAndStartAt), never left below the log start it now has."""
    from broker.requests import parse_leader_and_isr

    clock = ManualClock(TS)
    lm = LogManager(tmp_path, broker_config(), clock)
    await lm.load()
    rm = ReplicaManager(1, broker_config(), clock, lm, MetadataCache("c"), BrokerMetrics())
    await rm.leader_and_isr(parse_leader_and_isr({
        "controller_id": 100, "controller_epoch": 1, "broker_epoch": -1, "live_leaders": [],
        "partition_states": [{"topic": TP.topic, "partition": 0, "leader": 2, "leader_epoch": 0, "isr": [2],
                              "partition_epoch": 0, "replicas": [2, 1]}]}))
    p = rm.partitions[TP]
    assert p.state.high_watermark == 0
    p.log.truncate_fully_and_start_at(114)  # what the fetcher does, then it tells the replica manager
    rm.on_follower_truncated(TP, 114, "out_of_range:leader_start_above_local_end")
    assert (p.log_start_offset, p.log_end_offset, p.state.high_watermark) == (114, 114, 114)
    await lm.close()
