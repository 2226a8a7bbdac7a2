"""``python -m fetcher.bench`` runs end to end (tiny sizes; figures are printed, never asserted), and its CPU
figures are computed right from made-up per-broker counters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.cpu_quota import CpuQuotas
from fetcher.bench import cpu_figures

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flight, retained", [(["--in-flight-per-broker", "2", "--set", "log.segment.bytes=262144"],
                                               "256"),
                                              (["--in-flight", "3"], "0")])
def test_fetcher_bench_runs(tmp_path: Path, flight: list[str], retained: str) -> None:
    out = subprocess.run([sys.executable, "-m", "fetcher.bench", "--batches", "6", "--rounds", "2", "--moves", "1",
                          "--move-interval-s", "0.2", "--retained-mb", retained, *flight,
                          "--work-dir", str(tmp_path / "work")],
                         cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["records_per_phase"] == 6000 and result["leader_moves"] == 1
    assert result["replication_ratio"] > 0 and result["follower_fetches_per_replicated_batch"] > 0
    assert len(result["replication_ratio_per_round"]) == 2 and min(result["replication_ratio_per_round"]) > 0
    assert result["replicated_brokers_page_faults_per_batch"] >= 0
    assert "replication_ratio_estimate_one_core_per_broker" in result
    assert ("per leader broker" in result["in_flight"]) == (flight[0] == "--in-flight-per-broker")
    assert result["log"].startswith("bounded") == (retained != "0")
    # the --set applies last: 256 KiB segments instead of --retained-mb's 64 MiB, so the ~0.5 MB that each
    # partition of the single broker received fill several segments
    segments = list((tmp_path / "work" / "broker4" / "single-0").glob("*.log"))
    assert (len(segments) > 1) == ("--set" in flight)


def test_cpu_figures_per_broker() -> None:
    """Broker 4 leads alone in the single phase (what brokers 1-3 spend meanwhile is reported apart); the
    estimate divides its CPU by the busiest of brokers 1-3."""
    single = {1: [0.01, 10.0], 2: [0.02, 0.0], 3: [0.0, 0.0], 4: [0.25, 400.0]}
    repl = {1: [0.30, 100.0], 2: [0.45, 200.0], 3: [0.25, 300.0], 4: [0.0, 0.0]}
    figures = cpu_figures(single, repl, 1000)
    assert figures["single_broker_cpu_ms_per_batch"] == 0.25
    assert figures["idle_replicated_brokers_cpu_ms_per_single_batch"] == 0.03
    assert figures["replicated_brokers_cpu_ms_per_batch"] == 1.0
    assert figures["busiest_replicated_broker_cpu_ms_per_batch"] == 0.45
    assert figures["replication_ratio_estimate_one_core_per_broker"] == 0.556
    assert figures["single_broker_page_faults_per_batch"] == 0.4
    assert figures["replicated_brokers_page_faults_per_batch"] == 0.6
    repl_idle = {n: [0.0, 0.0] for n in (1, 2, 3, 4)}  # a run too short for a 10 ms CPU tick
    assert cpu_figures(single, repl_idle, 10)["replication_ratio_estimate_one_core_per_broker"] is None


@pytest.mark.parametrize("args, message", [(["--set", "no.such.config=1"], "unknown config 'no.such.config'"),
                                           (["--set", "replica.fetch.min.bytes=lots"], "expected an integer"),
                                           (["--set", "novalue"], "expected key=value"),
                                           (["--cpu-per-broker", "0.01"], "0.01 CPUs: give between 0.1 and"),
                                           (["--rounds", "0"], "--rounds must be > 0"),
                                           (["--partitions", "0"], "--partitions must be > 0"),
                                           (["--fetch-wait-ms", "-1"], "--fetch-wait-ms must be >= 0")])
def test_fetcher_bench_refuses_bad_settings(args: list[str], message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "fetcher.bench", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr and not out.stdout


def test_fetcher_bench_without_cgroups_says_so_and_starts_nothing(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "fetcher.bench", "--cpu-per-broker", "0.5",
                          "--cgroup-root", str(tmp_path / "no-cgroups"), "--work-dir", str(tmp_path / "work")],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and not out.stdout
    assert "--cpu-per-broker: no cgroup cpu controller under" in out.stderr
    assert not list((tmp_path / "work").iterdir())  # no broker was started


def test_fetcher_bench_with_a_cpu_quota_per_broker(tmp_path: Path, cpu_quotas: CpuQuotas) -> None:
    """Where this process may create cgroups: every broker runs under the quota, which is gone afterwards."""
    groups = cpu_quotas.parent.parent
    out = subprocess.run([sys.executable, "-m", "fetcher.bench", "--batches", "6", "--rounds", "2", "--moves", "0",
                          "--cpu-per-broker", "0.5", "--work-dir", str(tmp_path / "work")],
                         cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["cpu_per_broker"] == 0.5 and result["replication_ratio"] > 0
    # the kernel put each broker process in its own child cgroup; they all went away with the brokers
    assert sorted(result["broker_cgroups"]) == ["1", "2", "3", "4"]
    for n, group in result["broker_cgroups"].items():
        assert "/minibroker-bench-" in group and group.endswith(f"/broker{n}")
    assert not list(groups.glob("minibroker-bench-*"))
