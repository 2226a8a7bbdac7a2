"""Bad input to ``export`` and ``audit``: one readable error line and exit 2, never a traceback, and
never a half-written ``--out``; damaged broker files (numbers beyond their Parquet columns) are damage."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c

from audit import export as export_mod
from audit import schema
from audit.export import ExportError, export
from cli.main import main
from storage.record_batch import build_batch
from tests.audit.datadirs import cluster, history, write_meta
from tests.audit.exports import clean_export
from tests.audit.test_export import table

ROOT = Path(__file__).resolve().parents[2]
INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1
HUGE = "99999999999999999999999"
SEND = {"type": "send", "process": "p", "seq": 0, "topic": "t", "key": "k", "value": "v", "time_ms": 1,
        "outcome": "ok", "partition": 0, "offset": 0}
POLL = {"type": "poll", "process": "c", "seq": 0, "topic": "t", "partition": 0, "offset": 0, "time_ms": 1}


def cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI in-process, expecting exit 2 and one readable error line; returns that line."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("minibroker: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def write_history(path: Path, *events: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


# ---------------------------------------------------------------- --out

def test_out_below_a_regular_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster(tmp_path / "c")
    (tmp_path / "afile").write_text("mine")
    line = cli_error(capsys, "export", "--data-dir", str(c), "--out", str(tmp_path / "afile" / "sub"))
    assert f"--out {tmp_path / 'afile' / 'sub'}: {tmp_path / 'afile'} is not a directory" in line
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_failed_export_leaves_no_out_and_no_parents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster(tmp_path / "c")

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(schema, "write_manifest", disk_full)  # the last write of an export
    before = siblings(tmp_path / "c")
    line = cli_error(capsys, "export", "--data-dir", str(c), "--out", str(tmp_path / "new" / "deeper" / "e"))
    assert "No space left on device" in line
    assert not (tmp_path / "new").exists()  # the parents made for it are gone too
    assert siblings(tmp_path / "c") == before


def test_a_failed_export_keeps_an_earlier_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster(tmp_path / "c")
    out = tmp_path / "e"
    export([c], out, history=history(tmp_path / "history.jsonl"))
    files = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(schema.TableWriter, "close", broken)  # fails midway, after sends and polls
    with pytest.raises(ExportError, match="Input/output error"):
        export([c / "broker-0"], out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    assert siblings(out) == ["c", "e", "history.jsonl"]  # no temporary directory left behind


def test_a_failed_export_keeps_an_empty_out_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster(tmp_path / "c")
    out = tmp_path / "e"
    out.mkdir()
    monkeypatch.setattr(export_mod, "export_brokers", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        export([c], out)
    assert out.is_dir() and list(out.iterdir()) == []
    assert siblings(out) == ["c", "e"]


def test_an_empty_out_dir_is_filled_and_keeps_its_mode(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    out = tmp_path / "e"
    out.mkdir()
    out.chmod(0o750)
    export([c], out)
    assert (out.stat().st_mode & 0o777) == 0o750
    assert sorted(p.name for p in out.iterdir()) == sorted([schema.MANIFEST, *(f"{n}.parquet" for n in schema.TABLES)])
    export([c], out)  # and again, over the earlier export
    assert siblings(out) == ["c", "e"]
    assert len(table(out, "records")) == 18


def test_a_mount_point_out_is_refused_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster(tmp_path / "c")
    out = tmp_path / "e"
    out.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == out)
    with pytest.raises(ExportError, match="is a mount point"):
        export([c], out)


# ---------------------------------------------------------------- --history

@pytest.mark.parametrize(("event", "reason"), [
    ({**SEND, "value": "\ud800"}, "field 'value' is not valid Unicode text"),
    ({**SEND, "process": "p\udfff"}, "field 'process' is not valid Unicode text"),
    ({**SEND, "offset": 100000000000000000000}, "field 'offset' is out of range for a signed 64-bit integer"),
    ({**SEND, "start_ms": -(1 << 63) - 1}, "field 'start_ms' is out of range"),
    ({**SEND, "partition": INT32_MAX + 1}, "field 'partition' is out of range for a signed 32-bit integer"),
    ({**POLL, "seq": 100000000000000000000}, "field 'seq' is out of range for a signed 64-bit integer"),
    ({**POLL, "time_ms": INT64_MAX + 1}, "field 'time_ms' is out of range"),
])
def test_history_values_that_fit_no_column_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            event: dict[str, Any], reason: str) -> None:
    c = cluster(tmp_path / "c")
    h = write_history(tmp_path / "history.jsonl", SEND, event)
    line = cli_error(capsys, "export", "--data-dir", str(c), "--history", str(h), "--out", str(tmp_path / "e"))
    assert f"{h}:2: {reason}" in line
    assert not (tmp_path / "e").exists()


def test_history_extremes_that_fit_are_exported(tmp_path: Path) -> None:
    h = write_history(tmp_path / "history.jsonl", {**SEND, "offset": INT64_MAX, "partition": INT32_MAX},
                      {**POLL, "seq": -(1 << 63), "value": "\U0001f600"})
    export([cluster(tmp_path / "c")], tmp_path / "e", history=h)
    assert table(tmp_path / "e", "sends")[0]["offset"] == INT64_MAX
    assert table(tmp_path / "e", "polls")[0]["value"] == "\U0001f600".encode()


def test_history_line_numbers_count_from_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster(tmp_path / "c")
    h = tmp_path / "history.jsonl"
    h.write_bytes(json.dumps(SEND).encode() + b"\n\n" + b'{"type": "send", "value": "\xff"}\n')
    line = cli_error(capsys, "export", "--data-dir", str(c), "--history", str(h), "--out", str(tmp_path / "e"))
    assert f"{h}:3: not UTF-8 text" in line
    h.write_bytes(b"\xff\n")
    assert f"{h}:1: not UTF-8 text" in cli_error(capsys, "export", "--data-dir", str(c), "--history", str(h),
                                                 "--out", str(tmp_path / "e"))
    h.write_text(json.dumps(SEND) + "\nnot json\n")
    assert f"{h}:2: not JSON" in cli_error(capsys, "export", "--data-dir", str(c), "--history", str(h),
                                           "--out", str(tmp_path / "e"))


def test_a_torn_last_line_cut_inside_a_character_is_skipped(tmp_path: Path) -> None:
    h = tmp_path / "history.jsonl"
    h.write_bytes(json.dumps(SEND).encode() + b"\n" + '{"type": "send", "value": "\u20ac'.encode()[:-1])
    summary = export([cluster(tmp_path / "c")], tmp_path / "e", history=h)
    assert summary.sends == 1


# ---------------------------------------------------------------- damaged broker files

def _set_first_timestamp(batch: bytes, ts: int) -> bytes:
    """The batch with another first_timestamp (offset 27) and its CRC (offset 17, over [21, end)) redone."""
    b = bytearray(batch)
    struct.pack_into(">q", b, 27, ts)
    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
    return bytes(b)


def _damage(c: Path, case: str) -> None:
    b0 = c / "broker-0"
    last = b0 / "t-0" / "00000000000000000003.log"
    if case == "hw_checkpoint":
        (b0 / "replication-offset-checkpoint").write_text(f"0\n1\nt 0 {HUGE}\n")
    elif case == "checkpoint_partition":
        (b0 / "log-start-offset-checkpoint").write_text(f"0\n1\nt {HUGE} 0\n")
    elif case == "epoch_checkpoint":
        (b0 / "t-0" / "leader-epoch-checkpoint").write_text(f"0\n1\n{INT32_MAX + 1} 0\n")
    elif case == "meta":
        (b0 / "meta.properties").write_text(f"version=1\nnode.id={HUGE}\n")
    elif case == "meta_not_int":
        (b0 / "meta.properties").write_text("version=1\nnode.id=abc\n")
    elif case == "segment_name":
        (b0 / "t-0" / "99999999999999999999.log").write_bytes(b"")
    elif case == "batch_offsets":
        last.write_bytes(last.read_bytes() + build_batch([(None, b"x"), (None, b"y")], base_offset=INT64_MAX,
                                                         timestamp_ms=1))
    elif case == "batch_timestamp":
        batch = build_batch([(None, b"x", 1), (None, b"y", 2)], base_offset=6, timestamp_ms=1)
        last.write_bytes(last.read_bytes() + _set_first_timestamp(batch, INT64_MAX))
    else:
        raise AssertionError(case)


@pytest.mark.parametrize(("case", "file", "kind", "error"), [
    ("hw_checkpoint", "broker-0/replication-offset-checkpoint", "bad_checkpoint", "out of range"),
    ("checkpoint_partition", "broker-0/log-start-offset-checkpoint", "bad_checkpoint", "out of range"),
    ("epoch_checkpoint", "broker-0/t-0/leader-epoch-checkpoint", "bad_checkpoint", "out of range"),
    ("meta", "broker-0/meta.properties", "bad_checkpoint", f"node.id '{HUGE}' is out of range"),
    ("meta_not_int", "broker-0/meta.properties", "bad_checkpoint", "node.id 'abc' is not an integer"),
    ("segment_name", "broker-0/t-0/99999999999999999999.log", "bad_name", "20-digit"),
    ("batch_offsets", "broker-0/t-0/00000000000000000003.log", "corrupt_batch", "go beyond int64"),
    ("batch_timestamp", "broker-0/t-0/00000000000000000003.log", "bad_records", "timestamp beyond int64"),
])
def test_numbers_beyond_their_columns_in_broker_files_are_damage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, file: str, kind: str, error: str) -> None:
    c = cluster(tmp_path / "c")
    _damage(c, case)
    out = tmp_path / "e"
    assert main(["export", "--data-dir", str(c), "--out", str(out)]) == 0
    assert "damaged regions: 1 (torn tails: 0)" in capsys.readouterr().out
    [d] = table(out, "damaged")
    assert (d["broker"], d["file"], d["kind"]) == (0, file, kind)
    assert error in d["error"]
    rep = {r["broker"]: r for r in table(out, "replicas")}
    assert rep[0]["damaged"] is (kind != "bad_checkpoint" or file.endswith("leader-epoch-checkpoint"))
    assert len([r for r in table(out, "records") if r["broker"] == 1]) == 6


def test_sequences_of_a_batch_wrap_from_int32_max_to_0_as_its_producer_s_do(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    last = c / "broker-0" / "t-0" / "00000000000000000003.log"
    last.write_bytes(last.read_bytes() + build_batch([(None, b"x"), (None, b"y"), (None, b"z")], base_offset=6,
                                                     timestamp_ms=1, producer_id=1, producer_epoch=0,
                                                     base_sequence=INT32_MAX - 1))
    out = tmp_path / "e"
    assert export([c], out).damaged == 0
    rows = sorted((r["offset"], r["sequence"]) for r in table(out, "records")
                  if r["broker"] == 0 and r["offset"] >= 6)
    assert rows == [(6, INT32_MAX - 1), (7, INT32_MAX), (8, 0)]


def test_a_partition_number_beyond_int32_is_not_a_partition_dir(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    (c / "broker-0" / f"good-{HUGE}").mkdir()
    (c / "broker-0" / f"t-{INT32_MAX + 1}").mkdir()
    (c / "broker-0" / f"t-{'0' * 200}1").mkdir()  # leading zeros: no partition dir to the broker, nor here
    (c / "broker-0" / f"t-{'9' * 200}").mkdir()
    (c / "broker-0" / "t-\u0663").mkdir()  # Arabic-Indic 3: int() reads it as 3, but it is no partition dir
    out = tmp_path / "e"
    summary = export([c], out)
    assert (summary.replicas, summary.records, summary.damaged) == (3, 18, 0)
    assert {(r["topic"], r["partition"]) for r in table(out, "replicas")} == {("t", 0)}


@pytest.mark.parametrize(("node_id", "reason"), [
    ("abc", "meta.properties node.id 'abc' is not an integer"),
    (HUGE, f"meta.properties node.id '{HUGE}' is out of range"),
    ("-2147483649", "meta.properties node.id '-2147483649' is out of range"),
    ("9" * 5000, f"meta.properties node.id '{'9' * 40}...' is out of range"),  # more digits than int() takes
])
def test_a_broker_dir_with_a_bad_node_id_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          node_id: str, reason: str) -> None:
    write_meta(tmp_path / "b", 1)
    (tmp_path / "b" / "meta.properties").write_text(f"node.id={node_id}\n")
    line = cli_error(capsys, "export", "--data-dir", str(tmp_path / "b"), "--out", str(tmp_path / "e"))
    assert f"{tmp_path / 'b'}: cannot tell the broker id ({reason}" in line
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("args", [
    ["--history", "h3.jsonl"],  # a huge offset in the history
    [],  # a huge HW in a checkpoint: damage, exit 0
])
def test_subprocess_never_prints_a_traceback(tmp_path: Path, args: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINIBROKER_LOG_LEVEL", raising=False)
    c = cluster(tmp_path / "c")
    (c / "broker-0" / "replication-offset-checkpoint").write_text(f"0\n1\nt 0 {HUGE}\n")
    write_history(tmp_path / "h3.jsonl", {**SEND, "offset": int(HUGE)})
    argv = [a if not a.endswith(".jsonl") else str(tmp_path / a) for a in args]
    proc = subprocess.run([sys.executable, "-m", "cli.main", "export", "--data-dir", str(c), *argv, "--out",
                           str(tmp_path / "e")], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in proc.stderr
    if args:
        assert proc.returncode == 2
        assert f"minibroker: error: bad history: {tmp_path / 'h3.jsonl'}:1: field 'offset'" in proc.stderr
        assert not (tmp_path / "e").exists()
    else:
        assert proc.returncode == 0, proc.stderr
        assert "damaged regions: 1" in proc.stdout
        assert proc.stderr == ""  # the summary counts the damage: no log lines (export_damage_found, export_done)


# ---------------------------------------------------------------- audit

def test_audit_of_a_binary_manifest_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    e = clean_export().write(tmp_path / "e")
    (e / "manifest.json").write_bytes(b"\xff\xfe{}")
    line = cli_error(capsys, "audit", str(e))
    assert f"cannot read {e / 'manifest.json'}: not UTF-8 text" in line


@pytest.mark.parametrize(("report", "reason"), [
    ("missing/r.json", "directory {t}/missing does not exist"),
    ("afile/r.json", "{t}/afile is not a directory"),
    ("adir", "--report {t}/adir is a directory"),
])
def test_audit_report_path_is_checked_before_spark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], report: str,
                                                   reason: str) -> None:
    monkeypatch.setitem(sys.modules, "pyspark.sql", None)  # importing Spark now fails the test
    e = clean_export().write(tmp_path / "e")
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    line = cli_error(capsys, "audit", str(e), "--report", str(tmp_path / report))
    assert reason.format(t=tmp_path) in line
    assert not (tmp_path / "missing").exists()
