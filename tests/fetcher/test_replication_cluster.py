"""Integration: 3 real broker processes on 127.0.0.1, this test acting as the controller.

100k records (100-byte values, 1000 per batch) are produced with acks=all to 2
partitions (RF=3, min.insync.replicas=2) while leadership moves between the ISR
members by hand-sent LeaderAndIsr. Afterwards every replica is byte-identical
below the HW and every acknowledged record is at its acknowledged offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from common.errors import ErrorCode
from common.http import RpcClient, RpcError
from common.wire import TopicPartition
from tests.procs import Procs

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("storage.log") is None or importlib.util.find_spec("broker.process") is None,
    reason="storage.log / broker.process are not in this tree yet")

TOPIC = "rep"
TPS = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
RECORDS = 100_000
PER_BATCH = 1_000
VALUE_BYTES = 100
MOVE_EVERY = 7  # batches per partition between leadership moves
BROKER_SETTINGS = {"replica.fetch.wait.max.ms": 200, "replica.fetch.backoff.ms": 100,
                   "replica.lag.time.max.ms": 10_000, "broker.heartbeat.interval.ms": 500}
TOPIC_CONFIGS = {TOPIC: {"min.insync.replicas": 2}}


def values_for(tp: TopicPartition, batch_no: int) -> list[bytes]:
    return [f"{tp}|{batch_no:05d}|{i:04d}|".encode().ljust(VALUE_BYTES, b"x") for i in range(PER_BATCH)]


@dataclass
class Cluster:
    controller: Any
    procs: Procs
    brokers: dict[int, Any]
    rpc: RpcClient
    acked: dict[TopicPartition, list[tuple[int, int]]] = field(default_factory=dict)  # (base offset, batch no)
    moves: int = 0

    def address(self, node_id: int) -> str:
        return str(self.brokers[node_id].address)

    async def status(self, node_id: int) -> dict[str, Any]:
        return dict(await self.rpc.get_json(self.address(node_id), "/v1/status", timeout_s=10))


@contextlib.asynccontextmanager
async def start_cluster(tmp_path: Path, settings: dict[str, Any]) -> AsyncIterator[Cluster]:
    from tests.fake_controller import FakeController

    controller = await FakeController().start()
    procs = Procs()
    rpc = RpcClient(timeout_s=30)
    try:
        brokers = {}
        for n in (1, 2, 3):
            brokers[n] = await asyncio.to_thread(procs.broker, n, tmp_path / f"broker{n}", controller.address,
                                                 sets=settings)
        await controller.wait_registered([1, 2, 3])
        yield Cluster(controller, procs, brokers, rpc)
    finally:
        await rpc.close()
        await asyncio.to_thread(procs.close)
        await controller.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with start_cluster(tmp_path, BROKER_SETTINGS) as c:
        yield c


async def produce_batch(c: Cluster, tp: TopicPartition, batch_no: int, acks: int = -1) -> None:
    """Send one batch (acks=all by default) to the current leader until acknowledged (bounded retries)."""
    from storage.record_batch import build_batch

    records = build_batch([(None, v) for v in values_for(tp, batch_no)], timestamp_ms=1_700_000_000_000)
    body = {"acks": acks, "timeout_ms": 10_000,
            "topics": [{"topic": tp.topic, "partitions": [{"partition": tp.partition, "records": records}]}]}
    last: object = None
    for _ in range(300):
        leader = c.controller.partitions[tp].leader
        try:
            answer = await c.rpc.call(c.address(leader), "produce", body, timeout_s=15)
            part = answer["topics"][0]["partitions"][0]
            last = ErrorCode.of(part["error"])
            if last is ErrorCode.NONE:
                c.acked.setdefault(tp, []).append((part["base_offset"], batch_no))
                return
        except RpcError as exc:
            last = exc
        await asyncio.sleep(0.05)
    raise AssertionError(f"batch {batch_no} of {tp} never acknowledged: {last}")


async def move_leader(c: Cluster, tp: TopicPartition) -> None:
    """A clean election: the next ISR member (in replica order) after the current leader."""
    part = c.controller.partitions[tp]
    candidates = [r for r in part.replicas if r in part.isr and r != part.leader]
    if not candidates:
        return
    nxt = min(candidates, key=lambda r: (r - part.leader) % 3)
    await c.controller.elect(tp, leader=nxt, replicas=part.replicas, isr=list(part.isr),
                             topic_configs=TOPIC_CONFIGS)
    c.moves += 1


async def produce_partition(c: Cluster, tp: TopicPartition, batches: int) -> None:
    for batch_no in range(batches):
        await produce_batch(c, tp, batch_no)
        if batch_no % MOVE_EVERY == MOVE_EVERY - 1:
            await move_leader(c, tp)  # the other partition's produce is in flight meanwhile


async def wait_converged(c: Cluster, timeout_s: float = 90) -> dict[TopicPartition, dict[int, dict[str, Any]]]:
    """Until every replica of every partition has the leader's LEO and the HW equals it."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    views: dict[TopicPartition, dict[int, dict[str, Any]]] = {}
    while asyncio.get_running_loop().time() < deadline:
        views = {tp: {} for tp in TPS}
        for n in c.brokers:
            for p in (await c.status(n))["partitions"]:
                tp = TopicPartition(p["topic"], p["partition"])
                if tp in views:
                    views[tp][n] = p
        if all(len(v) == 3 and len({(p["log_end_offset"], p["high_watermark"]) for p in v.values()}) == 1
               for v in views.values()):
            return views
        await asyncio.sleep(0.2)
    raise AssertionError(f"replicas did not converge: {views}")


