"""``minibroker dump-log`` and ``minibroker perf storage`` through the real CLI entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from tests.storage.helpers import batch, open_log


def _log_dir(tmp_path: Path, batches: int = 5) -> Path:
    pdir = tmp_path / "orders-0"
    log = open_log(pdir, segment_bytes=1000)
    for i in range(batches):
        log.append_as_leader(batch(2, size=100, tag=i), 3)
    log.close()
    return pdir


def test_dump_log_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pdir = _log_dir(tmp_path)
    capsys.readouterr()  # drop the log lines of the setup
    assert main(["dump-log", str(pdir)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["base_offset"], x["last_offset"]) for x in lines] == [(i, i + 1) for i in range(0, 10, 2)]
    first = lines[0]
    assert first["valid"] is True and first["leader_epoch"] == 3 and first["record_count"] == 2
    for key in ("position", "size", "crc", "first_timestamp", "max_timestamp", "producer_id", "producer_epoch",
                "base_sequence"):
        assert key in first
    assert "records" not in first
    assert not any("non_consecutive" in x for x in lines)


def test_dump_log_reports_offsets_that_do_not_follow_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A lost segment file (a hole between files) and a step back inside one file: each flagged batch
    carries "non_consecutive", stderr lists the pairs as Kafka's DumpLogSegments does, exit status 1."""
    pdir = _log_dir(tmp_path, batches=9)
    segs = sorted(pdir.glob("*.log"))
    assert len(segs) >= 3
    capsys.readouterr()
    segs[1].unlink()
    assert main(["dump-log", str(pdir)]) == 1
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    flagged = [x for x in lines if "non_consecutive" in x]
    assert len(flagged) == 1 and flagged[0]["file"] == str(segs[2])
    hole_after = flagged[0]["non_consecutive"]["after"]
    assert hole_after < flagged[0]["base_offset"] - 1
    assert f"{hole_after} is followed by {flagged[0]['base_offset']}" in err

    (tmp_path / "stepped").mkdir()
    stepped = tmp_path / "stepped" / f"{0:020d}.log"
    stepped.write_bytes(segs[2].read_bytes() + segs[0].read_bytes())
    assert main(["dump-log", str(stepped)]) == 1
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert all(x["valid"] for x in lines)
    flagged = [x for x in lines if "non_consecutive" in x]
    assert [x["base_offset"] for x in flagged] == [0]
    assert f"in {stepped}: {flagged[0]['non_consecutive']['after']} is followed by 0" in err


def test_dump_log_records_and_a_bad_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pdir = _log_dir(tmp_path)
    seg = sorted(pdir.glob("*.log"))[0]
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0xFF
    seg.write_bytes(bytes(data) + b"\x00" * 10)
    capsys.readouterr()
    assert main(["dump-log", str(seg), "--records"]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["valid"] is True
    assert lines[0]["records"][1] == {"offset": 1, "timestamp": lines[0]["first_timestamp"] + 1, "key": "k",
                                      "value": "\x00" * 100, "headers": []}
    assert lines[-2]["valid"] is False and "CrcMismatchError" in lines[-2]["error"]
    assert lines[-1]["valid"] is False and "partial batch header" in lines[-1]["error"]


def test_dump_log_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump-log", str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_dump_log_reads_only_segment_files_and_says_when_there_are_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pdir = _log_dir(tmp_path, batches=2)
    # a process's text log beside the segments (a cluster's data dir has broker-1.log) is not a segment
    (pdir / "broker-1.log").write_text('{"event": "started"}\n')
    capsys.readouterr()
    assert main(["dump-log", str(pdir)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2 and all(x["valid"] and x["file"].endswith("00000000000000000000.log") for x in lines)

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.log").write_text("text")
    (empty / f"{0:020d}.log").mkdir()  # a directory with a segment's name holds no batches either
    assert main(["dump-log", str(empty)]) == 2
    assert "no segment files" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["leader-epoch-checkpoint", "00000000000000000000.index", "copy.log",
                                  "0.log", "00000000000000000000.snapshot", "empty.txt"])
def test_dump_log_refuses_a_file_not_named_as_a_segment(tmp_path: Path, name: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Kafka's DumpLogSegments decodes by the file name; reading any file as batches printed made-up headers
    # (a checkpoint's text as a base offset and length), or nothing and success for an empty file
    pdir = _log_dir(tmp_path, batches=1)
    other = tmp_path / name
    if name == "empty.txt":
        other.touch()
    elif name == "leader-epoch-checkpoint":
        other.write_bytes((pdir / name).read_bytes() * 20)  # longer than a batch header
    else:
        other.write_bytes((pdir / f"{0:020d}.log").read_bytes())  # even a real segment's bytes
    capsys.readouterr()
    assert main(["dump-log", str(other)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "not a segment file" in err and "<20-digit base offset>.log" in err


def test_dump_log_refuses_what_is_not_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump-log", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert "not a regular file" in err and "no such file" not in err


def test_perf_storage_prints_figures(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "cli.main", "perf", "storage", "--dir", str(tmp_path),
                          "--total-mib", "1", "--batch-sizes", "16384", "--repeat", "1"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "append" in out and "read 1 MiB fetches" in out and "ratio" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--repeat", "0"], "--repeat must be > 0"),
    (["--record-bytes", "-1"], "--record-bytes must be >= 0"),
    (["--batch-sizes", "100"], "each must be 200-67108864 bytes"),
    (["--dir", "/nonexistent/dir"], "not a directory"),  # was a FileNotFoundError traceback
])
def test_perf_storage_refuses_bad_values_before_writing(argv: list[str], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(["perf", "storage", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_help() -> None:
    for args in (["dump-log", "--help"], ["perf", "storage", "--help"]):
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 0
