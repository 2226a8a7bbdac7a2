"""``read_image``: the journal's image for tools, read-only (no lock, no truncation, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.journal import JOURNAL_NAME, SNAPSHOT_NAME, JournalCorruptError, encode_frame, read_image
from controller.state import MetadataImage
from tests.controller.test_journal import OPS, image_of, written


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_read_image_equals_replay_across_a_snapshot(tmp_path: Path) -> None:
    journal, image = written(tmp_path, OPS[:4])
    journal.snapshot(image)
    for op in OPS[4:]:
        journal.append(op)
    # the controller still holds the lock: read_image neither takes nor waits for it
    assert read_image(tmp_path) == image_of(OPS)
    journal.close()


def test_read_image_leaves_a_torn_tail_in_place_and_writes_nothing(tmp_path: Path) -> None:
    journal, _image = written(tmp_path, OPS)
    journal.close()
    (tmp_path / ".lock").unlink()
    path = tmp_path / JOURNAL_NAME
    with open(path, "r+b") as f:  # a frame being appended (or a crash mid-write)
        f.truncate(path.stat().st_size - 5)
    before = _files(tmp_path)
    assert read_image(tmp_path) == image_of(OPS[:-1])
    assert _files(tmp_path) == before  # not truncated, no .lock created


def test_read_image_of_an_empty_or_absent_dir_is_empty(tmp_path: Path) -> None:
    assert read_image(tmp_path) == MetadataImage()
    assert read_image(tmp_path / "absent") == MetadataImage()
    assert list(tmp_path.iterdir()) == []


def test_read_image_refuses_damage(tmp_path: Path) -> None:
    journal, image = written(tmp_path / "j", OPS)
    journal.close()
    path = tmp_path / "j" / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # the first frame's payload, whole frames after it
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError, match="is damaged but"):
        read_image(tmp_path / "j")
    assert path.read_bytes() == bytes(data)

    journal, image = written(tmp_path / "s", OPS[:2])
    journal.snapshot(image)
    journal.close()
    snap = tmp_path / "s" / SNAPSHOT_NAME
    snap.write_bytes(snap.read_bytes()[:-2])
    with pytest.raises(JournalCorruptError):
        read_image(tmp_path / "s")


def test_read_image_refuses_records_that_do_not_decode(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_NAME).write_bytes(encode_frame({"offset": 1, "records": [{"type": "nope"}]}))
    with pytest.raises(JournalCorruptError, match="does not decode"):
        read_image(tmp_path)
