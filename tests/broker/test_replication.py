"""Leader-side replication on a real in-process broker: the test is the controller (FakeController)
and the follower (it sends follower fetches over HTTP itself)."""

from __future__ import annotations

import asyncio

import pytest

from broker.requests import parse_fetch
from common.errors import ErrorCode
from common.http import RpcClient
from storage.record_batch import iter_batches
from tests.broker.conftest import TP, StartBroker, batch, fetch_body, part, produce_body
from tests.fake_controller import FakeController

FOLLOWER = 2
FOLLOWER_EPOCH = 500


@pytest.fixture(autouse=True)
def followers_are_live(controller: FakeController) -> None:
    """The followers these tests play are live brokers to the cluster: a leader adds only live brokers to the
    ISR (the metadata's live set, Kafka's isReplicaIsrEligible)."""
    controller.also_live = [FOLLOWER, 3]


async def follower_fetch(rpc: RpcClient, address: str, offset: int, **kw: object) -> dict[str, object]:
    return part(await rpc.call(address, "fetch", fetch_body(offset, replica_id=FOLLOWER,
                                                             broker_epoch=FOLLOWER_EPOCH, **kw)))  # type: ignore[arg-type]


async def wait_until(cond: object, timeout_s: float = 30.0) -> None:
    assert callable(cond)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_acks1_produce_then_consume(start_broker: StartBroker, controller: FakeController,
                                          rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1])
    r1 = part(await rpc.call(b.address, "produce", produce_body(batch(3))))
    r2 = part(await rpc.call(b.address, "produce", produce_body(batch(2))))
    assert (r1["error"], r1["base_offset"], r2["base_offset"]) == (0, 0, 3)
    f = part(await rpc.call(b.address, "fetch", fetch_body(0)))
    assert f["error"] == 0 and f["high_watermark"] == 5 and f["log_end_offset"] == 5
    headers = [h for _, h in iter_batches(f["records"])]
    assert [(h.base_offset, h.record_count, h.partition_leader_epoch) for h in headers] == [(0, 3, 0), (3, 2, 0)]


async def test_fetch_metrics_tell_followers_from_consumers(start_broker: StartBroker, controller: FakeController,
                                                          rpc: RpcClient) -> None:
    """Kafka's BytesOutPerSec counts client fetches only (followers': ReplicationBytesOutPerSec), and its request
    metrics count fetches as FetchConsumer and FetchFollower besides Fetch."""
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER])
    assert part(await rpc.call(b.address, "produce", produce_body(batch(3))))["error"] == 0
    replicated = len((await follower_fetch(rpc, b.address, 0))["records"])  # type: ignore[arg-type]
    await follower_fetch(rpc, b.address, 3)
    consumed = len(part(await rpc.call(b.address, "fetch", fetch_body(0)))["records"])
    assert replicated == consumed > 0
    metrics = await _metrics(b.address)
    assert f"minibroker_bytes_out_total {float(consumed)}" in metrics
    assert f"minibroker_replication_bytes_out_total {float(replicated)}" in metrics
    assert 'minibroker_requests_total{api="fetch",status="200"} 3.0' in metrics
    assert 'minibroker_requests_total{api="fetch_follower",status="200"} 2.0' in metrics
    assert 'minibroker_requests_total{api="fetch_consumer",status="200"} 1.0' in metrics
    assert 'minibroker_request_latency_seconds_count{api="fetch_consumer"} 1.0' in metrics


async def test_acks_all_waits_for_follower_fetch(start_broker: StartBroker, controller: FakeController,
                                                 rpc: RpcClient) -> None:
    b = await start_broker(sets={"min.insync.replicas": 2})
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER])
    produce = asyncio.create_task(rpc.call(b.address, "produce", produce_body(batch(4), acks=-1)))
    assert b.rm is not None
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].log_end_offset == 4)
    assert not produce.done()
    # a consumer sees nothing past the HW
    assert part(await rpc.call(b.address, "fetch", fetch_body(0)))["records"] == b""
    f = await follower_fetch(rpc, b.address, 0)
    assert f["error"] == 0 and f["records"] and f["high_watermark"] == 0
    assert not produce.done()
    f = await follower_fetch(rpc, b.address, 4)  # the follower's LEO is now 4: HW moves, produce completes
    assert f["high_watermark"] == 4
    r = part(await asyncio.wait_for(produce, 30))
    assert (r["error"], r["base_offset"]) == (0, 0)
    c = part(await rpc.call(b.address, "fetch", fetch_body(0)))
    assert c["high_watermark"] == 4 and [h.base_offset for _, h in iter_batches(c["records"])] == [0]


