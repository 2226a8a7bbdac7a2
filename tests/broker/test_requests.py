"""Fencing, offsets APIs, control requests and bad input on a real in-process broker."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import aiohttp
import msgpack
import pytest

from client import Consumer, Producer
from common.errors import ErrorCode, MinibrokerError
from common.http import RpcBadRequest, RpcClient
from common.wire import TopicPartition, encode
from storage.record_batch import HEADER_SIZE, TIMESTAMP_TYPE_BIT, compute_crc, validate_batches
from tests.broker.conftest import TP, StartBroker, batch, fetch_body, part, produce_body
from tests.fake_controller import FakeController
from tests.idle_connections import assert_idle_connections_are_closed


async def leader_broker(start_broker: StartBroker, controller: FakeController, **kw: Any) -> str:
    b = await start_broker(**kw)
    await controller.elect(TP, leader=1, replicas=[1])
    return b.address


async def test_fetch_fencing_by_leader_epoch(start_broker: StartBroker, controller: FakeController,
                                             rpc: RpcClient) -> None:
    addr = await leader_broker(start_broker, controller)
    await controller.elect(TP, leader=1, replicas=[1])  # leader epoch 1
    await rpc.call(addr, "produce", produce_body(batch()))
    assert part(await rpc.call(addr, "fetch", fetch_body(0, current_leader_epoch=0)))["error"] == \
        ErrorCode.FENCED_LEADER_EPOCH
    assert part(await rpc.call(addr, "fetch", fetch_body(0, current_leader_epoch=2)))["error"] == \
        ErrorCode.UNKNOWN_LEADER_EPOCH
    assert part(await rpc.call(addr, "fetch", fetch_body(0, current_leader_epoch=1)))["error"] == 0


async def test_stale_controller_epoch_and_stale_partition_epoch(start_broker: StartBroker,
                                                                controller: FakeController, rpc: RpcClient) -> None:
    addr = await leader_broker(start_broker, controller)
    controller.controller_epoch = 3
    p = await controller.elect(TP, leader=1, replicas=[1])
    old = await controller.send_leader_and_isr(addr, [p.state(TP)], controller_epoch=2)
    assert old["error"] == ErrorCode.STALE_CONTROLLER_EPOCH
    same = await controller.send_leader_and_isr(addr, [p.state(TP)])
    assert same["partitions"][0]["error"] == ErrorCode.STALE_CONTROLLER_EPOCH  # leader epoch not newer
    um = await rpc.call(addr, "update_metadata", {"controller_id": 1, "controller_epoch": 1, "brokers": []})
    assert um["error"] == ErrorCode.STALE_CONTROLLER_EPOCH


async def test_leader_and_isr_for_an_older_broker_epoch_is_refused(start_broker: StartBroker,
                                                                   controller: FakeController,
                                                                   rpc: RpcClient) -> None:
    """Orders carrying an older broker epoch were meant for a previous incarnation of this broker: not obeyed."""
    b = await start_broker()
    assert b.rm is not None and b.rm.broker_epoch > 0
    state = {"topic": TP.topic, "partition": TP.partition, "leader": 1, "leader_epoch": 0, "isr": [1],
             "partition_epoch": 0, "replicas": [1], "is_new": True}
    old = await controller.send_leader_and_isr(b.address, [state], broker_epoch=b.rm.broker_epoch - 1)
    assert old["error"] == ErrorCode.STALE_BROKER_EPOCH
    assert b.rm.partitions == {}
    assert part(await rpc.call(b.address, "produce", produce_body(batch())))["error"] != 0
    current = await controller.send_leader_and_isr(b.address, [state], broker_epoch=b.rm.broker_epoch)
    assert current["error"] == 0
    assert part(await rpc.call(b.address, "produce", produce_body(batch())))["error"] == 0


async def test_a_stale_leader_and_isr_leaves_the_metadata_clients_see(start_broker: StartBroker,
                                                                      controller: FakeController,
                                                                      rpc: RpcClient) -> None:
    addr = await leader_broker(start_broker, controller)
    older = (await controller.elect(TP, leader=1, replicas=[1])).state(TP)
    await controller.elect(TP, leader=1, replicas=[1])
    late = await controller.send_leader_and_isr(addr, [{**older, "leader": 2, "replicas": [1, 2], "isr": [2]}])
    assert late["partitions"][0]["error"] == ErrorCode.STALE_CONTROLLER_EPOCH
    md = await rpc.call(addr, "metadata", {"topics": [TP.topic]})
    p = md["topics"][0]["partitions"][0]
    assert (p["leader"], p["leader_epoch"]) == (1, controller.partitions[TP].leader_epoch)


async def test_leader_and_isr_naming_a_leader_without_an_epoch_is_refused_whole(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    """Leader epoch -1 with a named leader used to fail half-way (UNKNOWN_SERVER_ERROR, the partition
    created without a role, later partitions unapplied)."""
    b = await start_broker()
    good = {"topic": "y", "partition": 0, "leader": 1, "leader_epoch": 0, "isr": [1], "partition_epoch": 0,
            "replicas": [1]}
    bad = {**good, "topic": "x", "leader_epoch": -1}
    with pytest.raises(RpcBadRequest, match="leader epoch"):
        await controller.send_leader_and_isr(b.address, [bad, good])
    assert b.rm is not None and b.rm.partitions == {}
    assert sorted(p.name for p in b.opts.data_dir.iterdir() if p.is_dir()) == []


async def test_a_bad_topic_config_refuses_the_control_request_whole(start_broker: StartBroker,
                                                                     controller: FakeController,
                                                                     rpc: RpcClient) -> None:
    """An unparsable topic config (inf, 1.5, beyond int64) is a 400 before anything is applied: once it
    surfaced as an OverflowError after the controller epoch and the metadata cache had been updated."""
    addr = await leader_broker(start_broker, controller)
    p = await controller.elect(TP, leader=1, replicas=[1])
    for bad in (float("inf"), 1.5, 2**64 - 1):
        with pytest.raises(RpcBadRequest, match=r"retention\.ms"):
            await controller.send_leader_and_isr(addr, [p.state(TP)], controller_epoch=controller.controller_epoch + 5,
                                                 topic_configs={TP.topic: {"retention.ms": bad}})
        with pytest.raises(RpcBadRequest, match=r"segment\.bytes"):
            await rpc.call(addr, "update_metadata", {
                "controller_id": 1, "controller_epoch": controller.controller_epoch + 5, "brokers": [],
                "topic_configs": {TP.topic: {"segment.bytes": bad}}})
    # the higher controller epoch was not taken: the real controller's requests still apply
    assert (await controller.send_update_metadata(addr))["error"] == 0


async def test_not_leader_and_unknown_partition(start_broker: StartBroker, controller: FakeController,
                                                rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=2, replicas=[1, 2])  # broker 1 follows an unreachable broker 2
    assert part(await rpc.call(b.address, "produce", produce_body(batch())))["error"] == \
        ErrorCode.NOT_LEADER_OR_FOLLOWER
    other = TopicPartition("nope", 0)
    assert part(await rpc.call(b.address, "produce", produce_body(batch(), tp=other)))["error"] == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert part(await rpc.call(b.address, "fetch", fetch_body(0, tp=other)))["error"] == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_list_offsets_and_epochs(start_broker: StartBroker, controller: FakeController,
                                       rpc: RpcClient) -> None:
    addr = await leader_broker(start_broker, controller)
    await rpc.call(addr, "produce", produce_body(batch(3, ts=1000)))
    await controller.elect(TP, leader=1, replicas=[1])  # epoch 1 starts at offset 3
    await rpc.call(addr, "produce", produce_body(batch(2, ts=2000)))

    async def lo(ts: int) -> dict[str, Any]:
        return part(await rpc.call(addr, "list_offsets", {"replica_id": -1, "topics": [
            {"topic": TP.topic, "partitions": [{"partition": 0, "timestamp": ts}]}]}))

    assert (await lo(-2))["offset"] == 0 and (await lo(-2))["leader_epoch"] == 0  # the epoch of the log start
    assert (await lo(-1))["offset"] == 5
    assert (await lo(1500))["offset"] == 3
    assert (await lo(9999))["offset"] == -1

    async def ofle(epoch: int) -> dict[str, Any]:
        return part(await rpc.call(addr, "offsets_for_leader_epoch", {"replica_id": 2, "topics": [
            {"topic": TP.topic, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                "leader_epoch": epoch}]}]}))

    assert (await ofle(0))["leader_epoch"] == 0 and (await ofle(0))["end_offset"] == 3
    assert (await ofle(1))["end_offset"] == 5


async def test_a_log_append_time_topic_takes_the_leaders_time(start_broker: StartBroker,
                                                              controller: FakeController, rpc: RpcClient) -> None:
    """message.timestamp.type=LogAppendTime (Kafka's LogValidator): each batch is stored with the attributes bit
    and the leader's time as its max timestamp, its CRC computed again; the answer gives that time; a producer
    clock years ahead is no INVALID_TIMESTAMP; the time index and ListOffsets by time use the leader's time."""
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1], topic_configs={TP.topic: {"message.timestamp.type":
                                                                                  "LogAppendTime"}})
    before = int(time.time() * 1000)
    r = part(await rpc.call(b.address, "produce", produce_body(batch(3, ts=1_000))))  # a producer clock in 1970
    after = int(time.time() * 1000)
    assert r["error"] == 0 and before <= r["log_append_time_ms"] <= after, r
    records = part(await rpc.call(b.address, "fetch", fetch_body(0)))["records"]
    (header,) = validate_batches(records, max_batch_size=1 << 20)  # the CRC holds
    assert (header.attributes, header.max_timestamp) == (TIMESTAMP_TYPE_BIT, r["log_append_time_ms"])
    assert header.first_timestamp == 1_000  # the records themselves are as sent
    ahead = part(await rpc.call(b.address, "produce", produce_body(batch(1, ts=4_102_444_800_000))))  # 2100
    assert ahead["error"] == 0, ahead  # the producer's time is not checked, it is replaced

    async def lo(ts: int) -> int:
        answer = part(await rpc.call(b.address, "list_offsets", {"replica_id": -1, "topics": [
            {"topic": TP.topic, "partitions": [{"partition": 0, "timestamp": ts}]}]}))
        offset: int = answer["offset"]
        return offset

    assert await lo(before) == 0  # by the leader's time: the records' own (1970) would be below it
    assert await lo(int(time.time() * 1000) + 60_000) == -1  # the 2100 batch too is at the leader's time


