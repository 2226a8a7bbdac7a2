"""``minibroker audit``: in-process next to the test session's Spark, and (slow) as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from tests.audit.exports import clean_export

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=170, check=False)


def test_audit_command_in_process(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    e = clean_export()
    e.poll("c0", 10, 10, "phantom")
    report = tmp_path / "report.json"
    assert main(["audit", str(e.write(tmp_path / "bad")), "--report", str(report)]) == 1
    out = capsys.readouterr().out
    assert "dirty_reads            violation" in out
    assert "phantom" in out
    assert "RESULT: VIOLATED: dirty_reads" in out
    assert json.loads(report.read_text())["violations"] == ["dirty_reads"]
    assert not spark.sparkContext._jsc.sc().isStopped()  # the shared session is left running


@pytest.mark.slow
def test_audit_subprocess_exits_1_with_evidence_and_writes_the_report(tmp_path: Path) -> None:
    e = clean_export()
    e.poll("c0", 10, 10, "phantom")
    export_dir = e.write(tmp_path / "export")
    report = tmp_path / "report.json"
    proc = run_cli("audit", str(export_dir), "--master", "local[1]", "--report", str(report),
                   "--conf", "spark.sql.shuffle.partitions=1")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "dirty_reads            violation" in proc.stdout
    assert "phantom" in proc.stdout
    assert "RESULT: VIOLATED: dirty_reads" in proc.stdout
    body = json.loads(report.read_text())
    assert body["violations"] == ["dirty_reads"]


def test_audit_of_a_non_export_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["audit", str(tmp_path)]) == 2
    assert main(["audit", str(clean_export().write(tmp_path / "e")), "--evidence-rows", "0"]) == 2
    assert main(["audit", str(tmp_path / "e"), "--conf", "novalue"]) == 2


def test_a_failed_spark_job_is_one_line_and_the_session_survives(spark: Any, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # a job that fails inside Spark (here an unreadable Parquet file; in a long chaos run, a JVM out of
    # heap) was a traceback, and then another from stopping a session whose JVM was gone
    export_dir = clean_export().write(tmp_path / "e")
    (export_dir / "records.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    assert main(["audit", str(export_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("minibroker: error: the Spark audit failed (")
    assert "--conf spark.driver.memory=8g" in err[-1]
    assert not spark.sparkContext._jsc.sc().isStopped()


@pytest.mark.parametrize("master", ["bogus://x", "local[abc]", "sparkle"])
def test_a_master_spark_refuses_is_one_line_and_exit_2(tmp_path: Path, master: str) -> None:
    # was a PySpark traceback (after spark-submit's Java stack) and exit 1, which means "a violation"
    proc = run_cli("audit", str(clean_export().write(tmp_path / "e")), "--master", master)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"minibroker: error: --master {master!r}: not a Spark master URL "
                                        "(local[N], spark://HOST:PORT, yarn, k8s://...)"]
    assert proc.stdout == ""


def test_a_spark_that_cannot_start_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # a machine whose Java is missing (here JAVA_HOME names an empty dir): Spark's launcher fails, and the
    # audit says so in one line, exit 2 (an environment error, not "a violation")
    pytest.importorskip("pyspark")
    export_dir = clean_export().write(tmp_path / "e")
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    (tmp_path / "no-java").mkdir()
    proc = subprocess.run([sys.executable, "-m", "cli.main", "audit", str(export_dir), "--master", "local[1]"],
                          cwd=ROOT, capture_output=True, text=True, timeout=170, check=False, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("minibroker: error: cannot start Spark with --master local[1]: ")
    assert proc.stdout == ""


def test_audit_help_gives_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["audit", "--help"])
    assert exit_.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("Exit status: 0 no violation, 1 a violation found, 2 a usage or environment error" in help_text)



def test_the_default_heap_grows_with_the_export_within_the_machine() -> None:
    # 4g ran out on a 5-minute chaos run's export (10.3M records, 6.9M polls, 3.4M sends); 8g audited it
    from audit.cli import driver_memory_for

    gib = 1 << 30
    chaos_5min = {"records": 10_298_367, "polls": 6_865_578, "sends": 3_432_789}
    assert driver_memory_for(chaos_5min, 24 * gib) == f"{20_596_734 * 512 >> 20}m"  # ~9.8 GiB
    assert int(driver_memory_for(chaos_5min, 24 * gib)[:-1]) >= 8 * 1024
    assert driver_memory_for({"records": 1000}, 24 * gib) == "4096m"  # never below 4g
    assert driver_memory_for(chaos_5min, 8 * gib) == f"{int(8 * gib * 0.6) >> 20}m"  # at most 60 % of the RAM
    assert driver_memory_for({}, gib) == "1024m"
    assert driver_memory_for(chaos_5min, 0) == f"{20_596_734 * 512 >> 20}m"  # RAM unknown: no cap