async def test_min_isr_refusal_appends_nothing(start_broker: StartBroker, controller: FakeController,
                                               rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER], isr=[1],
                           topic_configs={TP.topic: {"min.insync.replicas": "2"}})
    r = part(await rpc.call(b.address, "produce", produce_body(batch(), acks=-1)))
    assert r["error"] == ErrorCode.NOT_ENOUGH_REPLICAS
    assert b.rm is not None and b.rm.partitions[TP].log_end_offset == 0
    r = part(await rpc.call(b.address, "produce", produce_body(batch(), acks=1)))
    assert r["error"] == 0


async def test_the_brokers_min_isr_applies_to_a_topic_without_its_own(start_broker: StartBroker,
                                                                     controller: FakeController,
                                                                     rpc: RpcClient) -> None:
    # Kafka's broker-wide min.insync.replicas is every topic's default (the controller once copied its own
    # default, 1, into each new topic, and the brokers' setting changed nothing)
    b = await start_broker(sets={"min.insync.replicas": 2})
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER], isr=[1])
    r = part(await rpc.call(b.address, "produce", produce_body(batch(), acks=-1)))
    assert r["error"] == ErrorCode.NOT_ENOUGH_REPLICAS


async def test_delayed_produce_fails_when_leader_epoch_changes(start_broker: StartBroker,
                                                               controller: FakeController, rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER])
    produce = asyncio.create_task(rpc.call(b.address, "produce", produce_body(batch(), acks=-1)))
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].log_end_offset == 3)
    await controller.elect(TP, leader=FOLLOWER, replicas=[1, FOLLOWER])  # broker 1 becomes a follower
    r = part(await asyncio.wait_for(produce, 30))
    assert r["error"] == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_delayed_produce_times_out(start_broker: StartBroker, controller: FakeController,
                                         rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER])
    r = part(await rpc.call(b.address, "produce", produce_body(batch(), acks=-1, timeout_ms=100)))
    assert r["error"] == ErrorCode.REQUEST_TIMED_OUT


async def test_long_poll_woken_by_append_and_hw(start_broker: StartBroker, controller: FakeController,
                                                rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER])
    follower = asyncio.create_task(follower_fetch(rpc, b.address, 0, max_wait_ms=120_000))
    consumer = asyncio.create_task(rpc.call(b.address, "fetch", fetch_body(0, max_wait_ms=120_000)))
    await wait_until(lambda: b.rm is not None and len(b.rm.fetch_purgatory) == 2)
    await rpc.call(b.address, "produce", produce_body(batch(2)))
    f = await asyncio.wait_for(follower, 30)  # woken by the append
    assert f["records"] and f["log_end_offset"] == 2
    assert not consumer.done()
    await follower_fetch(rpc, b.address, 2)  # HW moves to 2 -> the consumer is woken
    c = part(await asyncio.wait_for(consumer, 30))
    assert c["high_watermark"] == 2 and c["records"]


async def test_waiting_requests_expire_on_their_own_timer(start_broker: StartBroker, controller: FakeController,
                                                           rpc: RpcClient) -> None:
    """A long poll with nothing to read answers empty after max_wait_ms, an acks=all produce nobody
    replicates times out, and neither stays in its purgatory."""
    b = await start_broker(sets={"min.insync.replicas": 2})
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER])
    assert b.rm is not None
    f = part(await rpc.call(b.address, "fetch", fetch_body(0, max_wait_ms=150)))
    assert (f["error"], f["records"]) == (0, b"")
    r = part(await rpc.call(b.address, "produce", produce_body(batch(), acks=-1, timeout_ms=150)))
    assert r["error"] == ErrorCode.REQUEST_TIMED_OUT
    assert len(b.rm.fetch_purgatory) == 0 and len(b.rm.produce_purgatory) == 0


async def test_a_waiting_fetch_whose_requester_went_away_leaves_the_purgatory(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER])
    rm = b.rm
    assert rm is not None
    waiting = asyncio.create_task(rm.fetch(parse_fetch(fetch_body(0, max_wait_ms=120_000))))
    await wait_until(lambda: len(rm.fetch_purgatory) == 1)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert len(rm.fetch_purgatory) == 0
    assert part(await rpc.call(b.address, "produce", produce_body(batch(2))))["error"] == 0  # wakes nobody


