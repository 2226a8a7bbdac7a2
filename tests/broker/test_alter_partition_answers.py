"""The leader's waiting acks=all produces and its AlterPartition answers, one call at a time: a real
ReplicaManager over a real LogManager, with an AlterPartition sender (the interface ``ControllerLink``
implements) whose calls the test answers."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from broker import requests as rq
from broker.metadata_cache import MetadataCache
from broker.metrics import BrokerMetrics
from broker.replica_manager import AlterResult, ReplicaManager
from common.clock import SystemClock
from common.config import broker_config
from common.errors import ErrorCode
from common.wire import TopicPartition
from storage.log_manager import LogManager
from storage.record_batch import build_batch

TP = TopicPartition("t", 0)


class ScriptedSender:
    """Every AlterPartition waits until the test answers it."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, int, tuple[int, ...]], asyncio.Future[AlterResult]]] = []
        self.called = asyncio.Event()

    async def alter_partition(self, tp: TopicPartition, leader_epoch: int, partition_epoch: int,
                              new_isr: tuple[int, ...], broker_epochs: dict[int, int]) -> AlterResult:
        answer: asyncio.Future[AlterResult] = asyncio.get_running_loop().create_future()
        self.calls.append(((leader_epoch, partition_epoch, tuple(new_isr)), answer))
        self.called.set()
        return await answer

    async def wait_calls(self, n: int) -> None:
        async def enough() -> None:
            while len(self.calls) < n:
                self.called.clear()
                await self.called.wait()
        await asyncio.wait_for(enough(), 5)


def _lai(partition_epoch: int, isr: list[int], tp: TopicPartition = TP) -> rq.LeaderAndIsrRequest:
    return rq.parse_leader_and_isr({
        "controller_id": 100, "controller_epoch": 1, "broker_epoch": -1, "live_leaders": [],
        "partition_states": [{"topic": tp.topic, "partition": tp.partition, "leader": 1, "leader_epoch": 1,
                              "isr": isr, "partition_epoch": partition_epoch, "replicas": [1, 2]}]})


def _produce(acks: int, tps: tuple[TopicPartition, ...] = (TP,)) -> rq.ProduceRequest:
    records = build_batch([(None, b"v")] * 3, timestamp_ms=1_700_000_000_000)
    return rq.parse_produce({"acks": acks, "timeout_ms": 30_000, "topics": [
        {"topic": tp.topic, "partitions": [{"partition": tp.partition, "records": records}]} for tp in tps]})


async def _leader(tmp_path: Path) -> tuple[ReplicaManager, LogManager, ScriptedSender]:
    config = broker_config()
    lm = LogManager(tmp_path, config, SystemClock())
    await lm.load()
    rm = ReplicaManager(1, config, SystemClock(), lm, MetadataCache("c"), BrokerMetrics())
    lm.high_watermarks = rm.high_watermarks
    rm.broker_epoch = 5
    sender = ScriptedSender()
    rm.alter_sender = sender
    await rm.start()
    return rm, lm, sender


