"""End to end through the CLI with real processes: ``cluster up`` (controller + 3 brokers), an RF=3
topic with min.insync.replicas=2, 10k lines produced with acks=all while the leader of a partition is
SIGKILLed and later restarted; then everything is consumed from the beginning: every acknowledged line
is there, at the offset its delivery report gave, and each partition holds its lines in send order."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cli.main import build_parser
from tests.cli.helpers import free_base_port, kill_recorded, minibroker, run, subcommands

LINES = 10_000
TOPIC = "e2e"

pytestmark = pytest.mark.skipif(
    not {"broker", "controller"} <= set(subcommands(build_parser()))
    or importlib.util.find_spec("storage.log_manager") is None,
    reason="broker/controller processes (or the storage they need) are not in this tree yet")


@pytest.fixture
async def cluster_dir(tmp_path: Path) -> AsyncIterator[tuple[Path, int]]:
    data_dir = tmp_path / "cluster"
    base = free_base_port()
    settings = ["--set", "broker.session.timeout.ms=3000", "--set", "broker.heartbeat.interval.ms=500",
                "--controller-set", "broker.session.timeout.ms=3000"]
    status, _, err = await run("cluster", "up", "--detach", "--data-dir", str(data_dir), "--base-port", str(base),
                               "--brokers", "3", "--timeout", "90", *settings, timeout_s=120)
    try:
        assert status == 0, err
        yield data_dir, base
    finally:
        await run("cluster", "down", "--data-dir", str(data_dir), "--timeout", "15", timeout_s=60)
        kill_recorded(data_dir)


async def describe(base: int) -> dict[str, Any]:
    status, out, err = await run("topics", "describe", TOPIC, "--json", "--controller", f"127.0.0.1:{base}")
    assert status == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


async def test_acked_lines_survive_a_leader_sigkill_and_restart(cluster_dir: tuple[Path, int]) -> None:
    data_dir, base = cluster_dir
    controller = f"127.0.0.1:{base}"
    bootstrap = ",".join(f"127.0.0.1:{base + i}" for i in (1, 2, 3))
    status, out, err = await run("cluster", "status", "--json", "--data-dir", str(data_dir))
    assert status == 0, err
    assert all(m["running"] for m in json.loads(out)["members"])
    status, _, err = await run("topics", "create", TOPIC, "--partitions", "3", "--replication-factor", "3",
                               "--config", "min.insync.replicas=2", "--controller", controller)
    assert status == 0, err
    doc = await describe(base)
    (topic,) = doc["topics"]
    assert [p["partition"] for p in topic["partitions"]] == [0, 1, 2]
    assert all(len(p["replicas"]) == 3 and p["leader"] in p["replicas"] for p in topic["partitions"])
    victim = topic["partitions"][0]["leader"]

    env = {**os.environ, "MINIBROKER_BOOTSTRAP": bootstrap}
    # a consumer that reads while the leader dies and comes back (stops after 8 s without data)
    live = asyncio.create_task(run("consume", TOPIC, "--from-beginning", "--format", "json", "--timeout-ms", "8000",
                                   "--bootstrap", bootstrap, timeout_s=170))
    producer = await asyncio.create_subprocess_exec(
        *minibroker(), "produce", TOPIC, "--acks", "all", "--delivery-report", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    assert producer.stdin is not None
    try:
        assert producer.stdout is not None and producer.stderr is not None
        out_task = asyncio.create_task(producer.stdout.read())
        err_task = asyncio.create_task(producer.stderr.read())
        for chunk in range(20):
            producer.stdin.write(b"".join(f"line-{i:05d}\n".encode()
                                          for i in range(chunk * 500, (chunk + 1) * 500)))
            await producer.stdin.drain()
            await asyncio.sleep(0.3)  # ~6 s of steady producing: the kill, the failover and the restart land mid-stream
            if chunk == 4:
                status, _, err = await run("cluster", "kill", str(victim), "--signal", "KILL",
                                           "--data-dir", str(data_dir))
                assert status == 0, err
            if chunk == 15:
                status, _, err = await run("cluster", "start", str(victim), "--data-dir", str(data_dir),
                                           timeout_s=120)
                assert status == 0, err
        producer.stdin.close()
        out = (await asyncio.wait_for(out_task, 150)).decode()
        err = (await asyncio.wait_for(err_task, 30)).decode()
        await asyncio.wait_for(producer.wait(), 30)
    except BaseException:
        live.cancel()  # run() kills its process when cancelled
        raise
    finally:
        if producer.returncode is None:
            producer.kill()
            await producer.wait()
    reports = [json.loads(line) for line in out.splitlines()]
    assert len(reports) == LINES, err
    acked = {r["value"]: (r["partition"], r["offset"]) for r in reports if "offset" in r}
    assert len(acked) > LINES // 2, f"too few acknowledged: {len(acked)}; {err[-500:]}"

    status, out, err = await run("consume", TOPIC, "--from-beginning", "--format", "json", "--timeout-ms", "5000",
                                 "--bootstrap", bootstrap, timeout_s=120)
    assert status == 0, err
    consumed = [json.loads(line) for line in out.splitlines()]
    at = {(r["partition"], r["offset"]): r["value"] for r in consumed}
    missing = [v for v, pos in acked.items() if at.get(pos) != v]
    assert not missing, f"{len(missing)} acknowledged lines missing, e.g. {missing[:3]}"
    status, out, err = await live
    assert status == 0, err
    live_records = [json.loads(line) for line in out.splitlines()]
    live_positions = [(r["partition"], r["offset"]) for r in live_records]
    assert len(live_positions) == len(set(live_positions)), "the live consumer returned a record twice"
    assert sorted(live_positions) == sorted(at), "the live consumer saw a different log than the later one"
    for p in (0, 1, 2):
        offsets = [r["offset"] for r in consumed if r["partition"] == p]
        assert offsets == sorted(offsets) and len(offsets) == len(set(offsets))
        firsts: list[int] = []
        seen: set[str] = set()
        for r in consumed:
            if r["partition"] == p and r["value"] not in seen:
                seen.add(r["value"])
                firsts.append(int(r["value"].split("-")[1]))
        assert firsts == sorted(firsts), f"partition {p} out of send order"
    doc = await describe(base)
    for part in doc["topics"][0]["partitions"]:
        states = {s["broker"]: s for s in part["replica_states"]}
        assert sorted(states) == sorted(part["replicas"])
        offsets = [r["offset"] for r in consumed if r["partition"] == part["partition"]]
        assert states[part["leader"]]["hw"] == (max(offsets) + 1 if offsets else 0)
        assert states[part["leader"]]["leo"] >= states[part["leader"]]["hw"]
    new_leader = doc["topics"][0]["partitions"][0]["leader"]
    print(f"acked {len(acked)} of {LINES}, consumed {len(consumed)}; leader of {TOPIC}-0: {victim} -> {new_leader}",
          file=sys.stderr)
    await the_last_isr_member_stops_at_once_and_leads_again(data_dir, controller, bootstrap)


async def the_last_isr_member_stops_at_once_and_leads_again(data_dir: Path, controller: str, bootstrap: str) -> None:
    """SIGTERM a broker that leads an RF=1 partition: its leadership has nowhere to go, so the controller takes
    the partition offline with its ISR kept (KRaft) and the broker's controlled shutdown completes at once,
    where it used to wait out controlled.shutdown.max.wait.ms; started again, it leads with every record."""
    status, _, err = await run("topics", "create", "solo", "--partitions", "1", "--replication-factor", "1",
                               "--controller", controller)
    assert status == 0, err
    lines = b"".join(b"solo-%d\n" % i for i in range(20))
    status, _, err = await run("produce", "solo", "--acks", "all", "--bootstrap", bootstrap, stdin=lines)
    assert status == 0, err

    async def solo() -> dict[str, Any]:
        status, out, err = await run("topics", "describe", "solo", "--json", "--controller", controller)
        assert status == 0, err
        part: dict[str, Any] = json.loads(out)["topics"][0]["partitions"][0]
        return part

    leader = (await solo())["leader"]
    # `cluster stop` returns once the broker has exited (`kill --signal TERM` returned at once, and a
    # `cluster start` right after it found the broker still running)
    status, out, err = await run("cluster", "stop", str(leader), "--data-dir", str(data_dir), timeout_s=90)
    assert status == 0 and out.strip() == f"stopped broker-{leader}", (out, err)
    status, out, err = await run("cluster", "status", "--json", "--data-dir", str(data_dir))
    assert status == 0, err
    row = next(m for m in json.loads(out)["members"] if m["name"] == f"broker-{leader}")
    assert not row["running"], row
    status, _, err = await run("cluster", "stop", str(leader), "--data-dir", str(data_dir))
    assert status != 0 and f"broker-{leader} is not running" in err, err
    log_text = (data_dir / f"broker-{leader}.log").read_text()
    assert "controlled_shutdown_done" in log_text and "controlled_shutdown_timed_out" not in log_text
    part = await solo()
    assert part["leader"] in (None, -1) and part["isr"] == [leader], part
    status, _, err = await run("cluster", "restart", str(leader), "--data-dir", str(data_dir))  # not running: a start
    assert status == 0, err
    for _ in range(300):
        if (await solo())["leader"] == leader:
            break
        await asyncio.sleep(0.2)
    status, out, err = await run("consume", "solo", "--from-beginning", "--timeout-ms", "3000",
                                 "--bootstrap", bootstrap)
    assert status == 0, err
    assert out.splitlines() == [f"solo-{i}" for i in range(20)]
    # a rolling restart's step: stopped (controlled shutdown: no leaderships left behind) and started again
    status, out, err = await run("cluster", "restart", str(leader), "--data-dir", str(data_dir), timeout_s=150)
    assert status == 0 and f"stopped broker-{leader}" in out and f"started broker-{leader}" in out, (out, err)
    status, out, err = await run("consume", "solo", "--from-beginning", "--timeout-ms", "3000",
                                 "--bootstrap", bootstrap)
    assert status == 0 and out.splitlines() == [f"solo-{i}" for i in range(20)], err


async def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    """The README's main job: `minibroker demo` on its own cluster, exit 0 and a summary with no loss."""
    base = free_base_port()
    data_dir = tmp_path / "demo"
    try:
        status, out, err = await run("demo", "--records", "1500", "--base-port", str(base), "--data-dir",
                                     str(data_dir), timeout_s=170)
        assert status == 0, out + err
        assert "acknowledged but lost:   0" in out
        assert "SIGKILL broker" in out and "-> SIGKILL -> broker" in out
        assert "stopping the cluster" in out
    finally:
        kill_recorded(data_dir)
