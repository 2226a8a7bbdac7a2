"""``chaos run`` stopped by a signal, and its bounds, with real processes: Ctrl-C (twice) and SIGTERM stop the
workload, undo the fault in progress, stop a cluster the run started (or leave a running one healed), keep
the history whole and exit 128 + the signal with one line; an absurd --duration is refused before anything
starts; against a running cluster the pauses are drawn from its controller's session timeout."""

from __future__ import annotations

import argparse
import json
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import cluster as cl
from cli.chaos import MAX_DURATION_S, _session_timeout_ms
from cli.main import build_parser
from tests.cli.helpers import free_base_port, kill_pids, member_pids, minibroker, subcommands

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    data, out = tmp_path / "cluster", tmp_path / "out"
    try:
        yield data, out
    finally:  # whatever happened: stop what the cluster recorded, then anything else running there (by pid)
        if (data / cl.CLUSTER_FILE).exists():
            cl.stop_cluster(cl.load(data), timeout_s=10)
        kill_pids(member_pids(data))


def start_chaos(data: Path, out: Path, base: int, *extra: str) -> subprocess.Popen[str]:
    # stdout and stderr in one pipe, read as it comes: a full stderr pipe would stall the run
    return subprocess.Popen([*minibroker(), "chaos", "run", "--faults", "pause", "--duration", "120",
                             "--data-dir", str(data), "--out", str(out), "--base-port", str(base), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(proc: subprocess.Popen[str], pattern: str, timeout_s: float = 60) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if not ready:
            continue
        line = proc.stdout.readline()
        assert line, "chaos run ended early:\n" + "".join(lines)
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"no line matching {pattern!r} within {timeout_s} s:\n" + "".join(lines))


def finish(proc: subprocess.Popen[str], seen: list[str]) -> str:
    try:
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return "".join(seen) + rest


def check_history(path: Path) -> list[dict[str, object]]:
    text = path.read_text()
    assert text.endswith("\n")
    events = [json.loads(line) for line in text.splitlines()]  # every line whole
    sends = [e for e in events if e["type"] == "send"]
    assert sends and all(e["outcome"] in ("ok", "fail", "info") for e in sends)
    return events


def test_ctrl_c_twice_stops_heals_and_stops_the_cluster_it_started(dirs: tuple[Path, Path]) -> None:
    """Ctrl-C while a broker is paused, and again while the run cleans up: exit 130 with one line, no
    traceback; the paused broker was resumed (a heal event), the cluster stopped, the history whole. Once
    the run hung for good here, the broker left SIGSTOPped and the cluster running."""
    data, out = dirs
    proc = start_chaos(data, out, free_base_port(), "--session-timeout-ms", "1000", "--seed", "3")
    seen = read_until(proc, r"^\[.*\] pause ")
    victim = re.search(r"pause\s+(broker-\d+)", seen[-1])
    assert victim is not None
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # a second Ctrl-C: noted, the cleanup goes on
    text = finish(proc, seen)
    assert proc.returncode == 130, text
    assert "Traceback" not in text
    final = [line for line in text.splitlines() if line.startswith("minibroker:")]
    assert len(final) == 1 and "chaos run stopped by SIGINT" in final[0] and "cluster stopped" in final[0], text
    assert member_pids(data) == []
    events = check_history(out / "history.jsonl")
    heals = [e for e in events if e["type"] == "nemesis" and e["fault"] == "heal"]
    assert any(e["target"] == victim[1] and e["detail"] == "SIGCONT" for e in heals), heals
    assert not (out / "summary.json").exists()


def test_sigterm_heals_a_running_cluster_and_leaves_it_running(dirs: tuple[Path, Path]) -> None:
    """SIGTERM (`timeout 60 minibroker chaos run`) during a pause, against a cluster started beforehand: the
    paused broker is resumed and the cluster left running, exit 143 with one line. The pause outlasts the
    session timeout the running controller has (its cluster.json), not --session-timeout-ms's default."""
    data, out = dirs
    base = free_base_port()
    subprocess.run([*minibroker(), "cluster", "up", "--detach", "--data-dir", str(data), "--base-port", str(base),
                    "--controller-set", "broker.session.timeout.ms=1500", "--set", "broker.heartbeat.interval.ms=500"],
                   check=True, capture_output=True, timeout=90)
    proc = start_chaos(data, out, base, "--seed", "3")
    seen = read_until(proc, r"^\[.*\] pause ")
    assert any("broker.session.timeout.ms=1500" in line for line in seen), "".join(seen)
    hold = re.search(r"hold ([\d.]+)s", seen[-1])
    assert hold is not None and 2.5 <= float(hold[1]) <= 4.5, seen[-1]  # 1.5 s + 1-3 s
    proc.send_signal(signal.SIGTERM)
    text = finish(proc, seen)
    assert proc.returncode == 143, text
    assert "Traceback" not in text
    final = [line for line in text.splitlines() if line.startswith("minibroker:")]
    assert len(final) == 1 and "stopped by SIGTERM" in final[0] and "left running" in final[0], text
    spec = cl.load(data)
    assert all(cl.is_running(m) and not cl._is_stopped(m) for m in spec.members)
    check_history(out / "history.jsonl")


def test_an_absurd_duration_is_refused_before_anything_starts(dirs: tuple[Path, Path]) -> None:
    """--duration 1e12 once started a cluster, then built its fault schedule until memory ran out."""
    data, out = dirs
    proc = subprocess.run([*minibroker(), "chaos", "run", "--duration", "1e12", "--data-dir", str(data),
                           "--out", str(out), "--base-port", str(free_base_port())],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert f"--duration must be at most {MAX_DURATION_S} s" in proc.stderr and "Traceback" not in proc.stderr
    assert not data.exists() and not out.exists()
    run_help = subcommands(subcommands(build_parser())["chaos"])["run"].format_help()
    assert f"at most {MAX_DURATION_S}" in " ".join(run_help.split())


def test_a_running_clusters_session_timeout_comes_from_its_cluster_file(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(session_timeout_ms=6000)
    base = free_base_port()
    cl.save(cl.plan(tmp_path, 3, base, controller_settings=["broker.session.timeout.ms=12000"]))
    assert _session_timeout_ms(args, tmp_path, starting=False, explicit=True) == 12000
    assert "--session-timeout-ms 6000 applies only to a cluster this run starts" in capsys.readouterr().out
    cl.save(cl.plan(tmp_path, 3, base))  # no setting: the controller's default
    assert _session_timeout_ms(args, tmp_path, starting=False, explicit=False) == 9000
    assert _session_timeout_ms(args, tmp_path, starting=True, explicit=False) == 6000  # a cluster it starts
    doc = json.loads((tmp_path / cl.CLUSTER_FILE).read_text())
    doc["controller_settings"] = ["broker.session.timeout.ms=soon"]  # hand-edited: cannot tell
    (tmp_path / cl.CLUSTER_FILE).write_text(json.dumps(doc))
    capsys.readouterr()
    assert _session_timeout_ms(args, tmp_path, starting=False, explicit=False) == 6000
    assert "pauses hold a broker 6000 ms + 1-3 s, which may not outlast it" in capsys.readouterr().err
