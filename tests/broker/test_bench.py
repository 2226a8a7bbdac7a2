"""``minibroker perf broker`` runs end to end (tiny sizes); figures are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("bare, retained", [("app", "256"), ("lowlevel", "0")])
def test_perf_broker_runs(tmp_path: Path, bare: str, retained: str) -> None:
    out = subprocess.run([sys.executable, "-m", "cli.main", "perf", "broker", "--requests", "30", "--records", "10",
                          "--rounds", "1", "--bare", bare, "--retained-mb", retained, "--data-dir", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("1 ")]
    assert [r[-1] for r in rows] == ["0", "0"]  # no errors from either target
    # round, target (2 words for the bare server), rate, records, MB, server CPU, faults, client CPU, 2 busy
    assert [len(r) for r in rows] == [12, 11]
    assert all(r[-3].endswith("%") and r[-2].endswith("%") for r in rows)
    assert "client CPU us/req" in out.stdout
    assert f"bare server: {bare}" in out.stdout
    assert "broker / bare request rate per round" in out.stdout


def test_fetch_bench_prints_a_row_per_round() -> None:
    out = subprocess.run([sys.executable, "-m", "broker.fetch_bench", "--fetches", "20", "--rounds", "2",
                          "--batches", "5", "--max-bytes", "200000"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2"]
    assert all(float(r[1]) > 100 for r in rows)  # KiB per fetch: the fetches carried records


def test_fetch_bench_refuses_bad_sizes() -> None:
    out = subprocess.run([sys.executable, "-m", "broker.fetch_bench", "--fetches", "0"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--fetches must be at least 1" in out.stderr and not out.stdout


def test_summary_leaves_out_rounds_whose_cpu_did_not_register() -> None:
    """CPU time moves in 10 ms ticks: a round of a few requests can show 0 for the broker (a division by
    zero once ended ``perf broker`` in CI)."""
    from broker.bench import summary

    def row(req_s: float, cpu_us: float) -> dict[str, float]:
        return {"req_s": req_s, "cpu_us": cpu_us, "seconds": 1000 / req_s}  # 1000 requests a round

    lines = summary([row(1000, 100), row(500, 0.0), row(1000, 100), row(700, 200)])
    assert lines[0] == "broker / bare request rate per round: 0.50, 0.70; median 0.70"
    assert lines[2].endswith("0.50; median 0.50")
    assert "too short to measure" in summary([row(1000, 0.0), row(500, 0.0)])[2]


def test_summary_gives_the_rate_over_all_rounds_together() -> None:
    """The median of the per-round ratios discounts a slow round; the rate over all rounds counts its time."""
    from broker.bench import summary

    rows = [{"req_s": 1000.0, "seconds": 1.0, "cpu_us": 100.0} if i % 2 == 0 else
            {"req_s": 1000.0 / s, "seconds": s, "cpu_us": 100.0} for i, s in enumerate([1, 1, 1, 1, 1, 4])]
    lines = summary(rows)
    assert lines[0].endswith("median 1.00")  # two rounds as fast as the bare server's, one at a quarter
    assert lines[1] == "broker / bare request rate over all rounds together: 0.50"  # 3000 in 6 s against 3 s
