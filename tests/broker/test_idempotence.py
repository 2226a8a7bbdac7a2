"""The idempotent producer on real in-process brokers (FakeController): deduplicated produce, refusals,
init_producer_id, and a retry deduplicated by a new leader."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from broker.producer_ids import ProducerIdBlock, ProducerIdManager
from common.clock import ManualClock
from common.errors import ErrorCode
from common.http import RpcBadRequest, RpcClient
from common.wire import encode
from storage.record_batch import build_batch, iter_batches
from tests.broker.conftest import TP, StartBroker, batch, part, produce_body
from tests.broker.test_replication import follower_fetch, wait_until
from tests.fake_controller import FakeController

PID = 3000


def ibatch(seq: int, n: int = 3, *, pid: int = PID, epoch: int = 0) -> bytes:
    return build_batch([(None, b"v%d" % (seq + i)) for i in range(n)], timestamp_ms=1_700_000_000_000,
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def log_batches(proc: Any) -> list[tuple[int, int, int]]:
    """(base_offset, producer_id, base_sequence) of every batch in the broker's log of TP."""
    the_log = proc.rm.partitions[TP].log
    data = the_log.read(0, 1 << 24).records
    return [(h.base_offset, h.producer_id, h.base_sequence) for _, h in iter_batches(data)]


