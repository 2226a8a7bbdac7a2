"""Leader-epoch cache semantics (Kafka's) and the checkpoint file formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.wire import TopicPartition
from storage import checkpoint
from storage.epoch_cache import EpochEntry, LeaderEpochCache


def entries(c: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in c.entries()]


def test_assign_ignores_stale_and_keeps_monotonic() -> None:
    writes: list[list[EpochEntry]] = []
    c = LeaderEpochCache(on_change=writes.append)
    assert c.assign(1, 0) and c.assign(3, 10)
    assert not c.assign(2, 20)  # stale epoch
    assert not c.assign(3, 15)  # same epoch, later offset: no change
    assert c.assign(3, 8)  # same epoch, earlier start: replaced
    assert entries(c) == [(1, 0), (3, 8)]
    assert c.assign(5, 5)  # non-monotonic start: (3, 8) removed
    assert entries(c) == [(1, 0), (5, 5)]
    assert len(writes) == 4 and writes[-1] == c.entries()
    with pytest.raises(ValueError):
        c.assign(-1, 0)


def test_end_offset_for_kip_279() -> None:
    c = LeaderEpochCache([EpochEntry(2, 10), EpochEntry(4, 30), EpochEntry(7, 50)])
    assert c.end_offset_for(7, 99) == (7, 99)
    assert c.end_offset_for(8, 99) == (-1, -1)
    assert c.end_offset_for(5, 99) == (4, 50)
    assert c.end_offset_for(4, 99) == (4, 50)
    assert c.end_offset_for(2, 99) == (2, 30)
    assert c.end_offset_for(1, 99) == (1, 10)
    assert c.end_offset_for(-1, 99) == (-1, -1)
    assert LeaderEpochCache().end_offset_for(0, 5) == (-1, -1)
    assert c.epoch_for_offset(9) is None and c.epoch_for_offset(30) == 4 and c.epoch_for_offset(49) == 4


def test_truncation_at_both_ends() -> None:
    c = LeaderEpochCache([EpochEntry(2, 10), EpochEntry(4, 30), EpochEntry(7, 50)])
    c.truncate_from_end(50)
    assert entries(c) == [(2, 10), (4, 30)]
    c.truncate_from_end(31)
    assert entries(c) == [(2, 10), (4, 30)]
    c.truncate_from_start(35)
    assert entries(c) == [(4, 35)]
    c.truncate_from_start(20)
    assert entries(c) == [(4, 35)]
    c.clear()
    assert entries(c) == [] and c.latest_epoch() is None


def test_offset_checkpoint_roundtrip_and_format(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    data = {TopicPartition("b", 1): 7, TopicPartition("a-x", 0): 12}
    checkpoint.write_offsets(path, data)
    assert path.read_text() == "0\n2\na-x 0 12\nb 1 7\n"
    assert checkpoint.read_offsets(path) == data
    assert not list(tmp_path.glob("*.tmp"))
    assert checkpoint.read_offsets(tmp_path / "absent") == {}
    with pytest.raises(ValueError):
        checkpoint.write_offsets(path, {TopicPartition("has space", 0): 1})


def test_epoch_checkpoint_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    checkpoint.write_epochs(path, [EpochEntry(3, 0), EpochEntry(5, 120)])
    assert path.read_text() == "0\n2\n3 0\n5 120\n"
    assert checkpoint.read_epochs(path) == [EpochEntry(3, 0), EpochEntry(5, 120)]


@pytest.mark.parametrize("text", ["", "1\n0\n", "0\n2\na 0 1\n", "0\nx\n", "0\n1\na 0\n", "0\n1\na b c\n",
                                  "\xff"])
def test_malformed_checkpoints(tmp_path: Path, text: str) -> None:
    path = tmp_path / "cp"
    path.write_text(text, encoding="latin-1")
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.read_offsets(path)
