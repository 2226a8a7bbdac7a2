"""The Log's producer state: leader checks, follower updates, rebuild on open and truncation, retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ErrorCode
from storage.log import Log
from storage.producer_state import ProducerStateError
from storage.record_batch import build_batch, iter_batches
from tests.storage.helpers import TS, batch, open_log

PID = 42


def ibatch(seq: int, n: int = 2, *, pid: int = PID, epoch: int = 0, tag: int = 0) -> bytes:
    return build_batch([(b"k", bytes([tag % 256]) * 10, TS + i) for i in range(n)], timestamp_ms=TS,
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def record_count(log: Log) -> int:
    return sum(h.record_count for _, h in iter_batches(log.read(log.log_start_offset, 1 << 24).records))


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    return tmp_path / "t-0"


def test_leader_duplicate_writes_nothing_and_returns_the_original_offsets(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(3), 0)
    first = log.append_as_leader(ibatch(0), 0)
    assert (first.first_offset, first.last_offset, first.duplicate) == (3, 4, False)
    log.append_as_leader(batch(1), 0)
    again = log.append_as_leader(ibatch(0), 0)
    assert (again.first_offset, again.last_offset, again.duplicate, again.num_records) == (3, 4, True, 0)
    assert log.log_end_offset == 6 and record_count(log) == 6
    with pytest.raises(ProducerStateError) as info:
        log.append_as_leader(ibatch(3), 0)  # a gap
    assert info.value.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.log_end_offset == 6
    log.close()


def test_a_multi_batch_append_is_one_unit(pdir: Path) -> None:
    log = open_log(pdir)
    two = ibatch(0) + ibatch(2, 3)
    info = log.append_as_leader(two, 0)
    assert (info.first_offset, info.last_offset, info.batches) == (0, 4, 2)
    dup = log.append_as_leader(two, 0)
    assert (dup.first_offset, dup.last_offset, dup.duplicate) == (0, 4, True)
    with pytest.raises(ProducerStateError):  # a duplicate then a new batch: nothing appended
        log.append_as_leader(ibatch(2, 3) + ibatch(5), 0)
    with pytest.raises(ProducerStateError):  # a good batch then a gap: the good one is not appended either
        log.append_as_leader(ibatch(5) + ibatch(9), 0)
    assert log.log_end_offset == 5
    log.close()


def test_a_duplicate_is_still_recognised_after_a_restart(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=400)
    for seq in range(0, 12, 2):  # six batches over several segments
        log.append_as_leader(ibatch(seq, tag=seq), 0)
        log.append_as_leader(batch(1), 0)
    log.close()
    log = open_log(pdir, segment_bytes=400)
    assert len(log.segments) > 1
    entry = log.producer_state.entry(PID)
    assert entry is not None and entry.last_seq == 11 and len(entry.batches) == 5
    dup = log.append_as_leader(ibatch(8, tag=8), 0)
    assert (dup.duplicate, dup.first_offset) == (True, 12)
    with pytest.raises(ProducerStateError):
        log.append_as_leader(ibatch(0), 0)  # older than the last five
    assert log.append_as_leader(ibatch(12), 0).first_offset == 18
    log.close()


def test_a_truncated_batch_is_no_longer_a_duplicate(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(ibatch(0), 0)
    log.append_as_leader(ibatch(2), 0)  # offsets 2-3
    log.truncate_to(2)
    info = log.append_as_leader(ibatch(2), 0)  # the retry after a leader change: appended again
    assert (info.duplicate, info.first_offset) == (False, 2)
    assert record_count(log) == 4
    log.truncate_fully_and_start_at(10)
    assert log.producer_state.entry(PID) is None
    log.close()


def test_truncation_below_a_producers_whole_cache_rebuilds_it_from_the_log(pdir: Path) -> None:
    log = open_log(pdir)
    for seq in range(0, 14, 2):  # seven batches, offsets 0-13
        log.append_as_leader(ibatch(seq), 0)
    log.truncate_to(4)  # keeps sequences 0-3 only; the cache held 4-13
    entry = log.producer_state.entry(PID)
    assert entry is not None and [m.first_seq for m in entry.batches] == [0, 2]
    assert log.append_as_leader(ibatch(2), 0).duplicate
    assert log.append_as_leader(ibatch(4), 0).first_offset == 4
    log.close()


def test_retention_forgets_producers_below_the_log_start(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=300)
    log.append_as_leader(ibatch(0, pid=1), 0)
    log.append_as_leader(ibatch(0, pid=2), 0)
    log.roll()
    log.append_as_leader(ibatch(2, pid=2), 0)
    log.maybe_increment_log_start_offset(2)
    assert log.producer_state.entry(1) is None and log.producer_state.entry(2) is not None
    log.append_as_leader(batch(1), 0)
    log.roll()
    log.maybe_increment_log_start_offset(log.log_end_offset)
    assert log.delete_old_segments() > 0
    assert len(log.producer_state) == 0
    # an unknown producer again: any sequence is accepted
    assert not log.append_as_leader(ibatch(7, pid=2), 0).duplicate
    log.close()
    reopened = open_log(pdir, segment_bytes=300)
    assert reopened.producer_state.entry(1) is None
    reopened.close()


def test_follower_appends_build_the_same_state_and_a_new_leader_deduplicates(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "a-0")
    follower = open_log(tmp_path / "b-0")
    leader.append_as_leader(batch(2), 0)
    leader.append_as_leader(ibatch(0) + ibatch(2), 0)
    leader.append_as_leader(ibatch(0, pid=5, epoch=3), 0)
    follower.append_as_follower(leader.read(0, 1 << 20).records)
    assert follower.producer_state.entries() == leader.producer_state.entries()
    follower.maybe_assign_epoch_start_offset(1, follower.log_end_offset)
    dup = follower.append_as_leader(ibatch(0) + ibatch(2), 1)  # the old leader's batches, retried
    assert (dup.duplicate, dup.first_offset, dup.last_offset) == (True, 2, 5)
    with pytest.raises(ProducerStateError) as info:
        follower.append_as_leader(ibatch(2, pid=5, epoch=2), 1)
    assert info.value.code is ErrorCode.INVALID_PRODUCER_EPOCH
    assert follower.log_end_offset == leader.log_end_offset
    leader.close()
    follower.close()


def test_idempotent_batch_without_epoch_is_invalid_record(pdir: Path) -> None:
    log = open_log(pdir)
    with pytest.raises(ProducerStateError) as info:
        log.append_as_leader(ibatch(0, epoch=-1), 0)
    assert info.value.code is ErrorCode.INVALID_RECORD
    assert log.log_end_offset == 0
    log.close()