async def test_isr_expand_and_shrink_through_alter_partition(start_broker: StartBroker,
                                                             controller: FakeController, rpc: RpcClient) -> None:
    b = await start_broker(sets={"replica.lag.time.max.ms": 300, "replica.fetch.wait.max.ms": 100})
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER], isr=[1])
    await rpc.call(b.address, "produce", produce_body(batch(2)))
    await follower_fetch(rpc, b.address, 0)
    await follower_fetch(rpc, b.address, 2)  # caught up: expansion requested
    reqs = await controller.wait_alter(1)
    p = reqs[0]["topics"][0]["partitions"][0]
    assert p["new_isr"] == [1, FOLLOWER] and p["leader_epoch"] == 0
    assert {"broker_id": FOLLOWER, "broker_epoch": FOLLOWER_EPOCH} in p["new_isr_broker_epochs"]
    assert b.rm is not None
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].state.isr == (1, FOLLOWER))
    # the follower stops fetching while the leader appends: shrink after replica.lag.time.max.ms
    produce = asyncio.create_task(rpc.call(b.address, "produce", produce_body(batch(), acks=-1)))
    reqs = await controller.wait_alter(2)
    assert reqs[1]["topics"][0]["partitions"][0]["new_isr"] == [1]
    r = part(await asyncio.wait_for(produce, 30))  # after the shrink commits, HW = LEO
    assert r["error"] == 0
    status = await rpc.get_json(b.address, "/v1/status")
    sp = status["partitions"][0]
    assert sp["isr"] == [1] and sp["high_watermark"] == 5 and sp["role"] == "leader"
    metrics = await _metrics(b.address)
    assert "minibroker_isr_shrinks_total 1.0" in metrics and "minibroker_isr_expands_total 1.0" in metrics


async def test_shrink_not_applied_until_committed(start_broker: StartBroker, controller: FakeController,
                                                  rpc: RpcClient) -> None:
    b = await start_broker(sets={"replica.lag.time.max.ms": 200, "replica.fetch.wait.max.ms": 100})
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER])
    controller.hold_alter.clear()
    await rpc.call(b.address, "produce", produce_body(batch()))
    await controller.wait_alter(1)
    assert b.rm is not None
    st = b.rm.partitions[TP].state
    assert st.isr == (1, FOLLOWER) and st.pending is not None and st.high_watermark == 0
    controller.reject_alter = ErrorCode.INVALID_UPDATE_VERSION
    controller.hold_alter.set()
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].state.pending is None)
    assert b.rm.partitions[TP].state.isr == (1, FOLLOWER)


async def test_a_lost_alter_partition_answer_is_asked_again_not_taken_as_a_refusal(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    # The controller applies the expansion but its answer is lost. The leader used to take the resend's
    # INVALID_UPDATE_VERSION as a refusal and drop the follower from its maximal ISR while the controller
    # counted it in the ISR: acks=all writes were then acknowledged past the follower's log end, and the
    # controller could elect that follower.
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER], isr=[1])
    await rpc.call(b.address, "produce", produce_body(batch(5)))
    controller.lose_alter_answers = 1
    await follower_fetch(rpc, b.address, 0)
    await follower_fetch(rpc, b.address, 5)  # caught up: expansion requested, applied, answer lost
    assert b.rm is not None
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].state.isr == (1, FOLLOWER))
    st = b.rm.partitions[TP].state
    assert st.pending is None and st.partition_epoch == controller.partitions[TP].partition_epoch
    assert len(controller.alter_requests) == 2  # the same change, asked again
    produce = asyncio.create_task(rpc.call(b.address, "produce", produce_body(batch(3), acks=-1)))
    await asyncio.sleep(0.3)
    assert not produce.done()  # waits for the follower the controller counts in the ISR
    assert (await follower_fetch(rpc, b.address, 5))["high_watermark"] == 5
    await follower_fetch(rpc, b.address, 8)
    assert part(await asyncio.wait_for(produce, 30))["error"] == 0


async def test_an_alter_partition_that_may_have_been_applied_keeps_its_replicas_in_the_maximal_isr(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    # An AlterPartition that ends without an answer (here the controller refuses it with an error that says
    # nothing of the change, then accepts it) keeps the addition pending, so it still holds the HW.
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER], isr=[1])
    await rpc.call(b.address, "produce", produce_body(batch(5)))
    controller.reject_alter = ErrorCode.REQUEST_TIMED_OUT
    await follower_fetch(rpc, b.address, 0)
    await follower_fetch(rpc, b.address, 5)
    await controller.wait_alter(2)  # asked again after the first answer
    assert b.rm is not None
    st = b.rm.partitions[TP].state
    assert st.isr == (1,) and st.pending is not None and FOLLOWER in st.pending.new_isr
    await rpc.call(b.address, "produce", produce_body(batch(3)))
    assert (await follower_fetch(rpc, b.address, 5))["high_watermark"] == 5  # the pending addition counts
    controller.reject_alter = None
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].state.isr == (1, FOLLOWER))


