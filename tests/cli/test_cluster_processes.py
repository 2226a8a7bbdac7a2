"""``cluster up/status/kill/start/down`` with real processes (stand-ins with the same command line and
status API, run through ``--exec``; the real broker/controller are exercised by test_e2e_cluster)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp

from cli import cluster
from tests.cli.fake_processes import START_DELAY_ENV
from tests.cli.helpers import FAKE, free_base_port, minibroker, run


async def status_of(data_dir: Path) -> dict[str, dict[str, Any]]:
    code, out, err = await run("cluster", "status", "--json", "--data-dir", str(data_dir))
    assert code == 0, err
    return {m["name"]: m for m in json.loads(out)["members"]}


async def test_up_status_kill_start_down(data_dir: Path) -> None:
    base = free_base_port(3)
    code, out, err = await run("cluster", "up", "--detach", "--brokers", "2", "--base-port", str(base),
                               "--data-dir", str(data_dir), "--exec", FAKE, "--timeout", "30")
    assert code == 0, err
    assert f"MINIBROKER_BOOTSTRAP=127.0.0.1:{base + 1},127.0.0.1:{base + 2}" in out
    doc = json.loads((data_dir / "cluster.json").read_text())
    assert [m["port"] for m in doc["members"]] == [base, base + 1, base + 2]
    assert all(m["pid"] for m in doc["members"])
    assert (data_dir / "broker-1.log").exists() and (data_dir / "controller").is_dir()

    members = await status_of(data_dir)
    assert all(m["running"] and m["responding"] for m in members.values())
    assert members["controller"]["registered_brokers"] == [1, 2]

    code, _, err = await run("cluster", "up", "--detach", "--brokers", "2", "--base-port", str(base),
                             "--data-dir", str(data_dir), "--exec", FAKE)
    assert code == 2 and "already running" in err

    code, _, err = await run("cluster", "kill", "1", "--signal", "STOP", "--data-dir", str(data_dir))
    assert code == 0, err
    assert (await status_of(data_dir))["broker-1"]["paused"]
    code, _, err = await run("cluster", "kill", "1", "--signal", "CONT", "--data-dir", str(data_dir))
    assert code == 0, err

    old_pid = members["broker-1"]["pid"]
    code, _, err = await run("cluster", "kill", "1", "--data-dir", str(data_dir))  # SIGKILL by default
    assert code == 0, err
    for _ in range(100):
        if not (await status_of(data_dir))["broker-1"]["running"]:
            break
        await asyncio.sleep(0.05)
    assert not (await status_of(data_dir))["broker-1"]["running"]
    code, _, err = await run("cluster", "kill", "1", "--data-dir", str(data_dir))
    assert code == 2 and "not running" in err

    # the controller still lists the killed broker-1, unfenced at its old epoch (a real one until its
    # session times out): start must wait for the new process to serve at its new epoch, slow as it starts
    os.environ[START_DELAY_ENV] = "1"
    try:
        code, out, err = await run("cluster", "start", "1", "--data-dir", str(data_dir))
    finally:
        del os.environ[START_DELAY_ENV]
    assert code == 0, err
    members = await status_of(data_dir)
    assert members["broker-1"]["running"] and members["broker-1"]["pid"] != old_pid
    assert members["broker-1"]["responding"]
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{base + 1}/v1/status") as resp:
        assert (await resp.json())["broker_epoch"] == 3  # registered again: 1 and 2 went to the first start
    code, _, err = await run("cluster", "start", "broker-1", "--data-dir", str(data_dir))
    assert code == 2 and "already running" in err

    code, _, err = await run("cluster", "kill", "controller", "--signal", "TERM", "--data-dir", str(data_dir))
    assert code == 0, err
    for _ in range(100):
        if not (await status_of(data_dir))["controller"]["running"]:
            break
        await asyncio.sleep(0.05)
    code, out, err = await run("cluster", "start", "controller", "--data-dir", str(data_dir))
    assert code == 0, err
    assert (await status_of(data_dir))["controller"]["responding"]  # start waited for it to answer

    code, out, err = await run("cluster", "down", "--data-dir", str(data_dir))
    assert code == 0, err
    assert not any(m["running"] for m in (await status_of(data_dir)).values())
    code, out, _ = await run("cluster", "status", "--data-dir", str(data_dir))
    assert code == 0 and "down" in out


async def test_foreground_up_streams_logs_and_ctrl_c_stops_everything(data_dir: Path) -> None:
    base = free_base_port(2)
    proc = await asyncio.create_subprocess_exec(
        *minibroker(), "cluster", "up", "--brokers", "1", "--base-port", str(base), "--data-dir", str(data_dir),
        "--exec", FAKE, "--timeout", "30", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        seen = b""
        while b"Ctrl-C stops the cluster" not in seen:
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert line, seen.decode()
            seen += line
        spec = cluster.load(data_dir)
        assert all(cluster.is_running(m) for m in spec.members)
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 60)
        assert proc.returncode == 0
        assert not any(cluster.is_running(m) for m in spec.members)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
