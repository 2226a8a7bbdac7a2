"""Offline export of real broker data directories (written with storage's encoders)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from audit.export import ExportError, export
from cli.main import main
from controller.journal import JOURNAL_NAME, encode_frame
from storage.log_manager import LogManager
from tests.audit.datadirs import (
    Batch,
    batch_positions,
    cluster,
    corrupt_byte,
    history,
    undecodable_batch,
    write_meta,
    write_replica,
)


def table(out: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(out / f"{name}.parquet").to_pylist()
    return rows


def test_export_of_a_cluster_dir_with_history(tmp_path: Path) -> None:
    out = tmp_path / "export"
    summary = export([cluster(tmp_path / "c")], out, history=history(tmp_path / "history.jsonl"))
    assert (summary.brokers, summary.replicas, summary.records, summary.damaged) == ([0, 1, 2], 3, 18, 0)
    records = table(out, "records")
    b1 = sorted((r for r in records if r["broker"] == 1), key=lambda r: r["offset"])
    assert [r["offset"] for r in b1] == [0, 1, 2, 3, 4, 5]
    assert [r["value"] for r in b1] == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]
    assert [r["leader_epoch"] for r in b1] == [0, 0, 0, 1, 1, 1]
    assert [r["batch_base_offset"] for r in b1] == [0, 0, 2, 3, 3, 5]
    assert b1[4]["batch_last_offset"] == 4 and b1[4]["key"] == b"k4"
    assert b1[3]["segment"] == "00000000000000000003.log"
    assert b1[0]["timestamp"] == 1_700_000_000_000 and b1[0]["producer_id"] == -1 and b1[0]["sequence"] == -1
    assert len({r["batch_crc"] for r in records if r["batch_base_offset"] == 3}) == 1  # identical replicas
    rep = {r["broker"]: r for r in table(out, "replicas")}[2]
    assert (rep["high_watermark"], rep["log_end_offset"], rep["log_start_offset"], rep["recovery_point"]) \
        == (6, 6, 0, 6)
    assert rep["epoch_cache"] == [{"epoch": 0, "start_offset": 0}, {"epoch": 1, "start_offset": 3}]
    assert (rep["latest_epoch"], rep["segments"], rep["batches"], rep["records"], rep["damaged"]) == (1, 2, 4, 6, False)
    assert table(out, "damaged") == []
    assert [s["value"] for s in table(out, "sends")] == [f"v{o}".encode() for o in range(6)]
    assert len(table(out, "polls")) == 6
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["has_history"] is True and manifest["brokers"] == [0, 1, 2]


def test_export_of_broker_data_dirs_without_history(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    out = tmp_path / "export"
    summary = export([c / "broker-0", c / "broker-2"], out)
    assert summary.brokers == [0, 2]
    assert {r["broker"] for r in table(out, "records")} == {0, 2}
    assert json.loads((out / "manifest.json").read_text())["has_history"] is False
    assert table(out, "sends") == [] and table(out, "polls") == []


def test_producer_ids_and_sequences_are_exported(tmp_path: Path) -> None:
    write_replica(tmp_path / "b", 4, [[Batch(2, ["a", "b", "c"])]], hw=3, producer_id=9)
    out = tmp_path / "export"
    export([tmp_path / "b"], out)
    rows = sorted(table(out, "records"), key=lambda r: r["offset"])
    assert [(r["producer_id"], r["producer_epoch"], r["sequence"]) for r in rows] == [(9, 0, 0), (9, 0, 1), (9, 0, 2)]


def test_a_crc_failure_is_reported_and_the_next_segment_still_read(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    seg0 = c / "broker-1" / "t-0" / "00000000000000000000.log"
    second = batch_positions(seg0)[1]
    corrupt_byte(seg0, second + 70)  # inside the records: the CRC no longer matches
    out = tmp_path / "export"
    summary = export([c], out)
    assert summary.damaged == 1
    [d] = table(out, "damaged")
    assert (d["broker"], d["topic"], d["partition"], d["kind"], d["position"]) == (1, "t", 0, "corrupt_batch", second)
    assert d["file"] == "broker-1/t-0/00000000000000000000.log"
    assert "CrcMismatch" in d["error"]
    offsets = sorted(r["offset"] for r in table(out, "records") if r["broker"] == 1)
    assert offsets == [0, 1, 3, 4, 5]  # offset 2 lost with the damaged batch; segment 3.. still read
    rep = {r["broker"]: r for r in table(out, "replicas")}
    assert rep[1]["damaged"] is True and rep[0]["damaged"] is False


def test_a_torn_tail_is_informational(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    last = c / "broker-0" / "t-0" / "00000000000000000003.log"
    whole = last.read_bytes()
    last.write_bytes(whole + whole[:40])  # half a header: what a kill mid-append leaves
    out = tmp_path / "export"
    summary = export([c], out)
    assert (summary.damaged, summary.torn_tails) == (0, 1)
    [d] = table(out, "damaged")
    assert d["kind"] == "torn_tail" and d["position"] == len(whole)
    assert {r["broker"]: r for r in table(out, "replicas")}[0]["log_end_offset"] == 6


def test_a_partial_batch_inside_an_older_segment_is_damage(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    seg0 = c / "broker-2" / "t-0" / "00000000000000000000.log"
    data = seg0.read_bytes()
    seg0.write_bytes(data[:-5])
    out = tmp_path / "export"
    export([c], out)
    assert [d["kind"] for d in table(out, "damaged")] == ["corrupt_batch"]


def test_undecodable_records_are_reported(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    last = c / "broker-0" / "t-0" / "00000000000000000003.log"
    last.write_bytes(last.read_bytes() + undecodable_batch(6, 1))
    out = tmp_path / "export"
    export([c], out)
    [d] = table(out, "damaged")
    assert d["kind"] == "bad_records"


def test_bad_checkpoint_and_misnamed_segment_are_reported(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    (c / "broker-0" / "replication-offset-checkpoint").write_text("0\n1\nnot a checkpoint line at all\n")
    (c / "broker-1" / "t-0" / "12.log").write_bytes(b"")
    out = tmp_path / "export"
    export([c], out)
    kinds = sorted((d["broker"], d["kind"]) for d in table(out, "damaged"))
    assert kinds == [(0, "bad_checkpoint"), (1, "bad_name")]
    rep = {r["broker"]: r for r in table(out, "replicas")}
    assert rep[0]["high_watermark"] == -1 and rep[1]["high_watermark"] == 6


def test_empty_partition_and_stray_dirs(tmp_path: Path) -> None:
    write_meta(tmp_path / "b", 3)
    (tmp_path / "b" / "t-1").mkdir()
    (tmp_path / "b" / "t-1" / "00000000000000000042.log").write_bytes(b"")
    (tmp_path / "b" / "t-0.abc-delete").mkdir()
    (tmp_path / "b" / "notapartition").mkdir()
    out = tmp_path / "export"
    export([tmp_path / "b"], out)
    [rep] = table(out, "replicas")
    assert (rep["topic"], rep["partition"], rep["log_end_offset"], rep["log_start_offset"], rep["latest_epoch"]) \
        == ("t", 1, 42, 42, -1)


def test_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    with pytest.raises(ExportError, match="neither a broker data directory"):
        export([tmp_path / "c" / "controller"], tmp_path / "o1")
    with pytest.raises(ExportError, match="not a directory"):
        export([tmp_path / "missing"], tmp_path / "o1")
    write_meta(tmp_path / "other", 1)
    with pytest.raises(ExportError, match=r"broker id\(s\) \[1\]"):
        export([c, tmp_path / "other"], tmp_path / "o1")
    bad = tmp_path / "history.jsonl"
    bad.write_text('{"type": "send"}\n')
    with pytest.raises(ExportError, match=r"history\.jsonl:1: missing field"):
        export([c], tmp_path / "o2", history=bad)
    assert not (tmp_path / "o2").exists()  # a bad history touches nothing
    with pytest.raises(ExportError, match="does not exist"):
        export([c], tmp_path / "o2", history=tmp_path / "nope")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty"):
        export([c], foreign)


def test_export_can_overwrite_an_earlier_export(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    out = tmp_path / "export"
    export([c], out, history=history(tmp_path / "history.jsonl"))
    export([c / "broker-0"], out)
    assert {r["broker"] for r in table(out, "records")} == {0}
    assert table(out, "sends") == []


def test_export_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINIBROKER_LOG_LEVEL", raising=False)
    c = cluster(tmp_path / "c")
    hist_dir = tmp_path / "run"
    hist_dir.mkdir()
    history(hist_dir / "workload-history.jsonl")
    assert main(["export", "--data-dir", str(c / "broker-0"), str(c / "broker-1"), "--data-dir",
                 str(c / "broker-2"), "--history", str(hist_dir), "--out", str(tmp_path / "e")]) == 0
    printed = capsys.readouterr()
    assert "exported 18 records of 3 replicas on brokers 0, 1, 2" in printed.out
    assert "6 sends, 6 polls" in printed.out
    assert printed.err == ""  # the summary is the output, without a log line (export_done) after it
    monkeypatch.setenv("MINIBROKER_LOG_LEVEL", "INFO")  # the events are still there when asked for
    assert main(["export", "--data-dir", str(c), "--out", str(tmp_path / "e")]) == 0
    assert '"event": "export_done"' in capsys.readouterr().err
    assert main(["export", "--data-dir", str(tmp_path), "--out", str(tmp_path / "e2")]) == 2
    assert "neither a broker data directory" in capsys.readouterr().err


async def test_export_of_a_log_written_by_storage_log_manager(tmp_path: Path) -> None:
    """The layout the broker really writes (LogManager + Log), not our own file writer."""
    from common.clock import ManualClock
    from common.config import BROKER_CONFIGS, Config
    from common.wire import TopicPartition
    from storage.log import LogConfig
    from storage.record_batch import build_batch

    data = tmp_path / "broker-5"
    write_meta(data, 5)
    cfg = Config(BROKER_CONFIGS)
    manager = LogManager(data, cfg, ManualClock())
    await manager.load()
    tp = TopicPartition("orders", 2)
    log = await manager.get_or_create_log(tp, LogConfig.from_config(cfg))
    for epoch in (0, 0, 3):
        log.append_as_leader(build_batch([(None, f"e{epoch}-{i}".encode()) for i in range(20)], timestamp_ms=1),
                             epoch)
        log.roll()
    manager.checkpoint_high_watermarks({tp: 50})
    await manager.close()
    out = tmp_path / "export"
    summary = export([data], out)
    assert (summary.brokers, summary.records, summary.damaged) == ([5], 60, 0)
    [rep] = table(out, "replicas")
    assert (rep["high_watermark"], rep["log_end_offset"], rep["latest_epoch"]) == (50, 60, 3)
    assert rep["segments"] >= 3
    assert rep["epoch_cache"][-1] == {"epoch": 3, "start_offset": 40}
    rows = sorted(table(out, "records"), key=lambda r: r["offset"])
    assert [r["offset"] for r in rows] == list(range(60))
    assert rows[45]["value"] == b"e3-5" and rows[45]["leader_epoch"] == 3


def test_log_start_is_never_below_the_first_segment(tmp_path: Path) -> None:
    # retention deleted segment 0 and the broker was killed before it rewrote its log-start checkpoint (0)
    c = cluster(tmp_path / "c")
    (c / "broker-1" / "t-0" / "00000000000000000000.log").unlink()
    out = tmp_path / "export"
    export([c], out)
    starts = {r["broker"]: r["log_start_offset"] for r in table(out, "replicas")}
    assert starts == {0: 0, 1: 3, 2: 0}  # as storage.log computes it on open: max(checkpoint, first base)


def test_merged_history_files_get_their_own_process_names(tmp_path: Path) -> None:
    hist = tmp_path / "run"
    hist.mkdir()
    history(hist / "history.jsonl")
    history(hist / "history-rerun.jsonl")  # the rerun names its clients p0 and c0 again
    out = tmp_path / "export"
    export([cluster(tmp_path / "c")], out, history=hist)
    assert {(s["process"], s["seq"]) for s in table(out, "sends")} \
        == {(f"{stem}:p0", o) for stem in ("history", "history-rerun") for o in range(6)}
    assert {p["process"] for p in table(out, "polls")} == {"history:c0", "history-rerun:c0"}
    export([cluster(tmp_path / "c2")], tmp_path / "one", history=hist / "history.jsonl")
    assert {p["process"] for p in table(tmp_path / "one", "polls")} == {"c0"}  # one file: names unchanged


def test_controller_metadata_is_read_without_lock_or_writes(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c", metadata=True)
    controller = c / "controller"
    with open(controller / JOURNAL_NAME, "ab") as f:  # a frame being appended right now
        f.write(b"\x00\x00\x01\x00torn")
    before = {p.name: p.read_bytes() for p in controller.iterdir()}
    lock = os.open(controller / ".lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running controller holds it
        summary = export([c], tmp_path / "export")
    finally:
        os.close(lock)
    assert {p.name: p.read_bytes() for p in controller.iterdir()} == before
    assert table(tmp_path / "export", "assignments") == [
        {"topic": "t", "partition": 0, "replicas": [0, 1, 2], "isr": [0, 1, 2], "leader": 0, "leader_epoch": 1}]
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert (manifest["has_metadata"], manifest["counts"]["assignments"]) == (True, 1)
    assert str(controller) in manifest["sources"]
    assert "controller metadata: 1 partition assignments" in summary.lines()


def test_without_a_cluster_dir_there_is_no_metadata(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c", metadata=True)
    summary = export([c / "broker-0", c / "broker-1"], tmp_path / "export")
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert manifest["has_metadata"] is False
    assert "broker data dirs were given, not a cluster dir" in manifest["metadata_note"]
    assert table(tmp_path / "export", "assignments") == []
    assert manifest["metadata_note"] in summary.lines()


def test_damaged_controller_metadata_is_a_damage_row(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c", metadata=True)
    journal = c / "controller" / JOURNAL_NAME
    corrupt_byte(journal, 12)  # frame 1's payload, and a whole frame after it
    journal.write_bytes(journal.read_bytes() + encode_frame({"offset": 2, "records": []}))
    summary = export([c], tmp_path / "export")
    assert summary.damaged == 1
    [row] = table(tmp_path / "export", "damaged")
    assert (row["broker"], row["topic"], row["file"], row["kind"]) == (None, None, "controller", "bad_metadata")
    assert "JournalCorruptError" in row["error"] and "is damaged but 1 whole frame" in row["error"]
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert (manifest["has_metadata"], manifest["metadata_note"]) \
        == (False, "controller metadata unreadable (see damaged_files)")