async def test_invalid_update_version_hands_the_leader_the_committed_isr(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    # The controller's ISR moved past the leader's (its expansion applied, the answer lost): the refusal
    # carries the committed state, which the leader takes, as it would a LeaderAndIsr at its leader epoch.
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER], isr=[1])
    await rpc.call(b.address, "produce", produce_body(batch(5)))
    committed = controller.partitions[TP]
    committed.isr, committed.partition_epoch = [1, FOLLOWER], committed.partition_epoch + 1
    controller.reject_alter = ErrorCode.INVALID_UPDATE_VERSION
    await follower_fetch(rpc, b.address, 0)
    await follower_fetch(rpc, b.address, 5)  # caught up: expansion requested, refused with the new state
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].state.isr == (1, FOLLOWER))
    assert b.rm is not None
    st = b.rm.partitions[TP].state
    assert st.pending is None and st.partition_epoch == committed.partition_epoch


async def _metrics(address: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(f"http://{address}/metrics") as resp:
        return await resp.text()


async def test_pending_expansion_counts_toward_hw_one_request_in_flight(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER], isr=[1])
    await rpc.call(b.address, "produce", produce_body(batch(5)))
    controller.hold_alter.clear()
    await follower_fetch(rpc, b.address, 0)
    await follower_fetch(rpc, b.address, 5)  # caught up: expansion requested, answer held
    await controller.wait_alter(1)
    await rpc.call(b.address, "produce", produce_body(batch(3)))
    for _ in range(5):
        f = await follower_fetch(rpc, b.address, 5)
        assert f["high_watermark"] == 5  # the pending addition holds the HW (maximal ISR)
    assert len(controller.alter_requests) == 1  # one AlterPartition in flight per partition
    assert b.rm is not None and b.rm.partitions[TP].state.isr == (1,)  # not applied until accepted
    controller.hold_alter.set()
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].state.isr == (1, FOLLOWER))
    assert (await follower_fetch(rpc, b.address, 8))["high_watermark"] == 8


async def test_consumer_above_hw_long_polls(start_broker: StartBroker, controller: FakeController,
                                            rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER])
    await rpc.call(b.address, "produce", produce_body(batch(3)))
    await rpc.call(b.address, "produce", produce_body(batch(3)))
    # the consumer asks for offset 3 while the HW is 0 (follower has not fetched): it waits
    consumer = asyncio.create_task(rpc.call(b.address, "fetch", fetch_body(3, max_wait_ms=120_000)))
    await wait_until(lambda: b.rm is not None and len(b.rm.fetch_purgatory) == 1)
    await follower_fetch(rpc, b.address, 3)  # HW 3: still nothing at offset >= 3 below the HW
    assert not consumer.done()
    await follower_fetch(rpc, b.address, 6)
    c = part(await asyncio.wait_for(consumer, 30))
    assert c["high_watermark"] == 6 and [h.base_offset for _, h in iter_batches(c["records"])] == [3]


async def _isr_metrics(address: str) -> tuple[str, str]:
    lines = (await _metrics(address)).splitlines()
    expands = next(line for line in lines if line.startswith("minibroker_isr_expands_total "))
    shrinks = next(line for line in lines if line.startswith("minibroker_isr_shrinks_total "))
    return expands.split()[1], shrinks.split()[1]


async def test_an_expansion_answered_with_a_smaller_committed_isr_is_not_counted_as_a_shrink(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    # Kafka (Partition.handleAlterPartitionUpdate) counts an expansion or a shrink by the change the leader
    # asked for, once committed. Here the leader asks to add the follower, and the controller, which has
    # moved on (ISR [1] at a newer partition epoch), answers INVALID_UPDATE_VERSION with that: the leader
    # takes the smaller ISR, but it shrank nothing itself and its expansion did not commit.
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER, 3], isr=[1, 3])
    await rpc.call(b.address, "produce", produce_body(batch(5)))
    committed = controller.partitions[TP]
    committed.isr, committed.partition_epoch = [1], committed.partition_epoch + 1
    controller.reject_alter = ErrorCode.INVALID_UPDATE_VERSION
    await follower_fetch(rpc, b.address, 0)  # FOLLOWER is at the HW: expansion asked
    reqs = await controller.wait_alter(1)
    assert reqs[0]["topics"][0]["partitions"][0]["new_isr"] == [1, 3, FOLLOWER]
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].state.isr == (1,))
    assert b.rm is not None and b.rm.partitions[TP].state.partition_epoch == committed.partition_epoch
    assert await _isr_metrics(b.address) == ("0.0", "0.0")


