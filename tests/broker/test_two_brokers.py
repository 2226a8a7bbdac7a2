"""Two in-process brokers with the real fetcher: follower replication, ISR expansion, leader change."""

from __future__ import annotations

import asyncio

import aiohttp

from common.errors import ErrorCode
from common.http import RpcClient
from storage.record_batch import iter_batches
from tests.broker.conftest import TP, StartBroker, batch, fetch_body, part, produce_body
from tests.fake_controller import FakeController


async def wait_until(cond: object, timeout_s: float = 60.0) -> None:
    assert callable(cond)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_follower_replicates_and_acks_all_completes(start_broker: StartBroker, controller: FakeController,
                                                          rpc: RpcClient) -> None:
    b1 = await start_broker(1, sets={"min.insync.replicas": 2})
    b2 = await start_broker(2, sets={"min.insync.replicas": 2})
    await controller.elect(TP, leader=1, replicas=[1, 2], isr=[1])
    # the follower catches up and is added to the ISR through AlterPartition
    await rpc.call(b1.address, "produce", produce_body(batch(3)))
    await controller.wait_alter(1)
    assert b1.rm is not None and b2.rm is not None
    await wait_until(lambda: b1.rm is not None and b1.rm.partitions[TP].state.isr == (1, 2))
    r = part(await rpc.call(b1.address, "produce", produce_body(batch(2), acks=-1)))
    assert (r["error"], r["base_offset"]) == (0, 3)
    await wait_until(lambda: b2.rm is not None and b2.rm.partitions[TP].state.high_watermark == 5)
    leader_bytes = part(await rpc.call(b1.address, "fetch", fetch_body(0)))["records"]
    follower_log = b2.rm.partitions[TP].log
    assert follower_log.read(0, 1 << 20).records == leader_bytes

    # leadership moves to broker 2 (epoch 1); broker 1 follows; writes continue on 2 and reach 1
    await controller.elect(TP, leader=2, replicas=[1, 2], isr=[1, 2])
    assert part(await rpc.call(b1.address, "produce", produce_body(batch())))["error"] == \
        ErrorCode.NOT_LEADER_OR_FOLLOWER
    r = part(await rpc.call(b2.address, "produce", produce_body(batch(4), acks=-1)))
    assert (r["error"], r["base_offset"]) == (0, 5)
    await wait_until(lambda: b1.rm is not None and b1.rm.partitions[TP].log_end_offset == 9)
    data = b1.rm.partitions[TP].log.read(0, 1 << 20).records
    assert [(h.base_offset, h.partition_leader_epoch) for _, h in iter_batches(data)] == [(0, 0), (3, 0), (5, 1)]
    async with aiohttp.ClientSession() as s, s.get(f"http://{b1.address}/metrics") as resp:
        assert "minibroker_fetcher_requests_total" in await resp.text()  # the fetcher's series on /metrics


async def test_a_fenced_stop_replica_leaves_the_follower_fetching(start_broker: StartBroker,
                                                                  controller: FakeController,
                                                                  rpc: RpcClient) -> None:
    """Kafka's stopReplicas stops fetching only the partitions whose epoch check passed: a StopReplica
    refused with FENCED_LEADER_EPOCH (an older epoch, or the current one) must not stop replication."""
    b1 = await start_broker(1)
    b2 = await start_broker(2)
    await controller.elect(TP, leader=2, replicas=[2, 1])
    await controller.elect(TP, leader=2, replicas=[2, 1])  # leader epoch 1
    assert b1.rm is not None and b2.rm is not None
    for epoch in (0, 1):
        stale = await controller.send_stop_replica(b1.address, TP, leader_epoch=epoch)
        assert stale["partitions"][0]["error"] == ErrorCode.FENCED_LEADER_EPOCH
    r = part(await rpc.call(b2.address, "produce", produce_body(batch(4))))
    assert r["error"] == 0
    await wait_until(lambda: b1.rm is not None and b1.rm.partitions[TP].log_end_offset == 4)