def read_batches(data_dir: Path, tp: TopicPartition, upto: int) -> bytes:
    from common.clock import SystemClock
    from common.config import broker_config
    from storage.log import Log, LogConfig
    from storage.record_batch import iter_batches

    log = Log.open(data_dir / f"{tp.topic}-{tp.partition}", LogConfig.from_config(broker_config()), SystemClock())
    try:
        out = bytearray()
        offset = log.log_start_offset
        while offset < upto:
            data = log.read(offset, 1 << 20, max_offset=upto)
            if not data.records:
                break
            out += data.records
            for _pos, header in iter_batches(data.records):
                offset = header.last_offset + 1
        return bytes(out)
    finally:
        log.close()


async def test_replication_with_moving_leadership(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    for i, tp in enumerate(TPS):
        await c.controller.elect(tp, leader=1 + i, replicas=[1, 2, 3], topic_configs=TOPIC_CONFIGS)
    per_partition = RECORDS // PER_BATCH // len(TPS)
    await asyncio.gather(*(produce_partition(c, tp, per_partition) for tp in TPS))
    assert c.moves >= 2 * (per_partition // MOVE_EVERY) - 2
    views = await wait_converged(c)
    hws = {tp: next(iter(v.values()))["high_watermark"] for tp, v in views.items()}
    await asyncio.to_thread(c.procs.close)  # stop the brokers, then read their logs from disk

    for tp in TPS:
        replicas = [read_batches(tmp_path / f"broker{n}", tp, hws[tp]) for n in (1, 2, 3)]
        assert replicas[0] == replicas[1] == replicas[2], f"{tp}: replicas differ below the HW"
        assert len(c.acked[tp]) == per_partition
        assert_acked_in_place(replicas[0], tp, c.acked[tp])


async def test_deposed_leader_truncates_its_uncommitted_tail(cluster: Cluster, tmp_path: Path) -> None:
    """Broker 1 leads, its followers freeze, it appends an acks=1 tail nobody has; broker 2 takes over
    (epoch 1) and writes its own records at those offsets. Back as a follower, broker 1 must cut its tail
    by leader epoch (not by HW) and end byte-identical to the new leader."""
    from tests.fake_controller import FakePartition
    from tests.procs import pause, resume

    c = cluster
    tp = TPS[0]
    await c.controller.elect(tp, leader=1, replicas=[1, 2, 3], topic_configs=TOPIC_CONFIGS)
    for batch_no in range(5):
        await produce_batch(c, tp, batch_no)
    committed = c.acked[tp][-1][0] + PER_BATCH
    await wait_converged_partition(c, tp)

    pause(c.brokers[2])
    pause(c.brokers[3])
    try:
        for batch_no in range(5, 8):  # acks=1: only broker 1 has these
            await produce_batch(c, tp, batch_no, acks=1)
    finally:
        pause(c.brokers[1])
        resume(c.brokers[2])
        resume(c.brokers[3])
    try:
        part = FakePartition(replicas=[1, 2, 3], leader=2, leader_epoch=1, isr=[2, 3], partition_epoch=5)
        c.controller.partitions[tp] = part
        for n in (2, 3):
            await c.controller.send_leader_and_isr(c.address(n), [part.state(tp)], topic_configs=TOPIC_CONFIGS)
        for batch_no in range(100, 103):
            await produce_batch(c, tp, batch_no)
    finally:
        resume(c.brokers[1])
    await c.controller.send_leader_and_isr(c.address(1), [c.controller.partitions[tp].state(tp)],
                                           topic_configs=TOPIC_CONFIGS)
    views = await wait_converged_partition(c, tp)
    hw = views[2]["high_watermark"]
    # Broker 2 may have fetched part of the tail before it froze: the cut is where ITS epoch 0 ends.
    (new_leader,) = [e for e in c.brokers[2].events("became_leader") if e.get("leader_epoch") == 1]
    truncations = [e for e in c.brokers[1].events("follower_truncated") if e.get("topic") == tp.topic]
    assert truncations and truncations[0]["to_offset"] == new_leader["log_end_offset"]
    assert truncations[0]["from_offset"] == committed + 3 * PER_BATCH > truncations[0]["to_offset"]
    assert truncations[0]["reason"] == "offsets_for_leader_epoch:leader_epoch_end_offset"
    await asyncio.to_thread(c.procs.close)
    replicas = [read_batches(tmp_path / f"broker{n}", tp, hw) for n in (1, 2, 3)]
    assert replicas[0] == replicas[1] == replicas[2]
    assert_acked_in_place(replicas[0], tp, [(base, b) for base, b in c.acked[tp] if b < 5 or b >= 100])


def assert_acked_in_place(data: bytes, tp: TopicPartition, acked: list[tuple[int, int]]) -> None:
    from storage.record_batch import decode_records, iter_batches

    by_offset: dict[int, bytes | None] = {}
    for pos, header in iter_batches(data):
        for r in decode_records(data, pos):
            by_offset[header.base_offset + r.offset_delta] = r.value
    for base, batch_no in acked:
        got = [by_offset.get(base + i) for i in range(PER_BATCH)]
        assert got == values_for(tp, batch_no), f"{tp}: batch {batch_no} acknowledged at {base} is not there"


async def wait_converged_partition(c: Cluster, tp: TopicPartition,
                                   timeout_s: float = 60) -> dict[int, dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    view: dict[int, dict[str, Any]] = {}
    while asyncio.get_running_loop().time() < deadline:
        view = {}
        for n in c.brokers:
            for p in (await c.status(n))["partitions"]:
                if (p["topic"], p["partition"]) == tp:
                    view[n] = p
        if len(view) == 3 and len({(p["log_end_offset"], p["high_watermark"]) for p in view.values()}) == 1:
            return view
        await asyncio.sleep(0.1)
    raise AssertionError(f"{tp} did not converge: {view}")


async def test_follower_far_behind_the_leaders_log_start_restarts_there(tmp_path: Path) -> None:
    """A follower frozen while the leader's retention deleted what it lacks: OFFSET_OUT_OF_RANGE, then
    the follower empties its log and starts at the leader's log start offset."""
    from tests.procs import pause, resume

    settings = {**BROKER_SETTINGS, "replica.lag.time.max.ms": 1_000, "log.retention.check.interval.ms": 100}
    # size-based retention only: the batches' timestamps are old, and the active segment expires by time too
    configs = {TOPIC: {"min.insync.replicas": 2, "segment.bytes": 250_000, "retention.bytes": 500_000,
                       "retention.ms": -1}}
    async with start_cluster(tmp_path, settings) as c:
        tp = TPS[0]
        await c.controller.elect(tp, leader=1, replicas=[1, 2, 3], topic_configs=configs)
        for batch_no in range(2):
            await produce_batch(c, tp, batch_no)
        await wait_converged_partition(c, tp)
        pause(c.brokers[3])
        try:
            for batch_no in range(2, 22):  # broker 3 leaves the ISR after replica.lag.time.max.ms
                await produce_batch(c, tp, batch_no)
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                leader = next(p for p in (await c.status(1))["partitions"] if p["topic"] == TOPIC
                              and p["partition"] == tp.partition)
                if leader["log_start_offset"] > 2 * PER_BATCH:
                    break
                assert asyncio.get_running_loop().time() < deadline, f"retention did not run: {leader}"
                await asyncio.sleep(0.1)
        finally:
            resume(c.brokers[3])
        views = await wait_converged_partition(c, tp)
        start = views[3]["log_start_offset"]
        assert start >= leader["log_start_offset"] > 2 * PER_BATCH
        fully = [e for e in c.brokers[3].events("follower_truncated") if e.get("fully")]
        assert fully and fully[0]["reason"] == "out_of_range:leader_start_above_local_end"
        # (a fetch in flight when it froze may have brought it one more batch)
        assert 2 * PER_BATCH <= fully[0]["from_offset"] < fully[0]["to_offset"] <= start
        hw = views[1]["high_watermark"]
        await asyncio.to_thread(c.procs.close)
        follower = read_batches(tmp_path / "broker3", tp, hw)
        leader_bytes = read_batches(tmp_path / "broker1", tp, hw)
        assert follower and leader_bytes.endswith(follower)
        assert_acked_in_place(leader_bytes, tp, [(b, n) for b, n in c.acked[tp] if b >= start])
        assert_acked_in_place(follower, tp, [(b, n) for b, n in c.acked[tp] if b >= start])
