"""Recovery and the leader-epoch checkpoint: a wrong checkpoint is healed from the batches, never a reason
to cut valid batches; a damaged epoch field in the batches themselves still is."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from common.clock import ManualClock
from storage import checkpoint
from storage.epoch_cache import EpochEntry, LeaderEpochCache
from storage.log import Log, LogConfig
from storage.record_batch import iter_batches
from storage.segment import epoch_cut
from tests.storage.helpers import TS, batch

CFG = LogConfig(segment_bytes=2000, index_interval_bytes=100)
EPOCH_AT = 12  # partition_leader_epoch: bytes 12-16 of a batch, outside the CRC


def entries(log: Log) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()]


def build(pdir: Path) -> Path:
    """Ten batches of two records, epoch 3 for offsets 0-9, epoch 5 for 10-19, one segment."""
    log = Log.open(pdir, CFG, ManualClock(TS))
    for i in range(10):
        log.append_as_leader(batch(2, tag=i), 3 if i < 5 else 5)
    assert entries(log) == [(3, 0), (5, 10)] and len(log.segments) == 1
    log.close()
    return pdir / "leader-epoch-checkpoint"


@pytest.mark.parametrize("text", [
    "0\n1\n-1 0\n",            # a negative epoch
    "0\n2\n3 0\n5 14\n",       # epoch 5 starts at 10, not 14
    "0\n2\n5 0\n3 10\n",       # epochs decreasing
    "0\n1\n99 0\n",            # an epoch no batch has
    "0\n3\n3 0\n3 0\n5 10\n",  # a duplicated line
    "0\n2\n3 -4\n5 10\n",      # a negative start offset
    "0\n2\n3 0\n5 0\n",        # start offsets not increasing
])
def test_a_damaged_epoch_checkpoint_never_cuts_valid_batches(tmp_path: Path, text: str) -> None:
    path = build(tmp_path / "t-0")
    path.write_text(text)
    log = Log.open(tmp_path / "t-0", CFG, ManualClock(TS), recovery_point=0)  # unclean: validate all
    assert log.log_end_offset == 20
    assert entries(log) == [(3, 0), (5, 10)]  # healed from the batches
    log.close()
    assert checkpoint.read_epochs(path) == [EpochEntry(3, 0), EpochEntry(5, 10)]  # and written back


@pytest.mark.parametrize("text", ["0\n1\n-1 0\n", "0\n2\n5 0\n3 10\n", "0\n2\n3 0\n3 10\n", "0\n2\n3 5\n5 5\n",
                                  "0\n1\n3 -1\n", f"0\n1\n{2**31} 0\n", f"0\n1\n3 {2**63}\n"])
def test_read_epochs_refuses_entries_the_cache_cannot_hold(tmp_path: Path, text: str) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text(text)
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.read_epochs(path)


@pytest.mark.parametrize("bad", [[EpochEntry(-1, 0)], [EpochEntry(1, -1)], [EpochEntry(5, 0), EpochEntry(3, 10)],
                                 [EpochEntry(3, 0), EpochEntry(5, 0)], [EpochEntry(3, 0), EpochEntry(3, 5)]])
def test_the_cache_refuses_invalid_initial_entries(bad: list[EpochEntry]) -> None:
    with pytest.raises(ValueError):
        LeaderEpochCache(bad)


def set_epoch(seg: Path, index: int, epoch: int) -> None:
    data = bytearray(seg.read_bytes())
    pos = [p for p, _ in iter_batches(data)][index]
    struct.pack_into(">i", data, pos + EPOCH_AT, epoch)
    seg.write_bytes(bytes(data))


@pytest.mark.parametrize(("index", "epoch", "end"), [
    (7, 4, 14),    # below the batch before it (a truncated batch back after a power loss): cut there
    (7, 9, 14),    # damaged upwards: the next batch is below it, the cache says this one is wrong
    (9, 9, 18),    # the last batch, with an epoch the cache never had though it was written first
    (2, 5, 4),     # in epoch 3's range but above the batches after it
])
def test_a_damaged_epoch_in_the_batches_is_still_cut(tmp_path: Path, index: int, epoch: int, end: int) -> None:
    build(tmp_path / "t-0")
    set_epoch(tmp_path / "t-0" / f"{0:020d}.log", index, epoch)
    log = Log.open(tmp_path / "t-0", CFG, ManualClock(TS), recovery_point=0)
    assert log.log_end_offset == end
    assert all(e.start_offset <= end for e in log.epoch_cache.entries())
    log.close()


def test_epoch_cut_rules() -> None:
    cache = LeaderEpochCache([EpochEntry(3, 0), EpochEntry(5, 10)])
    bases = [0, 2, 4, 10, 12]
    assert epoch_cut([3, 3, 3, 5, 5], bases, -1, cache) == (5, None, None)
    assert epoch_cut([3, 3, 5, 5, 5], bases, -1, cache) == (5, None, 4)  # only the cache disagrees: kept
    assert epoch_cut([3, 3, 2, 5, 5], bases, -1, cache)[0] == 2
    assert epoch_cut([3, 3, 3, 5, 5], bases, 4, cache)[0] == 0  # below the segment before
    assert epoch_cut([3, 3, 3, 5, 6], bases, -1, cache)[0] == 4  # above every epoch the cache knows
    assert epoch_cut([3, 3, 3, 5, 6], bases, -1, None) == (5, None, None)  # no cache: order only


@pytest.mark.parametrize("damage", ["missing", "empty"])
def test_a_missing_or_empty_epoch_checkpoint_is_rebuilt_too(tmp_path: Path, damage: str) -> None:
    # as an unreadable one: an empty cache over stamped batches would answer OffsetsForLeaderEpoch (-1, -1)
    path = build(tmp_path / "t-0")
    if damage == "missing":
        path.unlink()
    else:
        path.write_text("0\n0\n")
    log = Log.open(tmp_path / "t-0", CFG, ManualClock(TS), recovery_point=20)  # clean: nothing validated
    assert entries(log) == [(3, 0), (5, 10)]
    assert log.end_offset_for_epoch(3) == (3, 10)
    log.close()
    assert checkpoint.read_epochs(path) == [EpochEntry(3, 0), EpochEntry(5, 10)]


def test_unstamped_batches_leave_the_cache_empty(tmp_path: Path) -> None:
    pdir = tmp_path / "t-0"
    log = Log.open(pdir, CFG, ManualClock(TS))
    log.append_as_follower(batch(2, epoch=-1))
    log.close()
    (pdir / "leader-epoch-checkpoint").unlink(missing_ok=True)
    log = Log.open(pdir, CFG, ManualClock(TS), recovery_point=2)
    assert entries(log) == [] and log.log_end_offset == 2
    log.close()
    assert not (pdir / "leader-epoch-checkpoint").exists()
