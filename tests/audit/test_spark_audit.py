"""Proving the audit can fail: one injected anomaly per export, reported alone.

Every scenario below is its own export directory; the module audits them all
in one Spark pass (``run_audits``) so the suite stays fast on two cores, and
each test reads its export's report (``run_audit``, the one-export path, is
covered by the CLI test).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from audit.export import export
from audit.spark_audit import CHECK_NAMES, AuditReport, Status, format_summary, run_audit, run_audits, write_report
from tests.audit.datadirs import batch_positions, cluster, corrupt_byte, history
from tests.audit.exports import BROKERS, Export, clean_export


def flagged(report: AuditReport) -> set[str]:
    return {c.name for c in report.checks if c.status in (Status.VIOLATION, Status.COUNTED)}


def _lost_missing(e: Export) -> None:
    e.send("lost", "ok", 10, seq=20)  # acked at offset 10, but every log ends at 10


def _lost_other_value(e: Export) -> None:
    e.sends[3]["offset"] = 4  # v3 acked at offset 4, where the final log holds v4


def _inconsistent_read(e: Export) -> None:
    e.poll("c1", 0, 2, "v5")  # offset 2 read as v5 (a value the log holds, at offset 5)


def _divergence(e: Export) -> None:
    for o in (6, 7):  # broker 2's copy of batch 6-7 has another crc, same values
        e.record(2, o)["batch_crc"] = 12345


def _duplicate(e: Export) -> None:
    for b in BROKERS:  # v8 written at offsets 8 and 9; v9's send was indeterminate
        e.record(b, 9)["value"] = b"v8"
    e.sends[9]["outcome"], e.sends[9]["offset"], e.sends[9]["partition"] = "info", None, None
    for p in e.polls:
        if p["offset"] == 9:
            p["value"] = b"v8"


def _gap(e: Export) -> None:
    e.records.remove(e.record(2, 5))


def _repeat(e: Export) -> None:
    e.records.append(dict(e.record(2, 5)))


def _epoch_regression(e: Export) -> None:
    for b in BROKERS:
        for o in (8, 9):
            e.record(b, o)["leader_epoch"] = 0


def _hw_above_leo(e: Export) -> None:
    e.replica(1)["high_watermark"] = 12


def _non_monotonic(e: Export) -> None:
    e.poll("c0", 10, 6, "v6")  # c0 read 0..9 and then 6 again


def _skipped(e: Export) -> None:
    e.polls = [p for p in e.polls if not (p["process"] == "c0" and p["offset"] == 4)]


def _dirty(e: Export) -> None:
    e.poll("c0", 10, 10, "phantom")  # read at offset 10, a value no log holds


def _unseen(e: Export) -> None:
    e.add_log_record(10, b"v10")
    e.send("v10", "ok", 10, seq=20)  # acked and in the log, but nobody read offset 10


def _damaged(e: Export) -> None:
    e.damaged.append({"broker": 2, "topic": "t", "partition": 0, "file": "t-0/00000000000000000000.log",
                      "position": 400, "kind": "corrupt_batch", "error": "crc mismatch"})


def _no_history(e: Export) -> None:
    e.sends, e.polls, e.has_history = [], [], False


def _idempotent_duplicate(e: Export) -> None:
    for r in e.records:
        r["producer_id"], r["producer_epoch"], r["sequence"] = 7, 0, r["offset"]
    _duplicate(e)


def _torn_tail(e: Export) -> None:
    e.damaged.append({"broker": 1, "topic": "t", "partition": 0, "file": "t-0/00000000000000000000.log",
                      "position": 500, "kind": "torn_tail", "error": "partial batch"})


def _deposed_leader_tail(e: Export) -> None:
    # Broker 2 led epoch 1 and wrote offset 10 that was never committed; brokers 0 and 1 moved to
    # epoch 2 and committed v10 at offset 10. Broker 2 was not restarted yet, so it still holds the orphan.
    e.add_log_record(10, b"v10", epoch=2)
    e.records = [r for r in e.records if not (r["broker"] == 2 and r["offset"] == 10)]
    e.records.append({**e.record(2, 9), "offset": 10, "batch_base_offset": 10, "batch_last_offset": 10,
                      "value": b"orphan", "position": 1000})
    e.replica(2)["high_watermark"] = 10
    for b in (0, 1):
        e.replica(b)["latest_epoch"] = 2
    e.send("v10", "ok", 10, seq=20)
    e.send("orphan", "info", None, seq=21)
    e.poll("final", 10, 10, "v10")


ANOMALIES: dict[str, tuple[Callable[[Export], None], str]] = {
    "lost_missing": (_lost_missing, "lost_writes"),
    "lost_other_value": (_lost_other_value, "lost_writes"),
    "inconsistent_offsets": (_inconsistent_read, "inconsistent_offsets"),
    "replica_divergence": (_divergence, "replica_divergence"),
    "idempotent_duplicates": (_idempotent_duplicate, "duplicates"),
    "offset_gaps": (_gap, "offset_gaps"),
    "offset_repeats": (_repeat, "offset_repeats"),
    "epoch_regressions": (_epoch_regression, "epoch_regressions"),
    "hw_above_leo": (_hw_above_leo, "hw_above_leo"),
    "non_monotonic_polls": (_non_monotonic, "non_monotonic_polls"),
    "skipped_polls": (_skipped, "skipped_polls"),
    "dirty_reads": (_dirty, "dirty_reads"),
    "unseen_writes": (_unseen, "unseen_writes"),
    "damaged_files": (_damaged, "damaged_files"),
}
CLEAN: dict[str, Callable[[Export], None]] = {
    "clean": lambda e: None,
    "no_history": _no_history,
    "plain_duplicates": _duplicate,
    "torn_tail": _torn_tail,
    "deposed_leader_tail": _deposed_leader_tail,
}


def _real_file_exports(root: Path) -> dict[str, Path]:
    """Exports of broker data dirs written with storage's encoders: clean, and one with a bad CRC."""
    out = {}
    for name in ("files_clean", "files_crc"):
        c = cluster(root / f"{name}-cluster")
        if name == "files_crc":
            seg0 = c / "broker-1" / "t-0" / "00000000000000000000.log"
            corrupt_byte(seg0, batch_positions(seg0)[1] + 70)
        out[name] = root / name
        export([c], out[name], history=history(root / f"{name}-history.jsonl"))
    return out


