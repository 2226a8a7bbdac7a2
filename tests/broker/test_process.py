"""Real broker processes: data dir ownership, restart restores HW and logs, graceful SIGTERM, fuzzing."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from common.errors import ErrorCode
from common.http import RpcClient
from common.wire import encode
from storage.record_batch import iter_batches
from tests.broker.conftest import TP, batch, fetch_body, part, produce_body
from tests.fake_controller import FakeController
from tests.procs import REPO, Proc, Procs, kill, stop


async def start(procs: Procs, fc: FakeController, data_dir: Path, **sets: Any) -> Proc:
    proc = await asyncio.to_thread(procs.broker, 1, data_dir, fc.address,
                                   sets={"broker.heartbeat.interval.ms": 200, **sets})
    await fc.wait_registered([1])
    return proc


def test_refuses_data_dir_of_another_node(tmp_path: Path) -> None:
    d = tmp_path / "b"
    d.mkdir()
    (d / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=x\n")
    r = subprocess.run([sys.executable, "-m", "cli.main", "broker", "--node-id", "2", "--listen", "127.0.0.1:0",
                        "--controller", "127.0.0.1:1", "--data-dir", str(d)], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "node.id=1" in r.stderr
    assert not (d / "endpoint").exists()


async def test_refuses_a_data_dir_another_broker_process_uses(tmp_path: Path, procs: Procs,
                                                               fc: FakeController) -> None:
    """Two processes appending to one log would fork it: the data dir is locked (Kafka's lockLogDirs)."""
    d = tmp_path / "b"
    first = await start(procs, fc, d)
    endpoint = (d / "endpoint").read_text()
    r = subprocess.run([sys.executable, "-m", "cli.main", "broker", "--node-id", "1", "--listen", "127.0.0.1:0",
                        "--controller", fc.address, "--data-dir", str(d)], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "in use by another broker process" in r.stderr
    assert (d / "endpoint").read_text() == endpoint
    rpc = RpcClient(timeout_s=10)
    try:
        assert (await rpc.get_json(first.address, "/v1/status"))["node_id"] == 1
    finally:
        await rpc.close()


async def test_restart_restores_hw_and_logs(tmp_path: Path, procs: Procs, fc: FakeController) -> None:
    rpc = RpcClient(timeout_s=30)
    try:
        b = await start(procs, fc, tmp_path / "b1")
        await fc.elect(TP, leader=1, replicas=[1, 2])
        await rpc.call(b.address, "produce", produce_body(batch(3)))
        await rpc.call(b.address, "produce", produce_body(batch(2)))
        await rpc.call(b.address, "fetch", fetch_body(0, replica_id=2, broker_epoch=1))
        f = part(await rpc.call(b.address, "fetch", fetch_body(3, replica_id=2, broker_epoch=1)))
        assert f["high_watermark"] == 3
        assert await asyncio.to_thread(stop, b) == 0
        assert "t 0 3" in (tmp_path / "b1" / "replication-offset-checkpoint").read_text()
        assert fc.shutdown_requests, "controlled shutdown was asked for"

        del fc.brokers[1]
        b = await start(procs, fc, tmp_path / "b1")
        status = await rpc.get_json(b.address, "/v1/status")
        assert status["partitions"] == []  # no leadership until LeaderAndIsr
        # Kafka: a partition this broker does not know from metadata yet is UNKNOWN_TOPIC_OR_PARTITION
        assert part(await rpc.call(b.address, "produce", produce_body(batch())))["error"] == \
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        await fc.elect(TP, leader=1, replicas=[1, 2])
        sp = (await rpc.get_json(b.address, "/v1/status"))["partitions"][0]
        assert (sp["high_watermark"], sp["log_end_offset"], sp["leader_epoch"]) == (3, 5, 1)
        c = part(await rpc.call(b.address, "fetch", fetch_body(0)))
        assert [h.base_offset for _, h in iter_batches(c["records"])] == [0]
        f = part(await rpc.call(b.address, "fetch", fetch_body(0, replica_id=2, broker_epoch=1)))
        assert [h.base_offset for _, h in iter_batches(f["records"])] == [0, 3]
    finally:
        await rpc.close()


async def test_sigterm_fails_waiting_produce_and_exits_0(tmp_path: Path, procs: Procs, fc: FakeController) -> None:
    rpc = RpcClient(timeout_s=60)
    try:
        b = await start(procs, fc, tmp_path / "b1")
        await fc.elect(TP, leader=1, replicas=[1, 2])
        waiting = asyncio.create_task(rpc.call(b.address, "produce", produce_body(batch(), acks=-1)))
        deadline = asyncio.get_running_loop().time() + 30
        while (await rpc.get_json(b.address, "/v1/status"))["partitions"][0]["log_end_offset"] < 3:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        assert await asyncio.to_thread(stop, b) == 0
        r = part(await asyncio.wait_for(waiting, 30))
        assert ErrorCode(r["error"]).retriable and r["error"] != 0
        assert b.events("broker_stopped")
        # the broker fixed glibc's allocator thresholds at start (common/memory.py)
        assert [e["fixed"] for e in b.events("allocator_thresholds")] == [True]
    finally:
        await rpc.close()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if op < 0.5 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op < 0.7 and buf:
            del buf[rng.randrange(len(buf)):]
        elif op < 0.85:
            pos = rng.randrange(len(buf) + 1)
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        else:
            buf = bytearray(rng.randbytes(rng.randint(0, 64)))
    return bytes(buf)


def _fuzz_bodies(rng: random.Random, n: int) -> Iterator[tuple[str, bytes]]:
    good = batch(3)
    corrupt_records = [good[:-1] + bytes([good[-1] ^ 1]), good[:40], good + good[:10], rng.randbytes(80), b""]
    templates: list[tuple[str, dict[str, Any]]] = [
        ("fetch", {**fetch_body(0, max_wait_ms=0, min_bytes=0)}),
        ("fetch", {**fetch_body(0, replica_id=2, broker_epoch=1, min_bytes=0)}),
        ("list_offsets", {"replica_id": -1, "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "timestamp": -1}]}]}),
        ("offsets_for_leader_epoch", {"replica_id": 2, "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0}]}]}),
        ("metadata", {"topics": None}),
    ]
    for _ in range(n):
        if rng.random() < 0.4:
            body = produce_body(rng.choice(corrupt_records), acks=rng.choice([-1, 0, 1, 5]), timeout_ms=100)
            yield "produce", _mutate(rng, encode(body)) if rng.random() < 0.7 else encode(body)
        else:
            api, body = rng.choice(templates)
            yield api, _mutate(rng, encode(body))


def _log_files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((d / "t-0").iterdir()) if p.suffix == ".log"}


async def test_fuzz_live_broker(tmp_path: Path, procs: Procs, fc: FakeController) -> None:
    rpc = RpcClient(timeout_s=30)
    try:
        b = await start(procs, fc, tmp_path / "b1")
        await fc.elect(TP, leader=1, replicas=[1])
        for n in (3, 2, 4):
            assert part(await rpc.call(b.address, "produce", produce_body(batch(n))))["error"] == 0
        before = _log_files(b.data_dir)
        rng = random.Random(20261123)
        statuses: dict[int, int] = {}
        timeouts = 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            for api, body in _fuzz_bodies(rng, 3000):
                try:
                    async with s.post(f"http://{b.address}/v1/{api}", data=body) as resp:
                        await resp.read()
                        statuses[resp.status] = statuses.get(resp.status, 0) + 1
                except TimeoutError:
                    assert api == "fetch", "only a long-poll fetch (mutated wait) may take long"
                    timeouts += 1
        assert set(statuses) <= {200, 400}, statuses
        assert statuses.get(400, 0) > 100 and statuses.get(200, 0) > 100
        assert timeouts < 30
        assert b.alive()
        assert _log_files(b.data_dir) == before
        f = part(await rpc.call(b.address, "fetch", fetch_body(0)))
        assert f["error"] == 0 and f["log_end_offset"] == 9
        assert part(await rpc.call(b.address, "produce", produce_body(batch())))["base_offset"] == 9
        assert not b.events("request_failed")
        assert await asyncio.to_thread(stop, b) == 0
    finally:
        await rpc.close()


async def test_periodic_hw_checkpoint_survives_sigkill(tmp_path: Path, procs: Procs, fc: FakeController) -> None:
    rpc = RpcClient(timeout_s=30)
    try:
        b = await start(procs, fc, tmp_path / "b1", **{"replica.high.watermark.checkpoint.interval.ms": 100})
        await fc.elect(TP, leader=1, replicas=[1])
        await rpc.call(b.address, "produce", produce_body(batch(4)))
        ckpt = tmp_path / "b1" / "replication-offset-checkpoint"
        deadline = asyncio.get_running_loop().time() + 30
        while not (ckpt.exists() and "t 0 4" in ckpt.read_text()):
            assert asyncio.get_running_loop().time() < deadline, "HW checkpoint not written on its interval"
            await asyncio.sleep(0.05)
        await asyncio.to_thread(kill, b)
        del fc.brokers[1]
        b = await start(procs, fc, tmp_path / "b1")
        await fc.elect(TP, leader=1, replicas=[1, 2], isr=[1, 2])  # HW cannot advance without broker 2
        sp = (await rpc.get_json(b.address, "/v1/status"))["partitions"][0]
        assert (sp["high_watermark"], sp["log_end_offset"]) == (4, 4)
    finally:
        await rpc.close()
