"""Export fixes from the review: a damaged batch length is not a torn tail, a missing HW checkpoint file is
damage, the history's torn lines are reported, and the CLI without the audit extra says what to install."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from audit.export import MAX_BATCH_BYTES, export
from cli.main import main
from storage.record_batch import build_batch
from tests.audit.datadirs import Batch, batch_positions, cluster, history, write_meta, write_replica
from tests.audit.exports import clean_export


def table(out: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(out / f"{name}.parquet").to_pylist()
    return rows


LAST = Path("broker-1") / "t-0" / "00000000000000000003.log"  # batches 3-4 and 5


def _set_length(path: Path, position: int, size: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(">i", data, position + 8, size - 12)
    path.write_bytes(bytes(data))


def test_a_flipped_length_byte_before_a_whole_batch_is_corrupt_not_torn(tmp_path: Path) -> None:
    """The review's case: a byte of the first batch's length field flipped (a 16 MB claim in a 160-byte file)
    with a whole CRC-valid batch after it. Was a torn tail (informational): the replica undamaged, the rest of
    the segment silently dropped."""
    c = cluster(tmp_path / "c")
    seg = c / LAST
    data = bytearray(seg.read_bytes())
    data[9] ^= 0xFF
    seg.write_bytes(bytes(data))
    out = tmp_path / "e"
    summary = export([c], out)
    assert (summary.damaged, summary.torn_tails) == (1, 0)
    [d] = table(out, "damaged")
    second = batch_positions(c / "broker-0" / "t-0" / "00000000000000000003.log")[1]
    assert (d["broker"], d["kind"], d["position"]) == (1, "corrupt_batch", 0)
    assert f"a whole valid batch starts at {second}" in d["error"]
    assert {r["broker"]: r["damaged"] for r in table(out, "replicas")} == {0: False, 1: True, 2: False}


def test_a_length_beyond_any_batch_a_broker_writes_is_corrupt(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    seg = c / LAST
    last = batch_positions(seg)[1]  # the last batch: nothing after it
    _set_length(seg, last, MAX_BATCH_BYTES + 1)
    out = tmp_path / "e"
    export([c], out)
    [d] = table(out, "damaged")
    assert (d["kind"], d["position"]) == ("corrupt_batch", last)
    assert f"more than the largest batch a broker writes ({MAX_BATCH_BYTES})" in d["error"]


@pytest.mark.parametrize("cut", [40, 61, 100])
def test_a_partial_last_write_stays_a_torn_tail(tmp_path: Path, cut: int) -> None:
    """What a kill mid-append leaves: a prefix of the appended batches (half a header, a header, a header
    and part of the records; here of a 3-batch append cut inside its first batch)."""
    c = cluster(tmp_path / "c")
    seg = c / LAST
    whole = seg.read_bytes()
    appended = b"".join(build_batch([(None, f"w{o}".encode() * 20)], base_offset=o, timestamp_ms=1,
                                    partition_leader_epoch=1) for o in (6, 7, 8))
    seg.write_bytes(whole + appended[:cut])
    out = tmp_path / "e"
    summary = export([c], out)
    assert (summary.damaged, summary.torn_tails) == (0, 1)
    [d] = table(out, "damaged")
    assert (d["kind"], d["position"]) == ("torn_tail", len(whole))


def test_the_batch_bound_is_the_brokers_request_body_limit() -> None:
    from broker.server import MAX_BODY_BYTES

    assert MAX_BATCH_BYTES == MAX_BODY_BYTES


def test_a_missing_hw_checkpoint_file_is_damage(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    (c / "broker-2" / "replication-offset-checkpoint").unlink()
    write_meta(c / "broker-3", 3)  # a broker without records (nothing to checkpoint yet): no row
    (c / "broker-3" / "t-1").mkdir()
    out = tmp_path / "e"
    summary = export([c], out)
    assert summary.damaged == 1
    [d] = table(out, "damaged")
    assert (d["broker"], d["topic"], d["kind"], d["file"]) == (2, None, "missing_checkpoint",
                                                               "broker-2/replication-offset-checkpoint")
    assert "hold 6 records" in d["error"]
    hws = {r["broker"]: r["high_watermark"] for r in table(out, "replicas")}
    assert hws == {0: 6, 1: 6, 2: -1, 3: -1}


def test_an_empty_checkpoint_file_is_not_missing(tmp_path: Path) -> None:
    """A broker that checkpointed before any partition had an HW writes an empty file: that is no damage."""
    write_replica(tmp_path / "b", 1, [[Batch(0, ["a"])]], hw=1)
    (tmp_path / "b" / "replication-offset-checkpoint").write_text("0\n0\n")
    out = tmp_path / "e"
    assert export([tmp_path / "b"], out).damaged == 0


def test_history_torn_lines_and_no_sends_are_reported(tmp_path: Path) -> None:
    c = cluster(tmp_path / "c")
    empty = tmp_path / "history.jsonl"
    empty.write_text('{"type": "send", "process": "p0"')  # the writer died inside its first line
    summary = export([c], tmp_path / "e", history=empty)
    assert (summary.sends, summary.history_torn_lines) == (0, 1)
    line = summary.lines()[1]
    assert "(1 torn last line(s) skipped)" in line and "no sends" in line
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert (manifest["has_history"], manifest["history_torn_lines"]) == (True, 1)
    whole = export([c], tmp_path / "e2", history=history(tmp_path / "h2-history.jsonl"))
    assert whole.history_torn_lines == 0 and "skipped" not in whole.lines()[1] and "no sends" not in whole.lines()[1]
    assert json.loads((tmp_path / "e2" / "manifest.json").read_text())["history_torn_lines"] == 0


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """As if ``modules`` were not installed: their import fails; modules that import them are imported anew."""
    import audit

    for name in list(sys.modules):
        if name.split(".")[0] in modules or name in ("audit.schema", "audit.export", "audit.spark_audit"):
            monkeypatch.delitem(sys.modules, name)
    for attr in ("schema", "export", "spark_audit"):  # ``from audit import schema`` takes the attribute first
        monkeypatch.delattr(audit, attr, raising=False)
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(("argv", "missing", "module"), [
    (["export"], ("pyarrow",), "pyarrow"),
    (["audit"], ("pyarrow",), "pyarrow"),
    (["audit"], ("pyspark", "py4j"), "py4j"),
])
def test_without_the_audit_extra_one_line_names_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], argv: list[str],
                                                            missing: tuple[str, ...], module: str) -> None:
    export_dir = clean_export().write(tmp_path / "x")
    args = (["export", "--data-dir", str(cluster(tmp_path / "c")), "--out", str(tmp_path / "e")] if argv == ["export"]
            else ["audit", str(export_dir), "--master", "local[1]"])
    _without(monkeypatch, *missing)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"minibroker: error: minibroker {argv[0]} needs the audit extra ({module} is not installed): "
                   "pip install 'minibroker[audit]'"]
    assert not (tmp_path / "e").exists()


def test_an_import_error_of_another_module_is_not_blamed_on_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from audit.cli import audit_extra

    with pytest.raises(ModuleNotFoundError), audit_extra("export"):
        import not_a_minibroker_module  # type: ignore[import-not-found]  # noqa: F401