@pytest.fixture(scope="module")
def reports(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, AuditReport]:
    root = tmp_path_factory.mktemp("exports")
    dirs: dict[str, Path] = {}
    for name, inject in {**{k: v[0] for k, v in ANOMALIES.items()}, **CLEAN}.items():
        e = clean_export()
        inject(e)
        dirs[name] = e.write(root / name)
    dirs.update(_real_file_exports(root))
    return dict(zip(dirs, run_audits(spark, list(dirs.values())), strict=True))


def test_clean_export_reports_nothing(reports: dict[str, AuditReport]) -> None:
    report = reports["clean"]
    assert report.ok
    assert [c.name for c in report.checks] == list(CHECK_NAMES)
    assert all(c.status is Status.OK for c in report.checks), format_summary(report)
    assert report.stats["acked"] == 10
    assert report.stats["failed"] == 1
    assert report.stats["indeterminate"] == 1
    assert report.stats["final_log_records"] == 10
    assert report.stats["record_rows"] == 30
    assert report.stats["partitions"] == 1
    assert "RESULT: ok" in format_summary(report)


def test_clean_export_without_history_skips_history_checks(reports: dict[str, AuditReport]) -> None:
    report = reports["no_history"]
    assert report.ok
    skipped = {c.name for c in report.checks if c.status is Status.SKIPPED}
    assert skipped == {"lost_writes", "non_monotonic_polls", "skipped_polls", "dirty_reads", "unseen_writes"}
    assert flagged(report) == set()


@pytest.mark.parametrize("case", sorted(ANOMALIES))
def test_one_anomaly_is_reported_alone(reports: dict[str, AuditReport], case: str) -> None:
    check = ANOMALIES[case][1]
    report = reports[case]
    assert flagged(report) == {check}, format_summary(report)
    result = report.check(check)
    assert result.status is Status.VIOLATION
    assert result.count >= 1
    assert result.evidence
    assert not report.ok
    assert f"VIOLATED: {check}" in format_summary(report)


def test_lost_write_evidence_names_the_value_found(reports: dict[str, AuditReport]) -> None:
    result = reports["lost_other_value"].check("lost_writes")
    assert result.count == 1
    assert result.evidence[0]["value"] == "v3"
    assert result.evidence[0]["offset"] == 4
    assert result.evidence[0]["found_value"] == "v4"
    missing = reports["lost_missing"].check("lost_writes")
    assert missing.evidence[0]["value"] == "lost"
    assert missing.evidence[0].get("found_value") is None