async def test_a_create_time_topic_clears_a_producers_log_append_time_bit(start_broker: StartBroker,
                                                                          controller: FakeController,
                                                                          rpc: RpcClient) -> None:
    # Kafka's setMaxTimestamp(CREATE_TIME, ...) on the topic's type: the bit was kept, and consumers took the
    # producer's max timestamp for every record of the batch
    addr = await leader_broker(start_broker, controller)
    sent = bytearray(batch(3, ts=1_700_000_000_000))
    struct.pack_into(">h", sent, 21, TIMESTAMP_TYPE_BIT)
    struct.pack_into(">I", sent, 17, compute_crc(sent, 0, len(sent)))
    r = part(await rpc.call(addr, "produce", produce_body(bytes(sent))))
    assert (r["error"], r["log_append_time_ms"]) == (0, -1)
    (header,) = validate_batches(part(await rpc.call(addr, "fetch", fetch_body(0)))["records"],
                                 max_batch_size=1 << 20)
    assert (header.attributes, header.max_timestamp) == (0, 1_700_000_000_000)


async def test_offsets_apis_fence_an_older_current_leader_epoch(start_broker: StartBroker,
                                                                controller: FakeController, rpc: RpcClient) -> None:
    """As fetch (KIP-320): ListOffsets and OffsetsForLeaderEpoch from a client on an older leader epoch are
    FENCED_LEADER_EPOCH, on a newer one UNKNOWN_LEADER_EPOCH."""
    addr = await leader_broker(start_broker, controller)
    await rpc.call(addr, "produce", produce_body(batch(3)))
    await controller.elect(TP, leader=1, replicas=[1])  # leader epoch 1

    async def ofle(current: int) -> dict[str, Any]:
        return part(await rpc.call(addr, "offsets_for_leader_epoch", {"replica_id": 2, "topics": [
            {"topic": TP.topic, "partitions": [{"partition": 0, "current_leader_epoch": current,
                                                "leader_epoch": 0}]}]}))

    async def lo(current: int) -> dict[str, Any]:
        return part(await rpc.call(addr, "list_offsets", {"replica_id": -1, "topics": [
            {"topic": TP.topic, "partitions": [{"partition": 0, "timestamp": -1,
                                                "current_leader_epoch": current}]}]}))

    assert (await ofle(0))["error"] == ErrorCode.FENCED_LEADER_EPOCH
    assert (await lo(0))["error"] == ErrorCode.FENCED_LEADER_EPOCH
    assert (await ofle(2))["error"] == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert (await lo(2))["error"] == ErrorCode.UNKNOWN_LEADER_EPOCH
    answer = await ofle(1)
    assert (answer["error"], answer["end_offset"]) == (0, 3)
    assert (await lo(1))["offset"] == 3


