"""``cluster up`` under signals and concurrent ``cluster`` commands, with real processes (the stand-ins of
fake_processes.py, via ``--exec``): no member is ever left running that nothing records, SIGTERM and SIGHUP
stop a cluster as Ctrl-C does, the brokers stop before the controller, and the cluster lock keeps concurrent
commands from losing a pid."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import cluster
from cli.main import CliError
from tests.cli.fake_processes import SHUTDOWN_ENV, START_DELAY_ENV
from tests.cli.helpers import FAKE, free_base_port, kill_pids, member_pids, minibroker, run

PROC = Path("/proc")


@pytest.fixture
def cleanup() -> Iterator[list[Path]]:
    """Cluster dirs a test used: every process found running there afterwards is killed (by pid)."""
    dirs: list[Path] = []
    try:
        yield dirs
    finally:
        for d in dirs:
            kill_pids(member_pids(d))


def recorded_pids(data_dir: Path) -> dict[str, int | None]:
    try:
        doc = json.loads((data_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return {}
    return {m["name"]: m["pid"] for m in doc["members"]}


def up_argv(data_dir: Path, brokers: int, *extra: str) -> list[str]:
    return [*minibroker(), "cluster", "up", "--brokers", str(brokers), "--base-port", str(free_base_port(brokers + 1)),
            "--data-dir", str(data_dir), "--exec", FAKE, "--timeout", "30", *extra]


# -- a signal between fork and exec ------------------------------------------------------------------

def _read(path: Path) -> bytes:
    return path.read_bytes()


def _stopped(pid: int) -> bool:
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def catch_a_member_before_exec(proc: subprocess.Popen[bytes], timeout_s: float = 10) -> int | None:
    """A child of ``proc`` (``cluster up``) caught and SIGSTOPped between fork and exec (its command line
    still ``proc``'s): ``proc`` is held inside ``Popen`` until the child goes on. None if none was caught."""
    me = PROC / str(proc.pid)
    try:
        parent = _read(me / "cmdline")
    except OSError:
        return None
    children = me / "task" / str(proc.pid) / "children"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            kids = children.read_text().split()
        except OSError:
            return None
        for kid in map(int, kids):
            try:
                if _read(PROC / str(kid) / "cmdline") != parent:
                    continue
                os.kill(kid, signal.SIGSTOP)
            except OSError:
                continue
            end = time.monotonic() + 2
            while not _stopped(kid) and time.monotonic() < end:
                time.sleep(0.001)
            try:
                before_exec = _stopped(kid) and _read(PROC / str(kid) / "cmdline") == parent
            except OSError:
                before_exec = False
            if before_exec:
                return kid
            os.kill(kid, signal.SIGCONT)  # too late: it had exec'd already
    return None


@pytest.mark.skipif(not (PROC / "self" / "task").exists(), reason="needs /proc")
def test_ctrl_c_between_fork_and_exec_leaves_no_member_unrecorded(tmp_path: Path, cleanup: list[Path]) -> None:
    """Ctrl-C lands while a member is being spawned (after fork, before its pid is recorded): up must still
    stop it. Once the interrupt was raised inside Popen, and up deleted cluster.json around a running orphan."""
    for attempt in range(10):
        d = tmp_path / f"c{attempt}"
        cleanup.append(d)
        proc = subprocess.Popen(up_argv(d, 3), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            child = catch_a_member_before_exec(proc)
            if child is None:  # every member started before one was caught: stop them, try again
                proc.send_signal(signal.SIGINT)
                proc.communicate(timeout=60)
                continue
            proc.send_signal(signal.SIGINT)  # pending while the child holds proc in Popen
            os.kill(child, signal.SIGCONT)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 130, err.decode()
            assert "Traceback" not in err.decode()
            assert member_pids(d) == [], f"left running: {member_pids(d)}; stderr: {err.decode()}"
            assert not d.exists()  # a start interrupted before every member ran leaves nothing behind
            return
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    pytest.skip("no member could be caught between fork and exec")


# -- SIGTERM and SIGHUP --------------------------------------------------------------------------------

def _sighup_default() -> None:
    """In the child before exec: SIGHUP as its default again. A suite run under ``nohup`` hands an ignored
    SIGHUP down, which ``up`` rightly keeps ignoring (test_sighup_ignored_at_start_stays_ignored)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
async def test_a_signal_while_starting_stops_what_started(data_dir: Path, sig: signal.Signals) -> None:
    """Every member spawned, the brokers not registered yet (a slow start): SIGTERM / SIGHUP stop them all."""
    proc = await asyncio.create_subprocess_exec(*up_argv(data_dir, 2), stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE, preexec_fn=_sighup_default,
                                                env={**os.environ, START_DELAY_ENV: "30"})
    try:
        for _ in range(300):
            pids = recorded_pids(data_dir)
            if len(pids) == 3 and all(pids.values()):
                break
            await asyncio.sleep(0.05)
        assert len(pids) == 3 and all(pids.values()), pids
        proc.send_signal(sig)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 128 + sig, err.decode()
        assert f"{sig.name} while starting the cluster" in err.decode() and "Traceback" not in err.decode()
        assert member_pids(data_dir) == []
        assert not any(cluster.is_running(m) for m in cluster.load(data_dir).members)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _foreground(data_dir: Path, brokers: int, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(*up_argv(data_dir, brokers), stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE, preexec_fn=_sighup_default,
                                                env={**os.environ, **(env or {})})
    assert proc.stderr is not None
    seen = b""
    while b"Ctrl-C stops the cluster" not in seen:
        line = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert line, seen.decode()
        seen += line
    return proc


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
async def test_a_signal_in_the_foreground_stops_the_cluster(data_dir: Path, sig: signal.Signals) -> None:
    """A closed terminal (SIGHUP) or SIGTERM stops a foreground cluster as Ctrl-C does."""
    proc = await _foreground(data_dir, 1)
    try:
        spec = cluster.load(data_dir)
        assert all(cluster.is_running(m) for m in spec.members)
        proc.send_signal(sig)
        await asyncio.wait_for(proc.wait(), 60)
        assert proc.returncode == 0
        assert member_pids(data_dir) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_sighup_ignored_at_start_stays_ignored(tmp_path: Path, cleanup: list[Path]) -> None:
    """Under ``nohup`` (SIGHUP ignored) a foreground cluster keeps running when the terminal goes away."""
    d = tmp_path / "c"
    cleanup.append(d)
    proc = subprocess.Popen(["nohup", *up_argv(d, 1)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    try:
        assert proc.stderr is not None
        seen = b""
        while b"Ctrl-C stops the cluster" not in seen:
            line = proc.stderr.readline()
            assert line, seen.decode()
            seen += line
        proc.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        assert all(cluster.is_running(m) for m in cluster.load(d).members)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert member_pids(d) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


# -- stop order ----------------------------------------------------------------------------------------

async def test_ctrl_c_stops_the_brokers_before_the_controller(data_dir: Path) -> None:
    """A broker's controlled shutdown asks the controller (here: after 0.5 s of "moving leaderships"): on
    Ctrl-C the controller must still answer then. Once every member got SIGTERM at the same moment."""
    proc = await _foreground(data_dir, 2, env={SHUTDOWN_ENV: "0.5"})
    try:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 60)
        assert proc.returncode == 0
        for i in (1, 2):
            log = (data_dir / f"broker-{i}.log").read_text()
            assert "controlled shutdown: controller answered 200" in log, log
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_stop_cluster_stops_brokers_first(tmp_path: Path, cleanup: list[Path]) -> None:
    """The one stop function (down, Ctrl-C on up, demo, chaos run): the controller outlives the brokers."""
    d = tmp_path / "c"
    cleanup.append(d)
    subprocess.run(up_argv(d, 2, "--detach"), check=True, capture_output=True, timeout=60,
                   env={**os.environ, SHUTDOWN_ENV: "0.5"})
    assert cluster.stop_cluster(cluster.load(d), timeout_s=10) == []
    for i in (1, 2):
        assert "controlled shutdown: controller answered 200" in (d / f"broker-{i}.log").read_text()


# -- concurrent commands -------------------------------------------------------------------------------

async def test_concurrent_starts_keep_every_pid(data_dir: Path) -> None:
    """`cluster start 1` and `cluster start 2` at once: each pid stays recorded (once one save overwrote the
    other's, and a shared temp file name made one of them crash)."""
    code, _, err = await run(*up_argv(data_dir, 2, "--detach")[len(minibroker()):])
    assert code == 0, err
    for _ in range(5):
        for i in ("1", "2"):
            code, _, err = await run("cluster", "kill", i, "--data-dir", str(data_dir))
            assert code == 0, err
        for _ in range(200):
            if not any(cluster.is_running(m) for m in cluster.load(data_dir).brokers):
                break
            await asyncio.sleep(0.02)
        results = await asyncio.gather(*(run("cluster", "start", i, "--no-wait", "--data-dir", str(data_dir))
                                         for i in ("1", "2")))
        for code, _, err in results:
            assert code == 0 and "Traceback" not in err, err
        spec = cluster.load(data_dir)
        assert all(cluster.is_running(m) for m in spec.members), recorded_pids(data_dir)
        assert sorted(member_pids(data_dir)) == sorted(m.pid for m in spec.members)


async def test_two_ups_on_one_dir_one_wins_cleanly(tmp_path: Path, cleanup: list[Path]) -> None:
    """Two `cluster up --detach` on one directory at once: one starts the cluster, the other fails in one
    line; the winner's cluster.json stays and records every process (once the loser crashed with a
    traceback and its cleanup deleted the winner's cluster.json)."""
    for attempt in range(3):
        d = tmp_path / f"c{attempt}"
        cleanup.append(d)
        argv = up_argv(d, 2, "--detach")[len(minibroker()):]
        try:
            results = await asyncio.gather(run(*argv), run(*argv))
            assert sorted(code for code, _, _ in results) == [0, 2], results
            _, _, err = next(r for r in results if r[0] == 2)
            assert "Traceback" not in err
            assert err.strip().splitlines()[-1].startswith("minibroker: error:"), err
            spec = cluster.load(d)
            assert all(cluster.is_running(m) for m in spec.members)
            assert sorted(member_pids(d)) == sorted(m.pid for m in spec.members)
        finally:
            if (d / "cluster.json").exists():
                await run("cluster", "down", "--data-dir", str(d), "--timeout", "5")


async def test_a_command_waits_for_the_lock(data_dir: Path) -> None:
    """`cluster kill` while another command holds the cluster lock: it waits for it, then goes on."""
    code, _, err = await run(*up_argv(data_dir, 1, "--detach")[len(minibroker()):])
    assert code == 0, err
    with cluster.cluster_lock(data_dir):
        killer = asyncio.create_task(run("cluster", "kill", "1", "--signal", "STOP", "--data-dir", str(data_dir)))
        await asyncio.sleep(1.0)
        assert not killer.done()
        assert not cluster._is_stopped(cluster.load(data_dir).member("1"))
    code, _, err = await asyncio.wait_for(killer, 60)
    assert code == 0, err
    code, _, err = await run("cluster", "kill", "1", "--signal", "CONT", "--data-dir", str(data_dir))
    assert code == 0, err


# -- `cluster kill None` -------------------------------------------------------------------------------

async def test_none_is_not_the_controller(tmp_path: Path) -> None:
    cluster.save(cluster.plan(tmp_path, 2, free_base_port(3)))
    with pytest.raises(CliError, match="no cluster member 'None'"):
        cluster.load(tmp_path).member("None")
    code, _, err = await run("cluster", "kill", "None", "--data-dir", str(tmp_path))
    assert code == 2 and err.startswith("minibroker: error: no cluster member 'None'"), err
    assert cluster.load(tmp_path).member("controller").kind == "controller"
    assert cluster.load(tmp_path).member("2").name == "broker-2"
