"""Which followers a leader asks to add to the ISR, and what a refusal leaves: a real ReplicaManager over a real
LogManager, the AlterPartition sender (the interface ControllerLink implements) answering with the
controller's own rules (controller.rules.check_alter_isr). Kafka checks each candidate against the metadata
(Partition.isReplicaIsrEligible, KIP-841) and adds one follower per AlterPartition (maybeExpandIsr)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker import requests as rq
from broker.metadata_cache import MetadataCache
from broker.metrics import BrokerMetrics
from broker.replica_manager import AlterResult, ReplicaManager
from common.clock import SystemClock
from common.config import broker_config
from common.errors import ErrorCode
from common.wire import TopicPartition
from controller import rules
from storage.log_manager import LogManager
from storage.record_batch import build_batch

TP = TopicPartition("t", 0)
EPOCHS = {1: 5, 2: 7, 3: 9}  # current broker epochs


class RulesController:
    """A controller model: one partition, answered with controller.rules.check_alter_isr. ``hold`` parks
    the next call until ``release``."""

    def __init__(self, isr: tuple[int, ...], live: set[int]) -> None:
        self.replicas = (1, 2, 3)
        self.isr = isr
        self.leader_epoch = 1
        self.partition_epoch = 1
        self.live = live
        self.calls: list[tuple[int, tuple[int, ...], str]] = []
        self.hold = False
        self.held: list[tuple[asyncio.Future[None], int, tuple[int, ...], dict[int, int]]] = []

    async def alter_partition(self, tp: TopicPartition, leader_epoch: int, partition_epoch: int,
                              new_isr: tuple[int, ...], broker_epochs: dict[int, int]) -> AlterResult:
        if self.hold:
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.held.append((gate, partition_epoch, tuple(new_isr), dict(broker_epochs)))
            await gate
        req = rules.AlterIsrRequest(1, leader_epoch, partition_epoch, tuple(new_isr), broker_epochs)
        view = rules.PartitionView(self.replicas, self.isr, 1, self.leader_epoch, self.partition_epoch)
        check = rules.check_alter_isr(req, view, eligible=self.live, broker_epochs=EPOCHS)
        self.calls.append((partition_epoch, tuple(new_isr), check.value))
        if check is rules.IsrCheck.OK and not rules.same_isr(new_isr, self.isr):
            self.isr, self.partition_epoch = tuple(new_isr), self.partition_epoch + 1
        return AlterResult(ErrorCode[check.value], self.leader_epoch, self.isr, self.partition_epoch)


def lai(partition_epoch: int, isr: list[int]) -> rq.LeaderAndIsrRequest:
    return rq.parse_leader_and_isr({
        "controller_id": 100, "controller_epoch": 1, "broker_epoch": -1,
        "live_leaders": [],
        "partition_states": [{"topic": TP.topic, "partition": 0, "leader": 1, "leader_epoch": 1,
                              "isr": isr, "partition_epoch": partition_epoch, "replicas": [1, 2, 3]}]})


def um(live: list[int]) -> rq.UpdateMetadataRequest:
    return rq.parse_update_metadata({
        "controller_id": 100, "controller_epoch": 1, "broker_epoch": -1,
        "brokers": [{"node_id": b, "host": "127.0.0.1", "port": 9000 + b} for b in live]})


def follower_fetch(replica: int, offset: int) -> rq.FetchRequest:
    return rq.parse_fetch({"replica_id": replica, "broker_epoch": EPOCHS[replica], "max_wait_ms": 0,
                           "min_bytes": 1, "max_bytes": 1 << 20, "topics": [{"topic": TP.topic, "partitions": [{
                               "partition": 0, "fetch_offset": offset, "current_leader_epoch": 1,
                               "last_fetched_epoch": -1, "log_start_offset": 0,
                               "partition_max_bytes": 1 << 20}]}]})


def produce(acks: int) -> rq.ProduceRequest:
    records = build_batch([(None, b"v")] * 3, timestamp_ms=1_700_000_000_000)
    return rq.parse_produce({"acks": acks, "timeout_ms": 2_000, "topics": [
        {"topic": TP.topic, "partitions": [{"partition": 0, "records": records}]}]})


async def leader(tmp_path: Path, ctl: RulesController, min_isr: int = 1) -> tuple[ReplicaManager, LogManager]:
    config = broker_config().with_topic_overrides({"min.insync.replicas": min_isr}) if min_isr != 1 \
        else broker_config()
    lm = LogManager(tmp_path, config, SystemClock())
    await lm.load()
    rm = ReplicaManager(1, config, SystemClock(), lm, MetadataCache("c"), BrokerMetrics())
    lm.high_watermarks = rm.high_watermarks
    rm.broker_epoch = EPOCHS[1]
    rm.alter_sender = ctl
    await rm.start()
    return rm, lm


def lai_other(leader: int, leader_epoch: int, live_leaders: list[int]) -> rq.LeaderAndIsrRequest:
    """Partition t-1 (replicas 2, 1; this broker a follower)."""
    return rq.parse_leader_and_isr({
        "controller_id": 100, "controller_epoch": 1, "broker_epoch": -1,
        "live_leaders": [{"node_id": b, "host": "127.0.0.1", "port": 9000 + b} for b in live_leaders],
        "partition_states": [{"topic": "t", "partition": 1, "leader": leader, "leader_epoch": leader_epoch,
                              "isr": [2], "partition_epoch": leader_epoch, "replicas": [2, 1]}]})


async def test_a_crashed_isr_member_is_not_proposed_with_a_healthy_replica(tmp_path: Path) -> None:
    """Broker 2 crashes on a partition nobody writes to: its kept state still looks caught up. It is no live
    broker, so it is not proposed; 3, caught up, is, alone, and joins: acks=all with min.insync.replicas 2
    works again. (Both were asked for together, refused for 2, and 3 stayed out for the whole outage.)"""
    ctl = RulesController(isr=(1, 2), live={1, 2, 3})
    rm, lm = await leader(tmp_path, ctl, min_isr=2)
    try:
        await rm.leader_and_isr(lai(1, [1, 2]))
        await rm.update_metadata(um([1, 2, 3]))
        assert (await rm.produce(produce(acks=1)))[TP]["error"] == 0
        await rm.fetch(follower_fetch(2, 3))  # HW 3
        ctl.live, ctl.isr, ctl.partition_epoch = {1, 3}, (1,), 2  # 2 crashed: fenced, out of the ISR
        await rm.leader_and_isr(lai(2, [1]))
        await rm.update_metadata(um([1, 3]))
        rm.maybe_shrink_isr()  # the periodic task: nothing to ask for 2
        await rm.fetch(follower_fetch(3, 3))  # 3 caught up
        await asyncio.sleep(0.05)
        assert ctl.calls == [(2, (1, 3), "NONE")]
        p = rm.partitions[TP]
        assert p.state.isr == (1, 3)
        waiting = asyncio.ensure_future(rm.produce(produce(acks=-1)))
        await asyncio.sleep(0.01)
        await rm.fetch(follower_fetch(3, 6))  # 3 has it: the HW passes it, 2's stale LEO holds nothing back
        assert (await asyncio.wait_for(waiting, 5))[TP]["error"] == 0
    finally:
        await rm.shutdown()
        await lm.close()


async def test_a_replica_refused_while_fenced_is_asked_for_again_once_unfenced(tmp_path: Path) -> None:
    """2 is refused as ineligible while the controller had fenced it, then unfenced at the same broker epoch.
    This broker learns it live from a LeaderAndIsr (2 leads t-1) before the UpdateMetadata, whose live set is
    then the one it already had: the refusal must not outlive it (it did, for the whole leader epoch)."""
    ctl = RulesController(isr=(1, 3), live={1, 2, 3})
    rm, lm = await leader(tmp_path, ctl)
    try:
        assert (await rm.leader_and_isr(lai(1, [1, 3])))["partitions"][0]["error"] == 0
        assert (await rm.leader_and_isr(lai_other(-1, 1, [])))["partitions"][0]["error"] == 0  # t-1 offline
        await rm.update_metadata(um([1, 2, 3]))
        assert (await rm.produce(produce(acks=1)))[TP]["error"] == 0
        await rm.fetch(follower_fetch(3, 3))
        ctl.live = {1, 3}  # the controller fenced 2 a moment ago; this broker has not heard yet
        await rm.fetch(follower_fetch(2, 3))  # caught up: asked for, refused
        await asyncio.sleep(0.05)
        assert ctl.calls[-1] == (1, (1, 3, 2), "INELIGIBLE_REPLICA"), ctl.calls
        ctl.live = {1, 2, 3}  # unfenced, same broker epoch: it leads t-1 now
        assert (await rm.leader_and_isr(lai_other(2, 2, [2])))["partitions"][0]["error"] == 0
        await rm.update_metadata(um([1, 2, 3]))
        await asyncio.sleep(0.3)  # past the leader's backoff after a refusal
        await rm.fetch(follower_fetch(2, 3))
        await asyncio.sleep(0.05)
        assert rm.partitions[TP].state.isr == (1, 3, 2)
    finally:
        await rm.shutdown()
        await lm.close()


async def test_an_update_metadata_waits_for_the_leader_and_isr_in_progress(tmp_path: Path) -> None:
    """An UpdateMetadata arriving while a LeaderAndIsr creates its log is applied after it (Kafka's
    replicaStateChangeLock): the newer partition state it carries is the one metadata answers, not the older
    one the LeaderAndIsr applied."""
    rm, lm = await leader(tmp_path, RulesController((1, 2, 3), {1, 2, 3}))
    try:
        applying = asyncio.create_task(rm.leader_and_isr(lai(1, [1, 2, 3])))
        await asyncio.sleep(0)  # it runs up to the log's creation in a worker thread
        assert not applying.done()
        newer = rq.parse_update_metadata({
            "controller_id": 100, "controller_epoch": 1, "broker_epoch": -1,
            "brokers": [{"node_id": b, "host": "127.0.0.1", "port": 9000 + b} for b in (1, 2, 3)],
            "partition_states": [{"topic": TP.topic, "partition": 0, "leader": 1, "leader_epoch": 1,
                                  "isr": [1, 2], "partition_epoch": 2, "replicas": [1, 2, 3]}]})
        assert (await rm.update_metadata(newer))["error"] == 0
        await applying
        state = rm.metadata.partitions[TP]
        assert (list(state.isr), state.partition_epoch) == ([1, 2], 2)
    finally:
        await rm.shutdown()
        await lm.close()


async def test_a_stopped_replica_leaves_no_isr_backoff_behind(tmp_path: Path) -> None:
    # the backoff after a refused ISR change was kept for every partition ever refused, deleted ones too
    # (found by a leak review: topic churn grew it by one entry per refused partition)
    ctl = RulesController(isr=(1, 3), live={1, 3})
    rm, lm = await leader(tmp_path, ctl)
    try:
        await rm.leader_and_isr(lai(1, [1, 3]))
        await rm.update_metadata(um([1, 2, 3]))  # the controller has fenced 2 since; this broker has not heard
        assert (await rm.produce(produce(acks=1)))[TP]["error"] == 0
        await rm.fetch(follower_fetch(2, 3))  # asked for, refused, backed off
        await asyncio.sleep(0.05)
        assert ctl.calls[-1] == (1, (1, 3, 2), "INELIGIBLE_REPLICA"), ctl.calls
        assert TP in rm._isr_backoff_until
        header = rq.ControlHeader(controller_id=100, controller_epoch=1, broker_epoch=-1)
        result = await rm.stop_replica(header, [rq.StopReplicaPartition(TP, -2, delete=True)])
        assert result["partitions"][0]["error"] == 0, result
        assert TP not in rm._isr_backoff_until and TP not in rm.partitions
    finally:
        await rm.shutdown()
        await lm.close()