def undecodable_batch(ts: int) -> bytes:
    """A batch whose CRC and record count are right but whose two records are msgpack integers: the
    produce path checks frames, not records, so it is stored."""
    body = msgpack.packb([1, 2], use_bin_type=True)
    tail = struct.pack(">hiqqqhii", 0, 1, ts, ts, -1, -1, -1, 2) + body
    head = bytearray(struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, 0) + tail)
    struct.pack_into(">I", head, 17, compute_crc(head, 0, len(head)))
    return bytes(head)


async def test_list_offsets_by_timestamp_over_records_that_do_not_decode(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    """The lookup answers the batch's first offset (a consumer starting there gets the batch's error);
    it used to fail the whole request, the healthy partition's answer included."""
    b = await start_broker()
    healthy = TopicPartition("t", 1)
    await controller.elect(TP, leader=1, replicas=[1])
    await controller.elect(healthy, leader=1, replicas=[1])
    assert part(await rpc.call(b.address, "produce", produce_body(undecodable_batch(1000))))["error"] == 0
    await rpc.call(b.address, "produce", produce_body(batch(2, ts=5000), tp=healthy))
    resp = await rpc.call(b.address, "list_offsets", {"replica_id": -1, "topics": [{"topic": "t", "partitions": [
        {"partition": 0, "timestamp": 500}, {"partition": 1, "timestamp": 500}]}]})
    answers = {p["partition"]: (p["error"], p["offset"]) for p in resp["topics"][0]["partitions"]}
    assert answers == {0: (0, 0), 1: (0, 0)}


async def test_list_offsets_while_a_new_leaders_hw_lags_its_epoch_start(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    """Kafka's Partition.fetchOffsetForTimestamp: until the HW reaches the leader epoch's start, a consumer
    asking for LATEST, or for a timestamp found above the HW, gets OFFSET_NOT_AVAILABLE (retriable), not
    the stale HW or "no such record"; a follower still gets the LEO."""
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, 2])
    await rpc.call(b.address, "produce", produce_body(batch(3, ts=1000)))  # acks=1: HW stays 0
    await controller.elect(TP, leader=1, replicas=[1, 2])  # epoch 1 starts at offset 3, above the HW

    async def lo(ts: int, replica_id: int = -1) -> dict[str, Any]:
        return part(await rpc.call(b.address, "list_offsets", {"replica_id": replica_id, "topics": [
            {"topic": TP.topic, "partitions": [{"partition": 0, "timestamp": ts}]}]}))

    assert (await lo(-1))["error"] == ErrorCode.OFFSET_NOT_AVAILABLE
    assert (await lo(500))["error"] == ErrorCode.OFFSET_NOT_AVAILABLE
    assert (await lo(-2))["error"] == 0 and (await lo(-2))["offset"] == 0
    assert (await lo(-1, replica_id=2))["offset"] == 3
    await rpc.call(b.address, "fetch", fetch_body(3, replica_id=2, broker_epoch=1))  # the HW reaches 3
    assert (await lo(-1))["error"] == 0 and (await lo(-1))["offset"] == 3
    assert (await lo(500))["offset"] == 0