def test_divergence_evidence_shows_both_copies(reports: dict[str, AuditReport]) -> None:
    result = reports["replica_divergence"].check("replica_divergence")
    assert result.count == 2  # offsets 6 and 7
    assert [row["offset"] for row in result.evidence] == [6, 7]
    crcs = {copy["batch_crc"] for copy in result.evidence[0]["copies"]}
    assert 12345 in crcs and len(crcs) == 2


def test_structure_evidence(reports: dict[str, AuditReport]) -> None:
    gap = reports["offset_gaps"].check("offset_gaps")
    assert (gap.count, gap.evidence[0]["broker"], gap.evidence[0]["prev_offset"], gap.evidence[0]["offset"]) \
        == (1, 2, 4, 6)
    assert reports["offset_repeats"].check("offset_repeats").evidence[0]["offset"] == 5
    assert reports["epoch_regressions"].check("epoch_regressions").count == 3  # once per replica
    assert reports["hw_above_leo"].check("hw_above_leo").evidence[0]["high_watermark"] == 12


def test_read_evidence(reports: dict[str, AuditReport]) -> None:
    nm = reports["non_monotonic_polls"].check("non_monotonic_polls").evidence[0]
    assert (nm["process"], nm["prev_offset"], nm["offset"]) == ("c0", 9, 6)
    sk = reports["skipped_polls"].check("skipped_polls").evidence[0]
    assert (sk["process"], sk["prev_offset"], sk["offset"]) == ("c0", 3, 5)
    assert reports["dirty_reads"].check("dirty_reads").evidence[0]["value"] == "phantom"
    assert reports["unseen_writes"].check("unseen_writes").evidence[0]["value"] == "v10"
    inc = reports["inconsistent_offsets"].check("inconsistent_offsets").evidence[0]
    assert inc["offset"] == 2 and inc["distinct_values"] == ["v2", "v5"]


def test_duplicates_are_a_violation_with_an_idempotent_producer(reports: dict[str, AuditReport]) -> None:
    result = reports["idempotent_duplicates"].check("duplicates")
    assert result.status is Status.VIOLATION
    assert result.evidence[0]["value"] == "v8"
    assert result.evidence[0]["producer_id"] == 7


def test_duplicates_are_only_counted_without_idempotence(reports: dict[str, AuditReport]) -> None:
    report = reports["plain_duplicates"]
    assert flagged(report) == {"duplicates"}
    assert report.check("duplicates").status is Status.COUNTED
    assert report.check("duplicates").count == 1
    assert report.ok


def test_torn_tail_is_counted_not_a_violation(reports: dict[str, AuditReport]) -> None:
    report = reports["torn_tail"]
    assert report.ok
    assert report.stats["torn_tails"] == 1
    assert "1 torn tail" in report.check("damaged_files").note


def test_uncommitted_tail_of_a_deposed_leader_is_not_a_violation(reports: dict[str, AuditReport]) -> None:
    report = reports["deposed_leader_tail"]
    assert report.ok, format_summary(report)
    assert report.stats["final_log_records"] == 11


def test_exports_of_real_files_audit_as_expected(reports: dict[str, AuditReport]) -> None:
    """Clean files audit clean; a corrupted batch is damage (and a gap in that replica's log)."""
    clean = reports["files_clean"]
    assert clean.ok, format_summary(clean)
    assert clean.stats["acked"] == 6 and clean.stats["final_log_records"] == 6 and clean.stats["record_rows"] == 18
    assert flagged(reports["files_crc"]) == {"damaged_files", "offset_gaps"}, format_summary(reports["files_crc"])


def test_json_report(reports: dict[str, AuditReport], tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_report(reports["dirty_reads"], path)
    body = json.loads(path.read_text())
    assert body["ok"] is False
    assert body["violations"] == ["dirty_reads"]
    assert body["stats"]["polls"] == 21
    dirty = next(c for c in body["checks"] if c["name"] == "dirty_reads")
    assert dirty["evidence"][0]["value"] == "phantom"
    assert {c["status"] for c in body["checks"]} == {"ok", "violation"}


def test_not_an_export_is_a_clear_error(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an export directory"):
        run_audit(spark, tmp_path)
    e = clean_export().write(tmp_path / "x")
    (e / "polls.parquet").unlink()
    with pytest.raises(ValueError, match=r"polls\.parquet is missing"):
        run_audit(spark, e)