async def init_producer_id(rpc: RpcClient, address: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """init_producer_id, retried while the broker has no block yet (COORDINATOR_LOAD_IN_PROGRESS)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        resp = await rpc.call(address, "init_producer_id", {"transactional_id": None, "transaction_timeout_ms": 60000,
                                                            "producer_id": -1, "producer_epoch": -1})
        if resp["error"] != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return resp
        assert asyncio.get_running_loop().time() < deadline, "no producer id"
        await asyncio.sleep(0.02)


async def test_the_same_idempotent_batch_twice_is_appended_once(start_broker: StartBroker,
                                                                 controller: FakeController, rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1])
    await rpc.call(b.address, "produce", produce_body(batch(2)))
    first = part(await rpc.call(b.address, "produce", produce_body(ibatch(0))))
    await rpc.call(b.address, "produce", produce_body(batch(1)))
    assert b.rm is not None
    counted = b.rm.metrics.bytes_in
    again = part(await rpc.call(b.address, "produce", produce_body(ibatch(0))))
    assert b.rm.metrics.bytes_in == counted  # a duplicate appends (and counts) nothing
    assert (first["error"], first["base_offset"]) == (0, 2)
    assert (again["error"], again["base_offset"]) == (0, 2)
    assert log_batches(b) == [(0, -1, -1), (2, PID, 0), (5, -1, -1)]
    # the next batch is appended; non-idempotent batches are never deduplicated
    assert part(await rpc.call(b.address, "produce", produce_body(ibatch(3))))["base_offset"] == 6
    assert part(await rpc.call(b.address, "produce", produce_body(batch(2))))["base_offset"] == 9
    assert part(await rpc.call(b.address, "produce", produce_body(batch(2))))["base_offset"] == 11


async def test_an_acks_all_duplicate_is_answered_only_once_committed(start_broker: StartBroker,
                                                                     controller: FakeController,
                                                                     rpc: RpcClient) -> None:
    b = await start_broker(sets={"min.insync.replicas": 2})
    await controller.elect(TP, leader=1, replicas=[1, 2])
    first = asyncio.create_task(rpc.call(b.address, "produce", produce_body(ibatch(0), acks=-1)))
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].log_end_offset == 3)
    retry = asyncio.create_task(rpc.call(b.address, "produce", produce_body(ibatch(0), acks=-1)))
    await asyncio.sleep(0.2)
    assert not first.done() and not retry.done()  # the original batch is not committed yet
    assert b.rm is not None and b.rm.partitions[TP].log_end_offset == 3
    await follower_fetch(rpc, b.address, 0)
    f = await follower_fetch(rpc, b.address, 3)  # the follower has it: HW 3
    assert f["high_watermark"] == 3
    r1, r2 = part(await asyncio.wait_for(first, 30)), part(await asyncio.wait_for(retry, 30))
    assert (r1["error"], r1["base_offset"]) == (r2["error"], r2["base_offset"]) == (0, 0)
    # once committed, a duplicate is answered at once
    r3 = part(await rpc.call(b.address, "produce", produce_body(ibatch(0), acks=-1)))
    assert (r3["error"], r3["base_offset"]) == (0, 0)
    assert log_batches(b) == [(0, PID, 0)]


async def test_out_of_order_and_fenced_epochs_are_refused_with_nothing_appended(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1])
    assert part(await rpc.call(b.address, "produce", produce_body(ibatch(0, epoch=1))))["error"] == 0
    gap = part(await rpc.call(b.address, "produce", produce_body(ibatch(5, epoch=1))))
    assert (gap["error"], gap["base_offset"]) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    fenced = part(await rpc.call(b.address, "produce", produce_body(ibatch(3, epoch=0))))
    assert fenced["error"] == ErrorCode.INVALID_PRODUCER_EPOCH
    new_epoch_not_at_zero = part(await rpc.call(b.address, "produce", produce_body(ibatch(3, epoch=2))))
    assert new_epoch_not_at_zero["error"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    two = ibatch(3, epoch=1) + ibatch(7, epoch=1)  # good, then a gap: one unit, nothing appended
    assert part(await rpc.call(b.address, "produce", produce_body(two)))["error"] == \
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log_batches(b) == [(0, PID, 0)]
    assert part(await rpc.call(b.address, "produce", produce_body(ibatch(3, epoch=1))))["base_offset"] == 3


async def test_init_producer_id_hands_out_distinct_ids(start_broker: StartBroker, controller: FakeController,
                                                       rpc: RpcClient) -> None:
    controller.producer_id_block_len = 4  # several blocks, so prefetching and block switches are exercised
    b1 = await start_broker(1)
    b2 = await start_broker(2)
    ids = []
    for i in range(20):
        resp = await init_producer_id(rpc, (b1, b2)[i % 2].address)
        assert resp["error"] == 0 and resp["producer_epoch"] == 0
        ids.append(resp["producer_id"])
    assert len(set(ids)) == 20 and min(ids) >= 0
    assert all(r["broker_epoch"] == controller.brokers[r["broker_id"]].broker_epoch
               for r in controller.producer_id_requests)


async def test_init_producer_id_waits_for_a_block(start_broker: StartBroker, controller: FakeController,
                                                  rpc: RpcClient) -> None:
    controller.refuse_producer_ids = True
    b = await start_broker()
    resp = await rpc.call(b.address, "init_producer_id", {"transactional_id": None})
    assert (resp["error"], resp["producer_id"]) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, -1)
    controller.refuse_producer_ids = False
    assert (await init_producer_id(rpc, b.address))["producer_id"] == 0


@pytest.mark.parametrize("body", [
    {"transactional_id": "tx-1", "producer_id": -1, "producer_epoch": -1},
    {"transactional_id": 5},
    {"transactional_id": None, "producer_id": "7"},
    {"transactional_id": None, "producer_epoch": True},
    {"transactional_id": None, "producer_epoch": 70000},
    {"transactional_id": None, "transaction_timeout_ms": 1.5},
])
async def test_a_bad_init_producer_id_body_is_400(start_broker: StartBroker, controller: FakeController,
                                                  rpc: RpcClient, body: dict[str, Any]) -> None:
    b = await start_broker()
    with pytest.raises(RpcBadRequest):
        await rpc.call(b.address, "init_producer_id", body)
    async with aiohttp.ClientSession() as s, s.post(f"http://{b.address}/v1/init_producer_id",
                                                    data=encode([1, 2])) as resp:
        assert resp.status == 400 and "init_producer_id" in await resp.text()


async def test_a_new_leader_deduplicates_a_retry_of_its_predecessors_batch(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    b1 = await start_broker(1)
    b2 = await start_broker(2)
    await controller.elect(TP, leader=1, replicas=[1, 2], isr=[1, 2])
    await rpc.call(b1.address, "produce", produce_body(batch(2)))
    r = part(await rpc.call(b1.address, "produce", produce_body(ibatch(0) + ibatch(3, 2), acks=-1)))
    assert (r["error"], r["base_offset"]) == (0, 2)  # committed: the follower has it
    await wait_until(lambda: b2.rm is not None and b2.rm.partitions[TP].log_end_offset == 7)
    await controller.elect(TP, leader=2, replicas=[1, 2], isr=[1, 2])
    # the producer did not hear the answer and retries the same two batches on the new leader
    retry = part(await rpc.call(b2.address, "produce", produce_body(ibatch(0) + ibatch(3, 2), acks=-1)))
    assert (retry["error"], retry["base_offset"]) == (0, 2)
    assert log_batches(b2) == [(0, -1, -1), (2, PID, 0), (5, PID, 3)]
    nxt = part(await rpc.call(b2.address, "produce", produce_body(ibatch(5), acks=-1)))
    assert (nxt["error"], nxt["base_offset"]) == (0, 7)
    await wait_until(lambda: b1.rm is not None and b1.rm.partitions[TP].log_end_offset == 10)
    assert log_batches(b1) == log_batches(b2)


async def test_a_retry_of_a_batch_that_retention_deleted_is_still_a_duplicate(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    """The producer's only batch, then other traffic until retention deletes it; then the retry of that batch
    (its answer was lost) is answered with its original offset and appended nowhere."""
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1],
                           topic_configs={"t": {"segment.bytes": 1024, "retention.bytes": 1024,
                                                "retention.ms": -1}})  # by size only: old timestamps
    first = part(await rpc.call(b.address, "produce", produce_body(ibatch(0), acks=-1)))
    assert (first["error"], first["base_offset"]) == (0, 0)
    for _ in range(30):
        part(await rpc.call(b.address, "produce", produce_body(batch(3, size=60), acks=-1)))
    assert b.rm is not None
    assert b.rm.log_manager.run_retention() > 0
    the_log = b.rm.partitions[TP].log
    assert the_log.log_start_offset > 0
    leo = the_log.log_end_offset
    retry = part(await rpc.call(b.address, "produce", produce_body(ibatch(0), acks=-1)))
    assert (retry["error"], retry["base_offset"]) == (0, 0)
    assert the_log.log_end_offset == leo
    offset, producers = the_log.log_start_offset, set()
    while offset < leo:  # every segment: the idempotent batch is nowhere in the log now
        for _, h in iter_batches(the_log.read(offset, 1 << 24).records):
            producers.add(h.producer_id)
            offset = h.base_offset + h.last_offset_delta + 1
    assert producers == {-1}


# ---- the producer-id manager alone ------------------------------------------------------------------------

async def test_the_manager_prefetches_the_next_block_before_the_current_one_runs_out() -> None:
    starts = iter([0, 10, 5, 20])  # the third block (5) is not monotonic: refused
    fetched: list[int] = []

    async def fetch() -> ProducerIdBlock | None:
        start = next(starts)
        fetched.append(start)
        return ProducerIdBlock(start, 10)

    clock = ManualClock(0)
    m = ProducerIdManager(fetch, clock, retry_backoff_ms=100)
    assert m.generate() is None  # no block yet: the call starts a fetch
    await asyncio.sleep(0)
    assert [m.generate() for _ in range(9)] == list(range(9))
    await asyncio.sleep(0)  # 90% used: the next block was asked for
    assert fetched == [0, 10]
    assert [m.generate() for _ in range(11)] == [9, *range(10, 20)]
    await asyncio.sleep(0)  # the prefetch got 5..15: refused, backed off
    assert fetched == [0, 10, 5]
    assert m.generate() is None  # exhausted; still backing off
    await asyncio.sleep(0)
    assert fetched == [0, 10, 5]
    clock.advance(100)
    assert m.generate() is None
    await asyncio.sleep(0)
    assert m.generate() == 20
    await m.close()