async def test_list_offsets_max_timestamp(start_broker: StartBroker, controller: FakeController,
                                          rpc: RpcClient) -> None:
    """Timestamp -3 (KIP-734): the first record carrying the largest timestamp, with that timestamp and its
    batch's epoch; for a consumer only once it is below the HW, as any lookup by time (a follower sees it
    at once)."""
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, 2])
    for ts in (1000, 5000, 3000):
        await rpc.call(b.address, "produce", produce_body(batch(2, ts=ts)))  # acks=1: the HW stays 0

    async def lo(replica_id: int = -1) -> dict[str, Any]:
        return part(await rpc.call(b.address, "list_offsets", {"replica_id": replica_id, "topics": [
            {"topic": TP.topic, "partitions": [{"partition": 0, "timestamp": -3}]}]}))

    assert await lo() == {"partition": 0, "error": 0, "timestamp": -1, "offset": -1, "leader_epoch": -1}
    assert await lo(replica_id=2) == {"partition": 0, "error": 0, "timestamp": 5000, "offset": 2, "leader_epoch": 0}
    await rpc.call(b.address, "fetch", fetch_body(4, replica_id=2, broker_epoch=1))  # the HW reaches 4
    assert await lo() == {"partition": 0, "error": 0, "timestamp": 5000, "offset": 2, "leader_epoch": 0}


async def test_clients_give_up_at_once_on_a_topic_name_no_topic_can_have(start_broker: StartBroker) -> None:
    # Found by review: the broker answered UNKNOWN_TOPIC_OR_PARTITION, and a producer waited out max.block.ms
    # (a minute by default), a consumer its timeout, for a topic that can never exist
    b = await start_broker()
    async with Producer(b.address, max_block_ms=120_000) as producer:
        with pytest.raises(MinibrokerError, match="INVALID_TOPIC_EXCEPTION: topic 'bad topic!'") as info:
            await asyncio.wait_for(producer.send("bad topic!", b"x"), 20)
        assert info.value.code is ErrorCode.INVALID_TOPIC_EXCEPTION
    async with Consumer(b.address) as consumer:
        with pytest.raises(MinibrokerError, match="INVALID_TOPIC_EXCEPTION: topic 'bad topic!'"):
            await asyncio.wait_for(consumer.assign_topic("bad topic!", timeout_ms=120_000), 20)
        consumer.assign([("bad topic!", 0)])  # by hand: poll raises, as Kafka's (it returned [] for ever)
        with pytest.raises(MinibrokerError, match="INVALID_TOPIC_EXCEPTION: topic 'bad topic!'") as info:
            for _ in range(50):  # bounded
                await consumer.poll(timeout_ms=100)
        assert info.value.code is ErrorCode.INVALID_TOPIC_EXCEPTION


async def test_diverging_epoch_for_follower(start_broker: StartBroker, controller: FakeController,
                                            rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, 2])
    await rpc.call(b.address, "produce", produce_body(batch(3)))
    await controller.elect(TP, leader=1, replicas=[1, 2])  # epoch 1 from offset 3
    await rpc.call(b.address, "produce", produce_body(batch(3)))
    # follower claims epoch 0 up to offset 5: the leader's epoch 0 ended at 3
    # at the leader's LEO with nothing to read, a long poll is still answered at once: it must truncate
    f = part(await asyncio.wait_for(rpc.call(b.address, "fetch", fetch_body(
        6, replica_id=2, broker_epoch=1, last_fetched_epoch=0, max_wait_ms=120_000)), timeout=30))
    assert f["diverging_epoch"] == {"epoch": 0, "end_offset": 3} and f["records"] == b""
    f = part(await rpc.call(b.address, "fetch", fetch_body(5, replica_id=2, broker_epoch=1, last_fetched_epoch=0)))
    assert f["diverging_epoch"] == {"epoch": 0, "end_offset": 3} and f["records"] == b""
    f = part(await rpc.call(b.address, "fetch", fetch_body(3, replica_id=2, broker_epoch=1, last_fetched_epoch=0)))
    assert f["diverging_epoch"] is None and f["records"]