async def test_a_shutdown_answers_a_waiting_produce_with_what_is_already_committed(tmp_path: Path) -> None:
    """Graceful shutdown fails waiting acks=all produces with a retriable error, but only their partitions
    still waiting: one whose write the HW already passed stays NONE (else a client resends it: a duplicate
    without idempotence)."""
    rm, lm, _sender = await _leader(tmp_path)
    alone, waiting_tp = TopicPartition("t", 1), TP
    try:
        assert (await rm.leader_and_isr(_lai(1, [1], alone)))["partitions"][0]["error"] == 0
        assert (await rm.leader_and_isr(_lai(1, [1, 2], waiting_tp)))["partitions"][0]["error"] == 0
        produce = asyncio.ensure_future(rm.produce(_produce(acks=-1, tps=(alone, waiting_tp))))
        await asyncio.sleep(0.05)
        assert not produce.done()
        rm.stop_waiting()
        answer = await asyncio.wait_for(produce, 5)
        assert (answer[alone]["error"], answer[waiting_tp]["error"]) == (0, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        # one arriving after the stop began (a handler still running, a partition nobody could take over)
        late = await rm.produce(_produce(acks=-1, tps=(alone, waiting_tp)))
        assert (late[alone]["error"], late[waiting_tp]["error"]) == (0, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    finally:
        await rm.shutdown()
        await lm.close()


def _follower_fetch(offset: int, broker_epoch: int) -> rq.FetchRequest:
    return rq.parse_fetch({"replica_id": 2, "broker_epoch": broker_epoch, "max_wait_ms": 0, "min_bytes": 1,
                           "max_bytes": 1 << 20, "topics": [{"topic": TP.topic, "partitions": [{
                               "partition": 0, "fetch_offset": offset, "current_leader_epoch": 1,
                               "last_fetched_epoch": -1, "log_start_offset": 0,
                               "partition_max_bytes": 1 << 20}]}]})


async def test_an_old_answer_does_not_settle_a_later_equal_isr_change(tmp_path: Path) -> None:
    """The expansion to {1, 2} is asked twice: at partition epoch 1 (its answer lost, the controller applied it)
    and, after a LeaderAndIsr took 2 out again (epoch 3), at epoch 3. The first call's late resend is answered
    with the controller's state then ({1} at epoch 3); it must not settle the second change, whose answer is
    the controller committing {1, 2}: else the leader keeps ISR {1} and acknowledges acks=all writes that
    replica 2, in the controller's ISR and electable, does not have (invariant 1)."""
    rm, lm, sender = await _leader(tmp_path)
    try:
        assert (await rm.leader_and_isr(_lai(1, [1])))["partitions"][0]["error"] == 0
        assert (await rm.produce(_produce(acks=1)))[TP]["error"] == 0
        p = rm.partitions[TP]
        await rm.fetch(_follower_fetch(3, broker_epoch=7))  # caught up: expansion asked at partition epoch 1
        await sender.wait_calls(1)
        assert sender.calls[0][0] == (1, 1, (1, 2))
        sender.calls[0][1].set_result(AlterResult(ErrorCode.REQUEST_TIMED_OUT))  # outcome unknown: asked again
        await asyncio.sleep(0)
        assert (await rm.leader_and_isr(_lai(3, [1])))["partitions"][0]["error"] == 0  # 2 fenced meanwhile
        await rm.fetch(_follower_fetch(3, broker_epoch=9))  # 2 is back: the same expansion, at epoch 3
        await sender.wait_calls(2)
        assert sender.calls[1][0] == (1, 3, (1, 2))
        waiting: asyncio.Future[dict[TopicPartition, dict[str, Any]]] = asyncio.ensure_future(
            rm.produce(_produce(acks=-1)))
        await asyncio.sleep(0.3)  # past the first call's retry backoff (its resend, if it still made one)
        for _args, answer in sender.calls[2:]:  # a resend of the first change: the controller's state then
            answer.set_result(AlterResult(ErrorCode.INVALID_UPDATE_VERSION, 1, (1,), 3))
        await asyncio.sleep(0.05)
        assert p.state.pending is not None and not waiting.done(), "the HW still waits for replica 2"
        sender.calls[1][1].set_result(AlterResult(ErrorCode.NONE, 1, (1, 2), 4))
        await asyncio.sleep(0.05)
        assert (p.state.isr, p.state.partition_epoch) == ((1, 2), 4)
        assert not waiting.done() and p.state.high_watermark == 3, "acks=all waits for replica 2's fetch"
        await rm.fetch(_follower_fetch(6, broker_epoch=9))
        assert (await asyncio.wait_for(waiting, 5))[TP]["error"] == 0
    finally:
        await rm.shutdown()
        await lm.close()


async def test_an_alter_partition_without_a_definite_answer_is_asked_again_less_and_less_often(
        tmp_path: Path) -> None:
    """Answered NOT_LEADER_OR_FOLLOWER again and again (a controller that does not know this leader), the
    change was asked every 200 ms, a warning each, until a LeaderAndIsr came; now the wait doubles up to 1 s.
    Counted over 1.5 s: with the doubling at most 4 requests (0, 0.2, 0.6, 1.4 s), without it about 8 (a
    slower machine only makes fewer)."""
    rm, lm, sender = await _leader(tmp_path)
    try:
        await rm.update_metadata(rq.parse_update_metadata({
            "controller_id": 100, "controller_epoch": 1, "broker_epoch": -1,
            "brokers": [{"node_id": b, "host": "127.0.0.1", "port": 9000 + b} for b in (1, 2)]}))
        assert (await rm.leader_and_isr(_lai(1, [1])))["partitions"][0]["error"] == 0
        await rm.fetch(_follower_fetch(0, broker_epoch=7))  # caught up: expansion asked
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5
        answered = 0
        while loop.time() < end:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sender.wait_calls(answered + 1), max(0.01, end - loop.time()))
            for _, answer in sender.calls[answered:]:
                answer.set_result(AlterResult(ErrorCode.NOT_LEADER_OR_FOLLOWER))
            answered = len(sender.calls)
        assert 2 <= answered <= 5, answered
    finally:
        await rm.shutdown()
        await lm.close()
