"""Chaos: the pure schedule, and a short real run (kills, a pause past the session timeout) then
export and audit: zero violations and thousands of acknowledged writes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from audit.export import export
from audit.spark_audit import Status, format_summary, run_audit
from cli import cluster as cl
from cli.chaos import DEFAULT_FAULTS, _faults, schedule
from cli.main import CliError
from tests.cli.helpers import free_base_port

ROOT = Path(__file__).resolve().parents[2]
BROKERS = ["broker-1", "broker-2", "broker-3"]


@pytest.mark.parametrize("seed", range(20))
def test_schedule_is_seeded_bounded_and_sequential(seed: int) -> None:
    plan = schedule(seed, 120, DEFAULT_FAULTS, BROKERS, session_timeout_s=6)
    assert plan == schedule(seed, 120, DEFAULT_FAULTS, BROKERS, session_timeout_s=6)
    assert plan, "a two-minute run injects faults"
    end = 0.0
    for f in plan:
        assert f.kind in DEFAULT_FAULTS
        assert f.at_s >= end  # one fault at a time: the previous one is healed first
        end = f.at_s + f.hold_s
        assert end <= 120 - 5  # the last seconds are quiet
        if f.kind == "pause":
            assert f.hold_s > 6 and f.target in BROKERS  # a zombie: paused past the session timeout
        if f.kind == "controller":
            assert f.target == "controller"
        if f.kind in ("kill", "term"):
            assert f.target in [*BROKERS, "leader"]


def test_schedule_uses_only_the_requested_faults() -> None:
    plan = schedule(3, 300, ("pause",), BROKERS, session_timeout_s=2)
    assert {f.kind for f in plan} == {"pause"}


def test_leaders_fault_targets_the_current_leader() -> None:
    plan = schedule(9, 120, ("leaders",), BROKERS, session_timeout_s=6)
    assert plan and all(f.kind == "leaders" and f.target == "leader" for f in plan)


def test_fault_list_is_checked() -> None:
    assert _faults("kill, pause") == ("kill", "pause")
    assert _faults("leaders") == ("leaders",)
    with pytest.raises(CliError, match="comma list"):
        _faults("kill,explode")
    assert _faults("partition,kill") == ("partition", "kill")  # run-time checks: tests/chaos/test_netns.py


@pytest.fixture
def chaos_dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    data, out = tmp_path / "cluster", tmp_path / "out"
    try:
        yield data, out
    finally:  # whatever happened, stop every process the run recorded (by pid)
        if (data / cl.CLUSTER_FILE).exists():
            spec = cl.load(data)
            cl.stop_members(list(reversed(spec.members)), timeout_s=10)


def run_chaos(data: Path, out: Path, duration: int, seed: int, timeout_s: float) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "cli.main", "chaos", "run", "--duration", str(duration),
                           "--seed", str(seed), "--data-dir", str(data), "--out", str(out),
                           "--base-port", str(free_base_port()), "--heal-timeout", "60",
                           "--inflight", "4"],  # thousands of acks, not 100k: keeps export + audit short
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "summary: acked" in proc.stdout
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def test_short_chaos_run_then_export_and_audit(chaos_dirs: tuple[Path, Path], spark: Any) -> None:
    data, out = chaos_dirs
    summary = run_chaos(data, out, duration=30, seed=5, timeout_s=170)  # seed 5: a zombie pause, a leader kill
    assert summary["isr_full_at_end"] is True
    assert summary["faults_injected"] >= 2
    assert {f.split(":")[0] for f in summary["faults"]} >= {"pause", "kill"}
    assert summary["acked"] >= 2_000
    assert summary["final_read"] >= summary["acked"]
    export([data], out / "export", history=out)
    report = run_audit(spark, out / "export")
    assert report.ok, format_summary(report)
    assert report.stats["acked"] == summary["acked"]
    assert report.check("unseen_writes").status is Status.OK
    assert report.check("lost_writes").status is Status.OK


@pytest.mark.slow
def test_sixty_second_chaos_script_end_to_end(tmp_path: Path) -> None:
    """scripts/chaos.sh: 60 s of every fault, export, audit in its own Spark; exit 0 means no violation."""
    data, out = tmp_path / "cluster", tmp_path / "out"
    env = {"CHAOS_DIR": str(data), "CHAOS_OUT": str(out), "SPARK_MASTER": "local[2]", "PATH": "/usr/bin:/bin"}
    try:
        proc = subprocess.run(["bash", "scripts/chaos.sh", "60", "7", "--base-port", str(free_base_port()),
                               "--inflight", "8"],
                              cwd=ROOT, capture_output=True, text=True, timeout=175, check=False,
                              env=env)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
        assert "RESULT: ok, no violations" in proc.stdout
        assert json.loads((out / "summary.json").read_text())["acked"] >= 2_000
    finally:
        if (data / cl.CLUSTER_FILE).exists():
            cl.stop_members(list(reversed(cl.load(data).members)), timeout_s=10)