async def test_diverging_epoch_for_a_consumer(start_broker: StartBroker, controller: FakeController,
                                              rpc: RpcClient) -> None:
    # the consumer's truncation detection (KIP-320) rests on this: a consumer fetch carrying the epoch of the
    # last record it read is told where that epoch ends here when its position is past that end
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1])
    await rpc.call(b.address, "produce", produce_body(batch(3)))
    await controller.elect(TP, leader=1, replicas=[1])  # epoch 1 from offset 3
    await rpc.call(b.address, "produce", produce_body(batch(3)))
    f = part(await rpc.call(b.address, "fetch", fetch_body(5, last_fetched_epoch=0)))
    assert f["diverging_epoch"] == {"epoch": 0, "end_offset": 3} and f["records"] == b""
    f = part(await rpc.call(b.address, "fetch", fetch_body(3, last_fetched_epoch=0)))
    assert f["diverging_epoch"] is None and f["records"]


async def test_diverging_epoch_when_the_leader_never_had_the_followers_last_epoch(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    """The follower's last epoch (1, led by another broker) is not in this log; the epoch below it (0) ends
    at 6, past the fetch offset 5. The follower's offsets from 3 on are epoch 1's, which this log never had:
    it must still be told to truncate, to the end of epoch 0 (Kafka: epoch < lastFetchedEpoch)."""
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, 2])  # epoch 0
    await rpc.call(b.address, "produce", produce_body(batch(6)))  # offsets 0-5
    await controller.elect(TP, leader=2, replicas=[1, 2])  # epoch 1: broker 2 leads
    await controller.elect(TP, leader=1, replicas=[1, 2])  # epoch 2, from offset 6 here
    await rpc.call(b.address, "produce", produce_body(batch(2)))  # offsets 6-7
    f = part(await rpc.call(b.address, "fetch", fetch_body(5, replica_id=2, broker_epoch=1, last_fetched_epoch=1)))
    assert f["diverging_epoch"] == {"epoch": 0, "end_offset": 6} and f["records"] == b""


async def test_follower_whose_last_epoch_the_leader_cannot_place_gets_offset_out_of_range(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    """Kafka's Partition.readRecords: a last fetched epoch whose end the leader cannot determine (here newer
    than any epoch it has) is OFFSET_OUT_OF_RANGE. It was answered as a diverging epoch (-1, -1), on which
    the fetcher truncates to its HW, the blind truncation KIP-101 removed."""
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, 2])
    await rpc.call(b.address, "produce", produce_body(batch(3)))
    f = part(await rpc.call(b.address, "fetch", fetch_body(3, replica_id=2, broker_epoch=1, last_fetched_epoch=7)))
    assert f["error"] == ErrorCode.OFFSET_OUT_OF_RANGE and not f.get("diverging_epoch")


async def test_follower_fetch_from_non_replica(start_broker: StartBroker, controller: FakeController,
                                               rpc: RpcClient) -> None:
    addr = await leader_broker(start_broker, controller)
    f = part(await rpc.call(addr, "fetch", fetch_body(0, replica_id=7, broker_epoch=1)))
    assert f["error"] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    # with the leader epoch, which matches: a replica this leader may not know yet (Kafka's
    # followerReplicaOrThrow), UNKNOWN_LEADER_EPOCH; either way nothing is read and no follower state made
    f = part(await rpc.call(addr, "fetch", fetch_body(0, replica_id=7, broker_epoch=1, current_leader_epoch=0)))
    assert f["error"] == ErrorCode.UNKNOWN_LEADER_EPOCH and f["records"] == b""


async def test_stale_follower_broker_epoch(start_broker: StartBroker, controller: FakeController,
                                           rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1, 2])
    await rpc.call(b.address, "fetch", fetch_body(0, replica_id=2, broker_epoch=10))
    r = await rpc.call(b.address, "fetch", fetch_body(0, replica_id=2, broker_epoch=9))
    assert r["error"] == ErrorCode.STALE_BROKER_EPOCH


async def test_stop_replica_deletes_log(start_broker: StartBroker, controller: FakeController,
                                        rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1])
    await rpc.call(b.address, "produce", produce_body(batch()))
    log_dir = b.opts.data_dir / "t-0"
    assert log_dir.exists()
    r = await controller.send_stop_replica(b.address, TP, delete=True)
    assert r["error"] == 0 and r["partitions"][0]["error"] == 0
    assert not log_dir.exists()
    assert part(await rpc.call(b.address, "produce", produce_body(batch())))["error"] == \
        ErrorCode.NOT_LEADER_OR_FOLLOWER  # still in metadata, no longer hosted


async def test_metadata_status_metrics(start_broker: StartBroker, controller: FakeController,
                                       rpc: RpcClient) -> None:
    addr = await leader_broker(start_broker, controller)
    await rpc.call(addr, "produce", produce_body(batch(5)))
    md = await rpc.call(addr, "metadata", {"topics": None})
    assert md["brokers"][0]["node_id"] == 1
    assert md["topics"][0]["partitions"][0]["leader"] == 1
    md = await rpc.call(addr, "metadata", {"topics": ["missing", "bad topic!", "..", "x" * 250]})
    assert [t["error"] for t in md["topics"]] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] + [
        ErrorCode.INVALID_TOPIC_EXCEPTION] * 3  # names no topic can have (Kafka's getTopicMetadata)
    status = await rpc.get_json(addr, "/v1/status")
    assert status["node_id"] == 1 and status["broker_epoch"] > 0
    assert status["partitions"][0]["log_end_offset"] == 5
    async with aiohttp.ClientSession() as s, s.get(f"http://{addr}/metrics") as resp:
        text = await resp.text()
    assert "minibroker_messages_in_total 5.0" in text
    assert 'minibroker_request_latency_seconds_count{api="produce"} 1.0' in text
    assert "minibroker_under_replicated_partitions 0.0" in text