async def test_a_shrink_answered_with_a_larger_committed_isr_is_not_counted_as_an_expansion(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    b = await start_broker(sets={"replica.lag.time.max.ms": 200, "replica.fetch.wait.max.ms": 100})
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER, 3], isr=[1, FOLLOWER])
    committed = controller.partitions[TP]
    committed.isr, committed.partition_epoch = [1, FOLLOWER, 3], committed.partition_epoch + 1
    controller.reject_alter = ErrorCode.INVALID_UPDATE_VERSION
    await rpc.call(b.address, "produce", produce_body(batch(5)))  # FOLLOWER falls behind: shrink asked
    reqs = await controller.wait_alter(1)
    assert reqs[0]["topics"][0]["partitions"][0]["new_isr"] == [1]
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].state.isr == (1, FOLLOWER, 3))
    assert await _isr_metrics(b.address) == ("0.0", "0.0")


async def test_a_change_committed_before_its_answer_was_lost_is_counted_by_its_kind(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    # The expansion was applied and its answer lost; the controller answers the resend INVALID_UPDATE_VERSION
    # with the very ISR asked for: that is our expansion, committed.
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, FOLLOWER], isr=[1])
    await rpc.call(b.address, "produce", produce_body(batch(5)))
    committed = controller.partitions[TP]
    committed.isr, committed.partition_epoch = [FOLLOWER, 1], committed.partition_epoch + 1
    controller.reject_alter = ErrorCode.INVALID_UPDATE_VERSION
    await follower_fetch(rpc, b.address, 0)
    await follower_fetch(rpc, b.address, 5)
    await wait_until(lambda: b.rm is not None and b.rm.partitions[TP].state.isr == (FOLLOWER, 1))
    assert await _isr_metrics(b.address) == ("1.0", "0.0")


async def test_an_isr_change_is_sent_with_the_partition_epoch_it_was_decided_on(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    # Found by review: the AlterPartition task read the partition's state when it first ran. A LeaderAndIsr
    # handled before that (same leader epoch, a newer partition epoch: the controller took broker 2 out of the
    # ISR) cleared the pending expansion, and the task then sent that expansion, computed from the old ISR
    # [1, 2], at the new partition epoch: the controller applied ISR [1, 2, 3] while the leader kept [1]
    # and advanced the HW past broker 2, an ISR member to the controller.
    from broker.requests import parse_leader_and_isr

    b = await start_broker()
    assert b.rm is not None
    rm = b.rm
    fp = await controller.elect(TP, leader=1, replicas=[1, FOLLOWER, 3], isr=[1, FOLLOWER])
    assert part(await rpc.call(b.address, "produce", produce_body(batch(3))))["error"] == 0
    await follower_fetch(rpc, b.address, 3)
    part(await rpc.call(b.address, "fetch", fetch_body(0, replica_id=3, broker_epoch=600)))
    controller.hold_alter.clear()
    # in one event-loop step: broker 3's fetch at the end (an expansion to [1, 2, 3] is decided) and the
    # controller's LeaderAndIsr shrinking the ISR to [1] at partition epoch 1
    await rm.fetch(parse_fetch(fetch_body(3, replica_id=3, broker_epoch=600)))
    assert rm.partitions[TP].state.pending is not None
    fp.isr = [1]
    fp.partition_epoch += 1
    await rm.leader_and_isr(parse_leader_and_isr({
        "controller_id": controller.controller_id, "controller_epoch": controller.controller_epoch,
        "broker_epoch": -1, "partition_states": [fp.state(TP)], "live_leaders": controller.broker_list(),
        "topic_configs": {}}))
    sent = (await controller.wait_alter(1))[0]["topics"][0]["partitions"][0]
    assert sent["new_isr"] == [1, FOLLOWER, 3] and sent["partition_epoch"] == 0
    controller.hold_alter.set()
    await asyncio.sleep(0.3)  # the answer (INVALID_UPDATE_VERSION) reaches the leader, which ignores it
    assert fp.isr == [1] and fp.partition_epoch == 1
    assert rm.partitions[TP].state.isr == (1,)