BAD_BODIES: list[tuple[str, bytes]] = [
    ("produce", b"\xc1\xc1not msgpack"),
    ("produce", encode([1, 2, 3])),
    ("produce", encode({"acks": 1})),
    ("produce", encode({"acks": "1", "topics": []})),
    ("produce", encode({"acks": 1, "topics": [{"topic": "t", "partitions": [{"partition": -1, "records": b""}]}]})),
    ("produce", encode({"acks": 1, "topics": [{"topic": "t", "partitions": [{"partition": 0, "records": "x"}]}]})),
    ("fetch", encode({"topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": -5}]}]})),
    ("fetch", encode({"max_bytes": -1, "topics": []})),
    ("fetch", encode({"max_wait_ms": 10**12, "topics": []})),
    ("list_offsets", encode({"topics": [{"topic": 5, "partitions": []}]})),
    ("list_offsets", encode({"topics": [{"topic": "t", "partitions": [{"partition": 0, "timestamp": -4}]}]})),
    ("leader_and_isr", encode({"controller_id": 1, "controller_epoch": 9, "partition_states": [{"topic": "t"}]})),
    ("stop_replica", encode({"controller_id": 1, "controller_epoch": 9})),
    ("metadata", encode({"topics": "t"})),
]


@pytest.mark.parametrize(("api", "body"), BAD_BODIES)
async def test_bad_bodies_get_400_and_change_nothing(start_broker: StartBroker, controller: FakeController,
                                                     rpc: RpcClient, api: str, body: bytes) -> None:
    addr = await leader_broker(start_broker, controller)
    async with aiohttp.ClientSession() as s, s.post(f"http://{addr}/v1/{api}", data=body) as resp:
        assert resp.status == 400
        assert api in await resp.text()
    with pytest.raises(RpcBadRequest):
        await rpc.call(addr, "fetch", {"topics": "x"})
    assert part(await rpc.call(addr, "fetch", fetch_body(0)))["log_end_offset"] == 0


async def test_bad_batches_get_error_codes(start_broker: StartBroker, controller: FakeController,
                                           rpc: RpcClient) -> None:
    addr = await leader_broker(start_broker, controller, sets={"message.max.bytes": 2000})
    good = batch(3)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF

    def resealed(data: bytes, *edits: tuple[int, bytes]) -> bytes:
        """``data`` with each (position, bytes) written over it, batch_length and CRC made right again:
        what a buggy or hostile producer sends."""
        buf = bytearray(data)
        for at, value in edits:
            buf[at:at + len(value)] = value
        struct.pack_into(">i", buf, 8, len(buf) - 12)
        struct.pack_into(">I", buf, 17, compute_crc(buf, 0, len(buf)))
        return bytes(buf)

    cases = [
        (bytes(corrupt), ErrorCode.CORRUPT_MESSAGE),
        (good[:30], ErrorCode.CORRUPT_MESSAGE),
        (batch(50, size=100), ErrorCode.MESSAGE_TOO_LARGE),
        (b"", ErrorCode.INVALID_RECORD),
        (good + good[:20], ErrorCode.CORRUPT_MESSAGE),  # a valid batch then a torn one: nothing appended
        # a right CRC over records that are no array, or an array of another length than record_count:
        # once stored, and then every consumer of the partition failed on them
        (resealed(good[:HEADER_SIZE] + msgpack.packb("hello")), ErrorCode.INVALID_RECORD),
        (resealed(good, (23, struct.pack(">i", 2**31 - 2)), (57, struct.pack(">i", 2**31 - 1))),
         ErrorCode.INVALID_RECORD),  # three records that claim 2**31 - 1: the offsets would jump
        (resealed(good, (21, struct.pack(">h", 2))), ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
        (resealed(good, (21, struct.pack(">h", 0x20))), ErrorCode.INVALID_RECORD),  # a control batch
    ]
    for records, code in cases:
        r = part(await rpc.call(addr, "produce", produce_body(records)))
        assert r["error"] == code, (code, r)
    r = part(await rpc.call(addr, "produce", produce_body(good, acks=2)))
    assert r["error"] == ErrorCode.INVALID_REQUIRED_ACKS
    assert part(await rpc.call(addr, "fetch", fetch_body(0)))["log_end_offset"] == 0
    f = part(await rpc.call(addr, "fetch", fetch_body(10**15)))
    assert f["error"] == ErrorCode.OFFSET_OUT_OF_RANGE


async def test_fetch_total_and_partition_max_bytes(start_broker: StartBroker, controller: FakeController,
                                                   rpc: RpcClient) -> None:
    b = await start_broker()
    tp1 = TopicPartition("t", 1)
    await controller.elect(TP, leader=1, replicas=[1])
    await controller.elect(tp1, leader=1, replicas=[1])
    one = batch(5, size=100)
    for tp in (TP, tp1):
        for _ in range(3):
            await rpc.call(b.address, "produce", produce_body(one, tp=tp))
    body = fetch_body(0, max_bytes=len(one) + 10)
    body["topics"][0]["partitions"].append({**body["topics"][0]["partitions"][0], "partition": 1})
    r = await rpc.call(b.address, "fetch", body)
    parts = r["topics"][0]["partitions"]
    assert len(parts[0]["records"]) == len(one)  # whole batches only, within the request's max_bytes
    assert parts[1]["records"] == b""  # the response is full
    body = fetch_body(0, max_bytes=1)
    body["topics"][0]["partitions"][0]["partition_max_bytes"] = 1
    r = await rpc.call(b.address, "fetch", body)
    assert len(part(r)["records"]) == len(one)  # at least one whole batch, so a consumer always progresses
    body = fetch_body(0)
    body["topics"][0]["partitions"][0]["partition_max_bytes"] = 2 * len(one) + 5
    assert len(part(await rpc.call(b.address, "fetch", body))["records"]) == 2 * len(one)


async def test_reregisters_after_stale_heartbeat(start_broker: StartBroker, controller: FakeController) -> None:
    b = await start_broker()
    first = controller.brokers[1].broker_epoch
    assert b.rm is not None and b.rm.broker_epoch == first
    controller.brokers[1].broker_epoch = -5  # the controller forgot this incarnation: heartbeats get STALE
    deadline = asyncio.get_running_loop().time() + 30
    while b.rm.broker_epoch in (first, -1) or controller.brokers[1].broker_epoch < 0:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    assert b.rm.broker_epoch == controller.brokers[1].broker_epoch > first
    assert controller.brokers[1].incarnation_id == b.link.incarnation_id if b.link else False


@pytest.mark.parametrize("topic", ["../evil", "a/b", "", ".", "x" * 250, "t\x00"])
async def test_control_requests_refuse_bad_topic_names(start_broker: StartBroker, controller: FakeController,
                                                       rpc: RpcClient, topic: str) -> None:
    b = await start_broker()
    state = {"topic": topic, "partition": 0, "leader": 1, "leader_epoch": 0, "isr": [1], "partition_epoch": 0,
             "replicas": [1]}
    with pytest.raises(RpcBadRequest):
        await controller.send_leader_and_isr(b.address, [state])
    assert sorted(p.name for p in b.opts.data_dir.iterdir() if p.is_dir()) == []
    assert not (b.opts.data_dir.parent / "evil-0").exists()


async def test_mixed_partitions_acks0_stale_stop_and_deleted_topic(start_broker: StartBroker,
                                                                   controller: FakeController,
                                                                   rpc: RpcClient) -> None:
    b = await start_broker()
    await controller.elect(TP, leader=1, replicas=[1])
    await controller.elect(TP, leader=1, replicas=[1])  # leader epoch 1
    body = produce_body(batch(2), acks=0)
    body["topics"][0]["partitions"].append({"partition": 9, "records": batch(2)})
    r = await rpc.call(b.address, "produce", body)
    errors = {p["partition"]: p["error"] for p in r["topics"][0]["partitions"]}
    assert errors == {0: 0, 9: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}  # acks=0 still answers per partition
    stale = await controller.send_stop_replica(b.address, TP, leader_epoch=0)
    assert stale["partitions"][0]["error"] == ErrorCode.FENCED_LEADER_EPOCH
    assert part(await rpc.call(b.address, "fetch", fetch_body(0)))["log_end_offset"] == 2
    controller.partitions.pop(TP)
    await controller.send_update_metadata(b.address, deleted_topics=[TP.topic])
    md = await rpc.call(b.address, "metadata", {"topics": [TP.topic]})
    assert md["topics"][0]["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_a_full_update_metadata_drops_the_topics_and_partitions_it_does_not_list(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    # what a broker that missed a deletion (fenced, or the controller restarted) learns at its full sync
    b = await start_broker()
    gone, kept = TopicPartition("gone", 0), TopicPartition("kept", 0)
    for tp in (gone, TopicPartition("gone", 1), kept, TopicPartition("kept", 1)):
        await controller.elect(tp, leader=2, replicas=[2])  # on another broker: not in this one's logs

    async def partitions(topic: str) -> tuple[int, list[int]]:
        t = (await rpc.call(b.address, "metadata", {"topics": [topic]}))["topics"][0]
        return t["error"], [p["partition"] for p in t["partitions"]]
    controller.partitions.pop(gone)
    controller.partitions.pop(TopicPartition("gone", 1))
    controller.partitions.pop(TopicPartition("kept", 1))
    await controller.send_update_metadata(b.address)  # a partial update merges: nothing forgotten
    assert await partitions("gone") == (0, [0, 1]) and await partitions("kept") == (0, [0, 1])
    await controller.send_update_metadata(b.address, full=True)
    assert await partitions("gone") == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])
    assert await partitions("kept") == (0, [0])  # a re-created topic with fewer partitions


async def test_unregistered_broker_refuses_orders_carrying_a_broker_epoch(tmp_path: Any, rpc: RpcClient,
                                                                         controller: FakeController) -> None:
    """A restarted broker that has not heard its registration answer must not obey requests addressed to
    its previous incarnation's broker epoch; orders without an epoch (-1) are still taken."""
    from broker.process import BrokerOptions, BrokerProcess
    from common.config import broker_config

    opts = BrokerOptions(1, "127.0.0.1", 0, "127.0.0.1:1", tmp_path / "b1", None,
                         broker_config({"broker.heartbeat.interval.ms": 200}))
    proc = BrokerProcess(opts)
    await proc.start()
    try:
        assert proc.rm is not None and proc.rm.broker_epoch == -1
        state = {"topic": TP.topic, "partition": TP.partition, "leader": 1, "leader_epoch": 0, "isr": [1],
                 "partition_epoch": 0, "replicas": [1], "is_new": True}
        old = await controller.send_leader_and_isr(proc.address, [state], broker_epoch=7)
        assert old["error"] == ErrorCode.STALE_BROKER_EPOCH
        assert part(await rpc.call(proc.address, "produce", produce_body(batch())))["error"] == \
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        ok = await controller.send_leader_and_isr(proc.address, [state], broker_epoch=-1)
        assert ok["error"] == 0
    finally:
        await proc.stop()


async def test_heartbeats_say_shutdown_once_controlled_shutdown_begins(start_broker: StartBroker,
                                                                       controller: FakeController) -> None:
    """Kafka's wantShutDown: while the broker waits for its leaders to move, its heartbeats say it is
    shutting down, so a controller that restarted meanwhile (and forgot) does not unfence it again."""
    b = await start_broker()
    for _ in range(300):  # bounded: 30 s
        if controller.heartbeats:
            break
        await asyncio.sleep(0.1)
    assert controller.heartbeats and not any(h["want_shutdown"] for h in controller.heartbeats)
    controller.shutdown_remaining_answers = 8  # ~1.6 s of retries: several heartbeats meanwhile
    rpc = RpcClient(timeout_s=2)
    try:
        assert (await rpc.get_json(b.address, "/v1/status"))["shutting_down"] is False
        stopping = asyncio.ensure_future(b.stop())
        # its own status says so too (`cluster status` showed a broker whose controller was down as up)
        seen = False
        for _ in range(100):  # bounded: 2 s, within the ~1.6 s of retries
            await asyncio.sleep(0.02)
            if (await rpc.get_json(b.address, "/v1/status"))["shutting_down"]:
                seen = True
                break
        await stopping
    finally:
        await rpc.close()
    assert seen
    assert len(controller.shutdown_requests) > 8
    assert any(h["want_shutdown"] for h in controller.heartbeats)


async def test_connections_idle_for_connections_max_idle_ms_are_closed(start_broker: StartBroker) -> None:
    """Kafka's connections.max.idle.ms: a connection with no request, or a request whose headers or body stop
    coming, is closed (it was kept for aiohttp's default hour, a stalled body for ever: clients going quiet
    used up the broker's file descriptors, and it then halted for a data dir failure)."""
    b = await start_broker(sets={"connections.max.idle.ms": 300})
    await assert_idle_connections_are_closed(b.address)


async def test_timestamps_beyond_the_topics_bounds_are_refused(start_broker: StartBroker, controller: FakeController,
                                                               rpc: RpcClient) -> None:
    """KIP-937: a batch stamped more than message.timestamp.after.max.ms (default one hour, Kafka 4.0) ahead of
    the broker's time, or more than before.max.ms (default unlimited) behind it, is refused with
    INVALID_TIMESTAMP and nothing is appended (a batch from a clock years ahead kept its segment, and every
    later one, from time-based retention and rolling for ever); a topic can set its own bounds."""
    addr = await leader_broker(start_broker, controller)
    now = int(time.time() * 1000)
    hour = 3_600_000
    ahead = part(await rpc.call(addr, "produce", produce_body(batch(ts=now + 2 * hour))))
    assert ahead["error"] == ErrorCode.INVALID_TIMESTAMP and "after.max.ms" in ahead["error_message"]
    ahead_in_one_of_two = batch(ts=now) + batch(ts=now + 10 * 365 * 24 * hour)
    assert part(await rpc.call(addr, "produce", produce_body(ahead_in_one_of_two)))["error"] == \
        ErrorCode.INVALID_TIMESTAMP
    for ts in (now + hour // 2, now - 10 * 365 * 24 * hour, -1):  # within the hour; years back; no timestamp
        assert part(await rpc.call(addr, "produce", produce_body(batch(ts=ts))))["error"] == 0, ts
    assert part(await rpc.call(addr, "fetch", fetch_body(0)))["log_end_offset"] == 9
    await controller.elect(TP, leader=1, replicas=[1], topic_configs={TP.topic: {
        "message.timestamp.after.max.ms": 3 * hour, "message.timestamp.before.max.ms": 24 * hour}})
    assert part(await rpc.call(addr, "produce", produce_body(batch(ts=now + 2 * hour))))["error"] == 0
    behind = part(await rpc.call(addr, "produce", produce_body(batch(ts=now - 2 * 24 * hour))))
    assert behind["error"] == ErrorCode.INVALID_TIMESTAMP and "before.max.ms" in behind["error_message"]
    assert part(await rpc.call(addr, "fetch", fetch_body(0)))["log_end_offset"] == 12
