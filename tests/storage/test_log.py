"""Log: append (leader/follower), read, roll, truncate, retention, epochs, timestamps, reopen."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from common.clock import ManualClock
from common.wire import TopicPartition
from storage import record_batch as rb
from storage.log import (
    EPOCH_CHECKPOINT,
    MAX_TIMESTAMP,
    Log,
    LogConfig,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    StaleLeaderEpochError,
    TimestampOffset,
)
from storage.record_batch import BatchTooShortError, iter_batches
from tests.storage.helpers import TS, batch, open_log
from tests.storage.scan import assert_indexes_match_scan


def offsets_of(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in iter_batches(data)]


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    return tmp_path / "orders-3"


def test_open_empty(pdir: Path) -> None:
    log = open_log(pdir)
    assert log.topic_partition == TopicPartition("orders", 3)
    assert (log.log_start_offset, log.log_end_offset, log.latest_epoch()) == (0, 0, None)
    assert (pdir / "00000000000000000000.log").exists()
    log.close()


def test_bad_directory_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        open_log(tmp_path / "noPartition")


def test_append_as_leader_assigns_offsets_and_stamps_epoch(pdir: Path) -> None:
    log = open_log(pdir)
    info = log.append_as_leader(batch(3, base_offset=77), leader_epoch=5)
    assert (info.first_offset, info.last_offset, info.num_records, info.batches) == (0, 2, 3, 1)
    info2 = log.append_as_leader(batch(2) + batch(4), leader_epoch=5)
    assert (info2.first_offset, info2.last_offset, info2.num_records, info2.batches) == (3, 8, 6, 2)
    assert log.log_end_offset == 9
    data = log.read(0, 1 << 20).records
    assert offsets_of(data) == [(0, 2), (3, 4), (5, 8)]
    headers = rb.validate_batches(data, max_batch_size=1 << 20)
    assert {h.partition_leader_epoch for h in headers} == {5}
    assert log.epoch_cache.entries()[0].start_offset == 0
    log.close()


def test_leader_stale_epoch_refused(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(), 4)
    with pytest.raises(StaleLeaderEpochError):
        log.append_as_leader(batch(), 3)
    log.append_as_leader(batch(), 6)
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(4, 0), (6, 1)]
    log.close()


def test_partial_batch_refused_without_write(pdir: Path) -> None:
    log = open_log(pdir)
    good = batch(2)
    with pytest.raises(BatchTooShortError):
        log.append_as_leader(good + good[:-3], 1)
    assert log.log_end_offset == 0 and log.segments[-1].size == 0
    log.close()


def test_append_as_follower(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_follower(batch(2, base_offset=0, epoch=1) + batch(3, base_offset=2, epoch=2))
    assert log.log_end_offset == 5
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(1, 0), (2, 2)]
    with pytest.raises(OffsetMismatchError):
        log.append_as_follower(batch(1, base_offset=6, epoch=2))
    with pytest.raises(OffsetMismatchError):
        log.append_as_follower(batch(1, base_offset=5, epoch=2) + batch(1, base_offset=7, epoch=2))
    assert log.log_end_offset == 5
    data = log.read(0, 1 << 20).records
    assert offsets_of(data) == [(0, 1), (2, 4)]
    log.close()


def test_read_bounds(pdir: Path) -> None:
    log = open_log(pdir)
    for _ in range(5):
        log.append_as_leader(batch(2, size=100), 0)
    one = rb.parse_header(batch(2, size=100)).size
    assert offsets_of(log.read(0, one).records) == [(0, 1)]
    assert offsets_of(log.read(3, one * 2).records) == [(2, 3), (4, 5)]
    assert log.read(3, 1).first_offset == 2  # larger than max_bytes: still one batch
    assert log.read(3, 1, min_one_batch=False).records == b""
    assert offsets_of(log.read(0, 1 << 20, max_offset=4).records) == [(0, 1), (2, 3)]
    assert log.read(0, 1 << 20, max_offset=1).records == b""  # the batch reaches past max_offset
    assert log.read(4, 1 << 20, max_offset=4) .first_offset == -1
    assert log.read(10, 100).records == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(11, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    log.close()


def test_read_across_index_entries_and_segments(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=2000, index_interval_bytes=150)
    sizes = []
    for i in range(60):
        data = batch(1 + i % 3, size=20 + i, tag=i)
        sizes.append(rb.parse_header(data).record_count)
        log.append_as_leader(data, 0)
    assert len(log.segments) > 2
    assert any(len(s.offsets) > 0 for s in log.segments)
    total = sum(sizes)
    # every start offset returns the batch holding it first, and reading on covers everything once
    for start in range(total):
        got = offsets_of(log.read(start, 300).records)
        assert got and got[0][0] <= start <= got[0][1]
    seen: list[tuple[int, int]] = []
    pos = 0
    while pos < total:
        got = offsets_of(log.read(pos, 500).records)
        seen += got
        pos = got[-1][1] + 1
    assert [b for b, _ in seen] == sorted({b for b, _ in seen})
    assert seen[-1][1] == total - 1
    log.close()


def test_roll_by_size_and_time(pdir: Path) -> None:
    clock = ManualClock(TS)
    log = open_log(pdir, clock, segment_bytes=1024, segment_ms=1000)
    b = batch(1, size=250)
    for _ in range(4):
        log.append_as_leader(b, 0)
    assert [s.base_offset for s in log.segments] == [0, 3]
    log.append_as_leader(batch(1, ts=TS + 5000), 0)  # the batch's timestamp says the segment is old
    assert [s.base_offset for s in log.segments] == [0, 3, 4]
    clock.advance(10_000)
    log.maybe_roll()
    assert [s.base_offset for s in log.segments] == [0, 3, 4, 5]
    log.roll()  # empty active segment: no-op
    assert len(log.segments) == 4
    assert (pdir / "00000000000000000004.log").exists()
    assert log.recovery_point == 5
    log.close()


def spanning(base_offset: int, last_offset_delta: int) -> bytes:
    """A one-record batch that claims ``last_offset_delta + 1`` offsets (the fetcher refuses it; the log takes
    it as given): the only way a test can put 2**32 offsets in one segment."""
    buf = bytearray(batch(1, base_offset=base_offset, epoch=1))
    struct.pack_into(">i", buf, 23, last_offset_delta)
    struct.pack_into(">I", buf, 17, rb.compute_crc(buf, 0, len(buf)))
    return bytes(buf)


def test_a_segment_rolls_before_its_relative_offsets_overflow(pdir: Path) -> None:
    """A segment and its indexes hold offsets relative to its base in 32 bits: a batch whose last offset is
    more than 0xFFFFFFFF past the active segment's base starts a new segment."""
    log = open_log(pdir, index_interval_bytes=0)
    log.append_as_follower(batch(1, base_offset=0, epoch=1))
    log.append_as_follower(spanning(1, 0x7FFFFFFF))
    log.append_as_follower(spanning(2**31 + 1, 0x7FFFFFFE))  # last offset 0xFFFFFFFF: still fits
    assert [s.base_offset for s in log.segments] == [0]
    log.append_as_follower(batch(1, base_offset=2**32, epoch=1))
    assert [s.base_offset for s in log.segments] == [0, 2**32]
    assert (pdir / "00000000004294967296.log").exists()
    assert offsets_of(log.read(2**32, 1 << 20).records) == [(2**32, 2**32)]
    log.close()  # writes the indexes


def test_truncate_to(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=1024)
    for i in range(10):
        log.append_as_leader(batch(2, size=200), i // 3)
    assert len(log.segments) > 2
    assert log.truncate_to(20) is False
    assert log.truncate_to(9)  # mid-batch: the whole batch holding 9 goes
    assert log.log_end_offset == 8
    assert log.latest_epoch() == 1
    assert log.truncate_to(6)
    assert log.log_end_offset == 6
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(0, 0)]
    data = b"".join(log.read(s.base_offset, 1 << 20).records for s in log.segments if s.size)
    assert offsets_of(data) == [(0, 1), (2, 3), (4, 5)]
    info = log.append_as_leader(batch(1), 3)
    assert info.first_offset == 6
    log.close()
    log = open_log(pdir, segment_bytes=1024)
    assert log.log_end_offset == 7
    assert log.end_offset_for_epoch(0) == (0, 6)
    log.close()


def test_truncate_at_the_leo_drops_an_epoch_that_never_appended(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(2), 1)
    log.maybe_assign_epoch_start_offset(2, log.log_end_offset)  # became leader at epoch 2, then deposed
    assert log.latest_epoch() == 2
    assert log.truncate_to(log.log_end_offset) is False  # no data removed ...
    assert log.latest_epoch() == 1  # ... but the empty epoch is gone, as in Kafka's truncateTo
    log.close()
    log = open_log(pdir)
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(1, 0)]
    log.close()


def test_truncate_fully_and_start_at(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(5), 2)
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset, log.latest_epoch()) == (100, 100, None)
    assert [p.name for p in sorted(pdir.glob("*.log"))] == ["00000000000000000100.log"]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(99, 10)
    log.append_as_follower(batch(2, base_offset=100, epoch=7))
    assert log.log_end_offset == 102
    log.close()
    log = open_log(pdir)
    assert (log.log_start_offset, log.log_end_offset, log.latest_epoch()) == (100, 102, 7)
    log.close()


def test_truncate_below_log_start_is_full(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(5), 0)
    log.maybe_increment_log_start_offset(3)
    assert log.truncate_to(2)
    assert (log.log_start_offset, log.log_end_offset) == (2, 2)
    log.close()


def test_retention_by_bytes_time_and_log_start(pdir: Path) -> None:
    clock = ManualClock(TS)
    log = open_log(pdir, clock, segment_bytes=600, retention_bytes=1500)
    for i in range(12):
        log.append_as_leader(batch(1, size=250, ts=TS + i), 0)
    n_before = len(log.segments)
    assert log.delete_old_segments(high_watermark=0) == 0  # nothing below the HW
    deleted = log.delete_old_segments()
    assert deleted > 0 and len(log.segments) == n_before - deleted
    assert log.size_bytes - log.segments[0].size < 1500
    assert log.log_start_offset == log.segments[0].base_offset
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    # by time
    log.update_config(LogConfig(segment_bytes=600, retention_ms=1000))
    clock.advance(5000)
    log.delete_old_segments()
    assert len(log.segments) == 1 and log.log_start_offset == log.segments[0].base_offset
    # by log start offset
    log.maybe_increment_log_start_offset(12)
    assert log.read(12, 10).records == b""
    log.close()


def test_an_idle_partition_s_active_segment_expires_too_once_replicated(pdir: Path) -> None:
    """Kafka's LocalLog.deletableSegments includes the active segment (rolled first, UnifiedLog.deleteSegments):
    a partition nobody writes to any more kept its last segment, up to segment.bytes, past retention for ever."""
    clock = ManualClock(TS)
    log = open_log(pdir, clock, retention_ms=60_000)
    for i in range(5):
        log.append_as_leader(batch(1, ts=TS + i), 0)
    clock.advance(7 * 24 * 3_600_000)
    assert log.delete_old_segments(high_watermark=4) == 0, "not while a record is above the HW"
    assert log.delete_old_segments(high_watermark=5) == 1
    assert [s.base_offset for s in log.segments] == [5] and (log.log_start_offset, log.log_end_offset) == (5, 5)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    assert log.latest_epoch() == 0, "the epoch cache keeps the latest epoch, from the new log start"
    assert log.delete_old_segments(high_watermark=5) == 0, "an empty active segment stays"
    log.append_as_leader(batch(1, ts=clock.now_ms()), 0)
    assert log.log_end_offset == 6
    log.close()


def test_a_segment_truncated_to_empty_counts_its_age_from_the_truncation(pdir: Path) -> None:
    clock = ManualClock(TS)
    log = open_log(pdir, clock, segment_ms=60_000)
    log.append_as_leader(batch(1, ts=-1), 0)
    clock.advance(120_000)
    assert log.truncate_to(0)
    for _ in range(2):
        log.append_as_leader(batch(1, ts=-1), 0)
    assert [s.base_offset for s in log.segments] == [0], "no roll: the emptied segment is as good as new"
    log.close()


def test_segments_without_timestamps_age_by_their_file_time(pdir: Path) -> None:
    # batches whose timestamps are all -1 (a client may send them): Kafka's LogSegment.largestTimestamp
    # falls back to the file's modification time; they used to be deleted at the first retention check
    import os
    import time

    now_ms = time.time_ns() // 1_000_000
    clock = ManualClock(now_ms)
    log = open_log(pdir, clock, segment_bytes=600, retention_ms=60_000)
    for _ in range(6):
        log.append_as_leader(batch(1, size=250, ts=-1), 0)
    assert len(log.segments) > 1
    assert log.delete_old_segments() == 0  # written just now
    old = (now_ms - 3_600_000) * 1_000_000
    for seg in log.segments[:-1]:
        os.utime(pdir / f"{seg.base_offset:020d}.log", ns=(old, old))  # an hour ago
    rolled = len(log.segments) - 1
    assert log.delete_old_segments() == rolled
    log.close()


def test_an_unreadable_epoch_checkpoint_is_rebuilt_from_the_batches(pdir: Path) -> None:
    # an empty cache would make a leader answer OffsetsForLeaderEpoch for an older epoch with the offset
    # where its own began, and a follower keep data the leader never had
    log = open_log(pdir, segment_bytes=400)
    for epoch in (1, 1, 3, 3, 3, 5):
        log.append_as_leader(batch(2, size=100), epoch)
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(1, 0), (3, 4), (5, 10)]
    assert len(log.segments) > 1
    log.close()
    (pdir / "leader-epoch-checkpoint").write_text("0\n2\n1 zero\n")  # damaged
    log = open_log(pdir)
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(1, 0), (3, 4), (5, 10)]
    log.close()
    from storage import checkpoint

    assert [(e.epoch, e.start_offset) for e in checkpoint.read_epochs(pdir / "leader-epoch-checkpoint")] == [
        (1, 0), (3, 4), (5, 10)]  # written back


def test_log_start_offset_moves_only_forward(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=300)
    for _ in range(6):
        log.append_as_leader(batch(1, size=200), 1)
    assert log.maybe_increment_log_start_offset(3)
    assert not log.maybe_increment_log_start_offset(2)
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(7)
    assert log.delete_old_segments() == 3
    assert log.read(3, 10).first_offset == 3
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(1, 3)]
    log.close()


def test_epoch_lookup(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(3), 1)
    log.append_as_leader(batch(2), 3)
    log.append_as_leader(batch(1), 3)
    assert log.end_offset_for_epoch(1) == (1, 3)
    assert log.end_offset_for_epoch(2) == (1, 3)
    assert log.end_offset_for_epoch(3) == (3, 6)
    assert log.end_offset_for_epoch(4) == (-1, -1)
    assert log.end_offset_for_epoch(0) == (0, 0)
    log.close()


def test_fetch_offset_by_timestamp(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=1000, index_interval_bytes=100)
    for i in range(30):
        log.append_as_leader(batch(2, ts=TS + 10 * i, size=40), 2)
    assert log.fetch_offset_by_timestamp(TS) == TimestampOffset(TS, 0, 2)
    assert log.fetch_offset_by_timestamp(TS + 1) == TimestampOffset(TS + 1, 1, 2)
    assert log.fetch_offset_by_timestamp(TS + 2) == TimestampOffset(TS + 10, 2, 2)
    assert log.fetch_offset_by_timestamp(TS + 155) == TimestampOffset(TS + 160, 32, 2)
    assert log.fetch_offset_by_timestamp(TS + 10_000) is None
    assert log.fetch_offset_by_timestamp(-1) == TimestampOffset(-1, 60, 2)
    assert log.fetch_offset_by_timestamp(-2) == TimestampOffset(-1, 0, 2)
    log.close()
    log = open_log(pdir, segment_bytes=1000, index_interval_bytes=100)
    assert log.fetch_offset_by_timestamp(TS + 155) == TimestampOffset(TS + 160, 32, 2)
    log.close()


def test_reopen_keeps_everything(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=2000, index_interval_bytes=100)
    for i in range(40):
        log.append_as_leader(batch(1 + i % 4, size=30), i // 10)
    before = log.read(0, 1 << 20).records, log.log_end_offset, log.epoch_cache.entries()
    indexes = [(list(s.offsets.keys), list(s.offsets.values), list(s.times.keys)) for s in log.segments]
    log.close()
    for recovery_point in (0, log.log_end_offset):
        log = Log.open(pdir, LogConfig(segment_bytes=2000, index_interval_bytes=100), ManualClock(TS),
                       recovery_point=recovery_point)
        assert (log.read(0, 1 << 20).records, log.log_end_offset, log.epoch_cache.entries()) == before
        assert [(list(s.offsets.keys), list(s.offsets.values), list(s.times.keys))
                for s in log.segments] == indexes
        log.close()


def test_missing_and_corrupt_indexes_are_rebuilt(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=2000, index_interval_bytes=100)
    for _ in range(40):
        log.append_as_leader(batch(2, size=30), 0)
    indexes = [(list(s.offsets.keys), list(s.offsets.values)) for s in log.segments]
    end = log.log_end_offset
    log.close()
    idx = sorted(pdir.glob("*.index"))
    idx[0].unlink()
    idx[1].write_bytes(idx[1].read_bytes()[:-3])
    (pdir / sorted(pdir.glob("*.timeindex"))[2].name).write_bytes(b"\xff" * 12)
    log = Log.open(pdir, LogConfig(segment_bytes=2000, index_interval_bytes=100), ManualClock(TS),
                   recovery_point=end)
    assert [(list(s.offsets.keys), list(s.offsets.values)) for s in log.segments] == indexes
    assert sorted(pdir.glob("*.index"))[0].stat().st_size == 8 * len(indexes[0][0])
    log.close()


def test_flush_messages_policy(pdir: Path) -> None:
    log = open_log(pdir, flush_messages=3)
    log.append_as_leader(batch(1), 0)
    assert log.recovery_point == 0
    log.append_as_leader(batch(2), 0)
    assert log.recovery_point == 3


def test_flush_ms_policy(pdir: Path) -> None:
    clock = ManualClock(TS)
    log = open_log(pdir, clock, flush_ms=1000)
    log.append_as_leader(batch(1), 0)
    assert log.recovery_point == 0
    clock.advance(1000)
    log.maybe_flush()
    assert log.recovery_point == 1
    log.close()


async def test_deferred_roll_flush(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=500)
    log.defer_roll_flush = True
    for _ in range(4):
        log.append_as_leader(batch(1, size=300), 0)
    assert log.recovery_point == 0
    await log.flush_rolled_segments()
    assert log.recovery_point == log.segments[-1].base_offset
    log.close()


async def test_a_segment_made_active_again_by_a_truncation_is_not_flushed_as_rolled(pdir: Path) -> None:
    """A truncation into a rolled, not yet flushed segment makes it the active one: the deferred roll flush must
    leave it to ``flush`` (it marked it flushed and moved the recovery point over appends made during its fsync)."""
    log = open_log(pdir)
    log.defer_roll_flush = True
    for _ in range(3):
        log.append_as_leader(batch(1), 0)
    log.roll()
    log.append_as_leader(batch(1), 0)
    log.truncate_to(2)  # segment 0 is the active one again
    assert len(log.segments) == 1 and log.recovery_point == 0
    log.append_as_leader(batch(2), 0)
    await log.flush_rolled_segments()
    assert log.recovery_point == 0  # nothing rolled is left to flush
    assert log.segments[-1].unflushed
    log.flush()
    assert log.recovery_point == log.log_end_offset == 4
    log.close()


async def test_a_crash_after_truncation_and_reappend_reads_whole_batches(pdir: Path) -> None:
    """A truncation into a rolled segment, other batches appended under the same offsets, the LogManager's
    deferred flush, a kill: reads after the restart return whole batches. The index file kept the cut
    batches' entries and the deferred flush moved the recovery point over the new ones; the reopened segment
    trusted the file (its last entry matched) and a read landed in the middle of a batch."""
    log = open_log(pdir, index_interval_bytes=1)
    log.defer_roll_flush = True  # as the LogManager sets it
    for n in (1, 2, 1, 1):  # offsets 0 | 1-2 | 3 | 4
        log.append_as_leader(batch(n, size=20), 0)
    log.roll()
    log.append_as_leader(batch(1), 0)
    log.truncate_to(1)
    for n in (1, 2, 1):  # offsets 1 | 2-3 | 4: other batch boundaries under the same offsets
        log.append_as_leader(batch(n, size=20, tag=7), 0)
    await log.flush_rolled_segments()
    leo = log.log_end_offset
    # the first log is never closed, as after a kill; the recovery point checkpoint is what it reports
    crashed = Log.open(pdir, LogConfig(index_interval_bytes=1), ManualClock(TS), recovery_point=log.recovery_point)
    assert crashed.log_end_offset == leo
    for offset in range(leo):
        first = next(iter_batches(crashed.read(offset, 1 << 20).records))[1]
        assert first.base_offset <= offset <= first.last_offset
    crashed.close()


async def test_index_files_follow_a_truncation(pdir: Path) -> None:
    """After a truncation, a roll, the deferred flush and a clean close, the reopened segment's time index
    holds no cut batch: their timestamps (here far ahead) stayed in the file and made the segment look that
    new to retention."""
    log = open_log(pdir, index_interval_bytes=1)
    log.defer_roll_flush = True  # as the LogManager sets it
    for i, ts in enumerate((TS + 500, TS + 510, TS + 999_000, TS + 999_100)):
        log.append_as_leader(batch(1, ts=ts, size=20, tag=i), 0)
    log.flush()
    log.truncate_to(2)
    for ts in (TS + 20, TS + 30):  # older: no new time index entry
        log.append_as_leader(batch(1, ts=ts, size=20), 0)
    assert log.segments[0].largest_timestamp_ms() == TS + 510
    log.roll()
    await log.flush_rolled_segments()
    log.close()
    log = Log.open(pdir, LogConfig(index_interval_bytes=1), ManualClock(TS), recovery_point=log.recovery_point)
    assert log.segments[0].largest_timestamp_ms() == TS + 510
    assert max(log.segments[0].times.keys) == TS + 510
    log.close()


def test_delete(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(), 0)
    log.delete()
    assert not pdir.exists()


def test_truncate_into_a_batch_that_starts_below_log_start(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(2), 0)
    log.maybe_increment_log_start_offset(1)
    assert log.truncate_to(1)
    assert (log.log_start_offset, log.log_end_offset) == (1, 1)
    log.close()


def test_epoch_assigned_at_leo_survives_reopen(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(2), 0)
    log.maybe_assign_epoch_start_offset(4, log.log_end_offset)
    log.close()
    log = open_log(pdir)
    assert log.end_offset_for_epoch(0) == (0, 2) and log.latest_epoch() == 4
    log.close()


def test_follower_epoch_rules(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_follower(batch(2, epoch=3))
    log.maybe_assign_epoch_start_offset(5, 2)  # became leader, wrote nothing, then follower again
    log.append_as_follower(batch(1, base_offset=2, epoch=4))  # the new leader's epoch-4 data supersedes it
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(3, 0), (4, 2)]
    with pytest.raises(StaleLeaderEpochError):
        log.append_as_follower(batch(1, base_offset=3, epoch=3))
    with pytest.raises(StaleLeaderEpochError):
        log.append_as_follower(batch(1, base_offset=3, epoch=-1))
    assert log.log_end_offset == 3
    log.close()


def test_damaged_segment_below_recovery_point_is_recovered_not_raised(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=600, index_interval_bytes=50)
    for _ in range(9):
        log.append_as_leader(batch(1, size=200), 0)
    end = log.log_end_offset
    log.close()
    logs = sorted(pdir.glob("*.log"))
    assert len(logs) >= 3
    logs[1].write_bytes(logs[1].read_bytes()[:-5])  # torn, but below the recovery point
    (pdir / logs[1].name.replace(".log", ".index")).unlink()
    logs[0].write_bytes(b"\x01" * 10)  # garbage shorter than a header
    log = Log.open(pdir, LogConfig(segment_bytes=600, index_interval_bytes=50), ManualClock(TS), recovery_point=end)
    # Recovered, not raised; and since the first segment was cut to nothing, the later ones go too (as Kafka's
    # recoverLog after an invalid batch): keeping them left a hole of offsets that reads skipped over
    # (test_recovery_keeps_offsets_contiguous_below_the_recovery_point).
    assert [s.size for s in log.segments] == [0]
    assert log.log_end_offset == 0
    log.append_as_leader(batch(1), 1)  # and the log keeps working
    log.close()


def test_write_failure_makes_the_log_unusable_not_torn(pdir: Path) -> None:
    import os

    from storage.log import StorageError

    log = open_log(pdir)
    log.append_as_leader(batch(2), 0)
    seg = log.segments[-1]
    size = seg.size
    ro = os.open(pdir / "00000000000000000000.log", os.O_RDONLY)
    os.dup2(ro, seg.fd)  # the segment's descriptor now refuses writes (EBADF)
    os.close(ro)
    with pytest.raises(StorageError):
        log.append_as_leader(batch(1), 0)
    with pytest.raises(StorageError):
        log.read(0, 100)
    assert log.log_end_offset == 2 and (pdir / "00000000000000000000.log").stat().st_size == size
    log.close()


def test_batch_larger_than_a_segment_refused(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=1024)
    with pytest.raises(rb.BatchTooLargeError):
        log.append_as_leader(batch(1, size=2000), 0)
    with pytest.raises(rb.BatchTooLargeError):
        log.append_as_follower(batch(1, size=2000))
    assert log.log_end_offset == 0
    log.close()


def test_recovery_of_a_torn_middle_segment_drops_the_later_ones(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=1000)
    for _ in range(8):
        log.append_as_leader(batch(1, size=250), 0)
    bases = [s.base_offset for s in log.segments]
    assert bases[:3] == [0, 3, 6]
    log.close()
    middle = pdir / f"{bases[1]:020d}.log"
    middle.write_bytes(middle.read_bytes()[:-7])
    log = Log.open(pdir, LogConfig(segment_bytes=1000), ManualClock(TS), recovery_point=bases[1])
    assert [s.base_offset for s in log.segments] == bases[:2]
    assert log.log_end_offset == 5  # the torn batch and everything after it are gone
    assert sorted(p.name for p in pdir.glob("*.log")) == [f"{b:020d}.log" for b in bases[:2]]
    log.close()


def test_read_never_returns_a_batch_crossing_max_offset(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(5), 0)
    for start in range(5):
        assert log.read(start, 1 << 20, max_offset=4).records == b""
    assert log.read(0, 1 << 20, max_offset=5).first_offset == 0
    log.close()


def test_max_timestamp_is_the_first_record_carrying_the_largest_timestamp(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=300, index_interval_bytes=50)
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) is None  # an empty log
    # timestamps out of order across batches and segments: the largest, TS + 500, twice (offsets 7 and 12)
    for ts in (TS, TS + 100, TS + 498, TS + 50, TS + 499, TS + 7, TS + 1):
        log.append_as_leader(batch(2, ts=ts, size=60), 1)  # records at ts and ts + 1
    assert len(log.segments) > 2
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 500, 9, 1)
    log.append_as_leader(batch(3, ts=TS + 498, size=60), 2)  # offsets 14-16 at TS + 498..500: not the first
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 500, 9, 1)
    log.append_as_leader(batch(1, ts=TS + 501, size=60), 3)
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 501, 17, 3)
    log.truncate_to(17)  # the largest goes with the truncated batch
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 500, 9, 1)
    log.close()
    log = open_log(pdir, segment_bytes=300, index_interval_bytes=50)  # the same from the files
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 500, 9, 1)
    log.close()


def test_max_timestamp_leaves_out_records_below_the_log_start(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(2, ts=TS + 900), 0)  # offsets 0-1 at TS + 900, 901
    log.append_as_leader(batch(2, ts=TS + 100), 0)  # offsets 2-3
    log.append_as_leader(batch(2, ts=TS + 300), 0)  # offsets 4-5
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 901, 1, 0)
    log.maybe_increment_log_start_offset(1)  # inside the first batch: its record at offset 1 stays readable
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 901, 1, 0)
    log.maybe_increment_log_start_offset(3)  # the first batch is gone: the largest left is TS + 301
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 301, 5, 0)
    log.maybe_increment_log_start_offset(6)  # nothing readable is left
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) is None
    log.close()


def test_max_timestamp_counts_only_the_records_of_the_first_batch_at_or_after_the_log_start(pdir: Path) -> None:
    # Found by review: the batch holding the log start counted by its header, whose max timestamp was a record
    # below the log start; nothing in the segment then matched it, and -3 answered none
    log = open_log(pdir)
    log.append_as_leader(rb.build_batch([(None, b"a", TS + 900), (None, b"b", TS + 100)], timestamp_ms=TS), 0)
    log.append_as_leader(rb.build_batch([(None, b"c", TS + 300), (None, b"d", TS + 301)], timestamp_ms=TS), 0)
    log.maybe_increment_log_start_offset(1)
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 301, 3, 0)
    log.append_as_leader(rb.build_batch([(None, b"e", TS + 50)], timestamp_ms=TS), 0)
    log.maybe_increment_log_start_offset(2)
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 301, 3, 0)
    log.close()


def test_max_timestamp_of_a_log_append_time_batch_is_its_first_record(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(2, ts=TS + 10), 0)
    headers = rb.validate_batches(batch(3, ts=TS), max_batch_size=1 << 20)
    log.append_as_leader(rb.set_timestamp_type(batch(3, ts=TS), headers, TS + 50), 0)  # appended at TS + 50
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP) == TimestampOffset(TS + 50, 2, 0)
    log.close()


def test_timestamp_lookup_after_truncation(pdir: Path) -> None:
    log = open_log(pdir, index_interval_bytes=50)
    for i in range(20):
        log.append_as_leader(batch(1, ts=TS + 100 * i, size=60), 0)
    log.truncate_to(10)
    assert log.fetch_offset_by_timestamp(TS + 950) is None
    assert log.fetch_offset_by_timestamp(TS + 850) == TimestampOffset(TS + 900, 9, 0)
    log.append_as_leader(batch(1, ts=TS + 5000), 0)
    assert log.fetch_offset_by_timestamp(TS + 950) == TimestampOffset(TS + 5000, 10, 0)
    log.close()


def test_follower_epochs_never_decrease_along_the_log(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_follower(batch(2, epoch=3))
    log.maybe_assign_epoch_start_offset(5, 2)
    with pytest.raises(StaleLeaderEpochError):  # older than the data before it, even past a no-data entry
        log.append_as_follower(batch(1, base_offset=2, epoch=2))
    with pytest.raises(StaleLeaderEpochError):  # all or nothing: the second batch is stale
        log.append_as_follower(batch(1, base_offset=2, epoch=6) + batch(1, base_offset=3, epoch=4))
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(3, 0), (5, 2)]
    log.append_as_follower(batch(1, base_offset=2, epoch=3) + batch(1, base_offset=3, epoch=6))
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(3, 0), (6, 3)]
    log.close()


def damage_second_batch(pdir: Path) -> None:
    """Flip a byte inside the CRC-covered part of the second batch of the first segment."""
    seg = pdir / "00000000000000000000.log"
    data = bytearray(seg.read_bytes())
    data[rb.parse_header(data).size + 40] ^= 0x55
    seg.write_bytes(bytes(data))


def test_batches_below_the_recovery_point_are_trusted_above_validated(pdir: Path) -> None:
    log = open_log(pdir, index_interval_bytes=100)
    for _ in range(6):
        log.append_as_leader(batch(2, size=80), 0)
    log.close()
    damage_second_batch(pdir)  # the batch at offset 2
    log = Log.open(pdir, LogConfig(index_interval_bytes=100), ManualClock(TS), recovery_point=12)
    assert log.log_end_offset == 12  # clean close: nothing is re-validated
    log.close()
    log = Log.open(pdir, LogConfig(index_interval_bytes=100), ManualClock(TS), recovery_point=2)
    assert log.log_end_offset == 2  # from offset 2 on everything is checked: the bad batch and the rest go
    log.close()


def test_recovery_cuts_a_batch_whose_base_offset_breaks_the_sequence(pdir: Path) -> None:
    # the base offset is outside the CRC: a batch claiming offset 40 where 4 should follow passes the CRC
    # check, and only the offset continuity check stops it (and what follows) being recovered
    cfg = LogConfig(index_interval_bytes=200)
    log = Log.open(pdir, cfg, ManualClock(TS))
    for i in range(3):
        log.append_as_leader(batch(2, tag=i), 0)
    log.close()
    seg = pdir / f"{0:020d}.log"
    data = bytearray(seg.read_bytes())
    positions = [p for p, _ in iter_batches(data)]
    assert len(positions) == 3
    struct.pack_into(">q", data, positions[2], 40)
    seg.write_bytes(bytes(data))
    log = Log.open(pdir, cfg, ManualClock(TS), recovery_point=0)
    assert log.log_end_offset == 4
    assert log.segments[-1].size == positions[2]
    log.close()


async def test_deferred_file_deletion(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=500)
    log.defer_file_deletion = True
    for _ in range(4):
        log.append_as_leader(batch(1, size=300), 0)
    log.maybe_increment_log_start_offset(2)
    assert log.delete_old_segments() == 2
    assert len(list(pdir.glob("*.deleted"))) == 6  # .log, .index and .timeindex of each
    await log.unlink_deleted_segments()
    assert list(pdir.glob("*.deleted")) == []
    log.truncate_fully_and_start_at(50)
    log.close()
    log = open_log(pdir)  # leftovers of a crash before the unlink are removed on open
    assert list(pdir.glob("*.deleted")) == [] and log.log_end_offset == 50
    log.close()


def test_latest_and_earliest_offsets_with_epoch_zero(pdir: Path) -> None:
    log = open_log(pdir)
    assert log.fetch_offset_by_timestamp(-1) == TimestampOffset(-1, 0, -1)
    log.append_as_leader(batch(3), 0)
    assert log.fetch_offset_by_timestamp(-1) == TimestampOffset(-1, 3, 0)
    assert log.fetch_offset_by_timestamp(-2) == TimestampOffset(-1, 0, 0)
    log.close()


def test_recovery_keeps_offsets_contiguous_below_the_recovery_point(pdir: Path) -> None:
    # a segment below the recovery point whose index fails the checks is validated in full; when that cuts it,
    # the later segments must go too, or offsets 5-9 would be a hole whose reads return offset 10's batches
    cfg = LogConfig(segment_bytes=600, index_interval_bytes=100)
    log = Log.open(pdir, cfg, ManualClock(TS))
    for i in range(30):
        log.append_as_leader(batch(2, tag=i, size=20), 0)
    bases = [s.base_offset for s in log.segments]
    leo = log.log_end_offset
    assert bases[:2] == [0, 10] and len(bases) > 2
    log.close()
    seg = pdir / f"{0:020d}.log"
    data = bytearray(seg.read_bytes())
    third = [p for p, _ in iter_batches(data)][2]
    data[third + 70] ^= 0xFF  # in the CRC-covered records of the batch at offset 4
    seg.write_bytes(bytes(data))
    (pdir / f"{0:020d}.index").unlink()  # so the segment is validated although below the recovery point
    log = Log.open(pdir, cfg, ManualClock(TS), recovery_point=leo)
    assert [s.base_offset for s in log.segments] == [0]
    assert log.log_end_offset == 4
    assert sorted(p.name for p in pdir.glob("*.log")) == [seg.name]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5, 1 << 20)
    log.close()


@pytest.mark.parametrize("damage", ["zero_after_prefix", "magic"])
def test_a_last_batch_whose_header_went_bad_is_cut_after_a_clean_stop(pdir: Path, damage: str) -> None:
    # Found by review: the header scan of a segment below the recovery point checked only the batch length, so
    # a batch whose bytes after its first 16 were zeroed was taken for whole: the log's end fell inside it
    # (397 in a batch 397-399) and a follower failed every fetch after it
    log = open_log(pdir)
    for _ in range(4):
        log.append_as_leader(batch(3), 0)
    end = log.log_end_offset
    log.close()
    seg = pdir / f"{0:020d}.log"
    data = bytearray(seg.read_bytes())
    last = [p for p, _ in iter_batches(data)][-1]
    if damage == "zero_after_prefix":
        data[last + 16:] = bytes(len(data) - last - 16)
    else:
        data[last + 16] = 0  # magic
    seg.write_bytes(bytes(data))
    log = Log.open(pdir, LogConfig(), ManualClock(TS), recovery_point=end, log_start_offset=0)
    assert log.log_end_offset == 9 and seg.stat().st_size == last
    assert log.append_as_leader(batch(1), 0).first_offset == 9
    log.close()


def test_a_truncation_over_a_batch_gone_bad_below_the_cut_ends_the_log_at_the_cut(pdir: Path) -> None:
    # Found by review: truncate_to re-read its tail with the open's header checks, which stopped at the bad
    # batch before setting anything: the log end stayed at 10 with 6 offsets left in the file
    log = open_log(pdir)
    for _ in range(5):
        log.append_as_leader(batch(2), 0)
    seg = pdir / f"{0:020d}.log"
    second = [p for p, _ in iter_batches(seg.read_bytes())][1]
    with open(seg, "r+b") as f:
        f.seek(second + 16)
        f.write(b"\x00")  # magic
    log.truncate_to(6)
    assert log.log_end_offset == 6 and log.append_as_leader(batch(1), 0).first_offset == 6
    log.close()


def _segmented_log(pdir: Path) -> tuple[LogConfig, Log]:
    """12 two-record batches in segments of 600 bytes (three or more), for the damage tests."""
    cfg = LogConfig(segment_bytes=600)
    log = Log.open(pdir, cfg, ManualClock(TS))
    for i in range(12):
        log.append_as_leader(batch(2, tag=i, size=20), 0)
    assert len(log.segments) >= 3
    return cfg, log


def test_a_header_gone_bad_at_the_end_of_an_older_segment_is_not_trusted(pdir: Path) -> None:
    # the same damage in a segment below the recovery point, opened with its indexes (the tail after the last
    # index entry is scanned): the batch is validated, and cut
    cfg, log = _segmented_log(pdir)
    first_end, end = log.segments[0].next_offset, log.log_end_offset
    log.close()
    seg = pdir / f"{0:020d}.log"
    data = bytearray(seg.read_bytes())
    last = [p for p, _ in iter_batches(data)][-1]
    data[last + 16:] = bytes(len(data) - last - 16)
    seg.write_bytes(bytes(data))
    log = Log.open(pdir, cfg, ManualClock(TS), recovery_point=end, log_start_offset=0)
    assert log.segments[0].next_offset == first_end - 2  # the damaged batch's base: its two offsets are gone
    log.close()


def test_a_missing_segment_below_the_recovery_point_is_reported(pdir: Path) -> None:
    # Found by review: nothing said that offsets were missing (Kafka does not look either); the hole stays
    cfg, log = _segmented_log(pdir)
    bases = [s.base_offset for s in log.segments]
    end = log.log_end_offset
    log.close()
    for suffix in ("log", "index", "timeindex"):
        (pdir / f"{bases[1]:020d}.{suffix}").unlink()
    with capture_logs() as logs:
        log = Log.open(pdir, cfg, ManualClock(TS), recovery_point=end, log_start_offset=0)
    assert [(e["log_level"], e["offset"], e["next_segment_base_offset"]) for e in logs
            if e["event"] == "log_has_a_hole"] == [("warning", bases[1], bases[2])]
    assert log.log_end_offset == end
    log.close()


def test_an_empty_segment_holds_no_batch_for_any_offset(pdir: Path) -> None:
    # an empty segment answers None (nothing here) even for an offset below its base, so Log.read moves on
    # to the next segment rather than returning nothing for ever
    from storage.segment import LogSegment

    pdir.mkdir(parents=True)
    seg = LogSegment.create(pdir, 10, 4096, TS)
    assert seg.read(4, 1 << 20, 100, True) is None
    assert seg.read(10, 1 << 20, 100, True) is None
    seg.close()


def test_a_truncation_logs_segments_truncated_at_debug_not_the_brokers_log_truncated(
        pdir: Path, caplog: pytest.LogCaptureFixture) -> None:
    # ``log_truncated`` (info) is the replica manager's event, with the reason; the storage detail is separate
    import logging

    log = open_log(pdir)
    log.append_as_leader(batch(2), 0)
    log.append_as_leader(batch(2), 0)
    caplog.set_level(logging.DEBUG, logger="storage.log")
    log.truncate_to(2)
    events = [(r.getMessage().split()[0], r.levelname) for r in caplog.records if r.name == "storage.log"]
    assert events == [("segments_truncated", "DEBUG")]
    assert "offset=2 previous_offset=4 leader_epoch=0" in caplog.records[-1].getMessage()
    log.close()


@pytest.mark.parametrize("checkpoint_text", ["0\n1\n9 0\n", "0\n2\n0 0\n1 2\n", "0\n1\n2 0\n"])
def test_an_epoch_checkpoint_that_parses_but_is_wrong_is_rebuilt_after_a_clean_stop(
        pdir: Path, checkpoint_text: str) -> None:
    # Found by review: after a clean stop no batch is checked against the cache, and a checkpoint with one digit
    # changed was believed: as leader the log refused every append as stale (epoch 2 < latest 9), as follower
    # every fetched batch; a consumer was sent back to offset 0 again and again
    log = open_log(pdir)
    for epoch in (0, 1, 2):
        log.append_as_leader(batch(2), epoch)  # epochs 0, 1, 2 start at 0, 2, 4
    end = log.log_end_offset
    log.close()
    (pdir / EPOCH_CHECKPOINT).write_text(checkpoint_text)
    log = Log.open(pdir, LogConfig(), ManualClock(TS), recovery_point=end, log_start_offset=0)
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(0, 0), (1, 2), (2, 4)]
    assert log.append_as_leader(batch(1), 2).first_offset == 6
    log.close()


def test_an_epoch_cache_emptied_over_batches_below_the_log_start_stays_empty_after_a_restart(pdir: Path) -> None:
    # Found by the model test: the log start moved to the LEO (the cache keeps one entry, at the LEO), then a
    # truncation at the LEO dropped that entry, as Kafka's truncateTo does. A restart rebuilt the cache from
    # the batches below the log start, so the cache after it differed from the cache before.
    log = open_log(pdir)
    log.append_as_leader(batch(1), 0)
    log.maybe_increment_log_start_offset(1)
    log.truncate_to(1)
    assert log.epoch_cache.entries() == []
    log.close()
    log = Log.open(pdir, LogConfig(), ManualClock(TS), recovery_point=1, log_start_offset=1)
    assert log.epoch_cache.entries() == [] and (log.log_start_offset, log.log_end_offset) == (1, 1)
    log.close()


def test_an_indexed_read_ends_at_max_offset(pdir: Path) -> None:
    # with an index entry per batch the read starts from the index; it must still stop at the last batch
    # wholly at or below max_offset (the HW for a consumer), not at the byte budget alone
    log = open_log(pdir, index_interval_bytes=1)
    for i in range(10):
        log.append_as_leader(batch(1, tag=i), 0)
    assert offsets_of(log.read(0, 1 << 20, max_offset=3).records) == [(0, 0), (1, 1), (2, 2)]
    assert offsets_of(log.read(4, 1 << 20, max_offset=7).records) == [(4, 4), (5, 5), (6, 6)]
    log.close()


def test_a_truncation_below_the_recovery_point_lowers_it(pdir: Path) -> None:
    # a recovery point left above the new LEO would vouch for batches appended after the cut that were never
    # fsynced: after a crash a damaged one would be trusted instead of cut
    log = open_log(pdir, index_interval_bytes=100)
    for _ in range(4):
        log.append_as_leader(batch(2, size=80), 0)
    log.flush()
    assert log.recovery_point == 8
    log.truncate_to(2)
    assert log.recovery_point == 2
    log.append_as_leader(batch(2, size=80, tag=9), 0)  # offsets 2-3, not flushed
    checkpointed = log.recovery_point
    log.close()
    damage_second_batch(pdir)  # the batch at offset 2 comes back damaged after a crash
    log = Log.open(pdir, LogConfig(index_interval_bytes=100), ManualClock(TS), recovery_point=checkpointed)
    assert log.log_end_offset == 2  # validated and cut
    log.close()


async def test_a_roll_flush_overtaken_by_a_truncation_marks_nothing_flushed(pdir: Path) -> None:
    """Segments truncated and written again while the deferred roll flush's fsync ran hold data that fsync did
    not cover: neither they nor the recovery point may count as flushed when it completes."""
    import asyncio

    log = open_log(pdir, segment_bytes=300)
    log.defer_roll_flush = True
    for i in range(4):
        log.append_as_leader(batch(1, size=200, tag=i), 0)
    assert len(log.segments) == 4 and log.recovery_point == 0
    flushing = asyncio.ensure_future(log.flush_rolled_segments())
    await asyncio.sleep(0)  # its fsync of segments 0-2 has started
    log.truncate_to(1)
    log.append_as_leader(batch(1, size=200, tag=10), 0)  # offset 1, in segment 1 (active again)
    assert len(log.segments) == 2
    await flushing
    assert log.recovery_point <= 1
    assert log.segments[-1].unflushed
    log.close()


async def test_rolled_segments_a_truncation_left_alone_are_flushed_by_the_next_round(pdir: Path) -> None:
    """A truncation of the active segment during the deferred roll flush's fsync leaves the rolled segments
    rolled: they wait for the next round, which moves the recovery point over them. (They were dropped from
    the queue, stayed unflushed and held the recovery point at 0 until a clean shutdown: a crash then
    re-validated every segment.)"""
    import asyncio

    log = open_log(pdir, segment_bytes=300)
    log.defer_roll_flush = True
    for i in range(4):
        log.append_as_leader(batch(1, size=200, tag=i), 0)
    rolled = log.segments[:-1]
    flushing = asyncio.ensure_future(log.flush_rolled_segments())
    await asyncio.sleep(0)  # its fsync of segments 0-2 has started
    log.truncate_to(3)  # the active segment's one batch: a follower's divergent tail
    await flushing
    assert log.recovery_point == 0
    await log.flush_rolled_segments()
    assert log.recovery_point == 3 and not any(s.unflushed for s in rolled)
    log.append_as_leader(batch(1, size=200, tag=9), 0)  # offset 3, and a roll
    log.append_as_leader(batch(1, size=200, tag=10), 0)
    await log.flush_rolled_segments()
    assert log.recovery_point == 4
    log.close()


def test_retention_bytes_deletes_a_segment_only_if_as_much_remains(pdir: Path) -> None:
    # as Kafka's ``diff - segment.size >= 0``: a segment goes only if what is left is still at least
    # retention.bytes, so a log exactly at the limit loses nothing
    log = open_log(pdir, segment_bytes=600)
    for i in range(8):
        log.append_as_leader(batch(1, size=250, ts=TS + i), 0)
    sizes = [s.size for s in log.segments]
    assert len(sizes) >= 4 and len(set(sizes[:-1])) == 1
    remaining = sum(sizes) - sizes[0]
    log.update_config(LogConfig(segment_bytes=600, retention_bytes=remaining))
    assert log.delete_old_segments() == 1
    assert log.size_bytes == remaining
    assert log.delete_old_segments() == 0
    log.close()


def test_deleting_segments_below_the_log_start_keeps_the_log_start(pdir: Path) -> None:
    # the log start inside a later segment (DeleteRecords, a leader's log start): deleting the segments below
    # it must not pull it back to that segment's base, which would make deleted records readable again
    log = open_log(pdir, segment_bytes=600)
    for i in range(8):
        log.append_as_leader(batch(3, size=60, ts=TS + i), 0)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 3 and bases[2] - bases[1] >= 2
    assert log.maybe_increment_log_start_offset(bases[1] + 1)
    assert log.delete_old_segments() == 1
    assert log.segments[0].base_offset == bases[1]
    assert log.log_start_offset == bases[1] + 1
    with pytest.raises(OffsetOutOfRangeError):
        log.read(bases[1], 1 << 20)
    log.close()


def test_a_segment_with_bytes_after_its_last_batch_is_recovered_below_the_recovery_point(pdir: Path) -> None:
    # a segment is trusted only if the header scan from its last index entry ends at the end of the file;
    # here it does not, so it is validated and the trailing bytes cut
    cfg = LogConfig(segment_bytes=600, index_interval_bytes=100)
    log = Log.open(pdir, cfg, ManualClock(TS))
    for i in range(6):
        log.append_as_leader(batch(2, size=80, tag=i), 0)
    assert len(log.segments) >= 2
    first = pdir / f"{0:020d}.log"
    size, end = log.segments[0].size, log.log_end_offset
    log.close()
    with open(first, "ab") as f:
        f.write(b"\x00" * 30)
    log = Log.open(pdir, cfg, ManualClock(TS), recovery_point=end)
    assert log.segments[0].size == size == first.stat().st_size
    assert log.log_end_offset == end
    assert_indexes_match_scan(log)
    log.close()


def test_an_offset_index_whose_last_entry_is_not_a_batch_base_is_rebuilt(pdir: Path) -> None:
    cfg = LogConfig(index_interval_bytes=1)
    log = Log.open(pdir, cfg, ManualClock(TS))
    for i in range(5):
        log.append_as_leader(batch(3, tag=i), 0)
    end = log.log_end_offset
    log.close()
    idx = pdir / f"{0:020d}.index"
    raw = bytearray(idx.read_bytes())
    rel, pos = struct.unpack_from(">II", raw, len(raw) - 8)
    struct.pack_into(">II", raw, len(raw) - 8, rel + 1, pos)  # an offset inside the last batch
    idx.write_bytes(bytes(raw))
    log = Log.open(pdir, cfg, ManualClock(TS), recovery_point=end)
    assert_indexes_match_scan(log)
    log.close()


def _closed_log_indexing_every_batch(pdir: Path) -> int:
    log = Log.open(pdir, LogConfig(index_interval_bytes=1), ManualClock(TS))
    for i in range(6):
        log.append_as_leader(batch(2, tag=i, ts=TS + 10 * i), 0)
    end = log.log_end_offset
    log.close()
    return end


def test_an_offset_index_out_of_order_is_rebuilt(pdir: Path) -> None:
    # lookups bisect the index, so entries that do not strictly increase are damage even if the last is right
    end = _closed_log_indexing_every_batch(pdir)
    idx = pdir / f"{0:020d}.index"
    raw = bytearray(idx.read_bytes())
    assert len(raw) >= 24
    raw[0:8], raw[8:16] = raw[8:16], raw[0:8]
    idx.write_bytes(bytes(raw))
    log = Log.open(pdir, LogConfig(index_interval_bytes=1), ManualClock(TS), recovery_point=end)
    assert_indexes_match_scan(log)
    log.close()


def test_a_time_index_entry_naming_an_offset_the_offset_index_lacks_is_rebuilt(pdir: Path) -> None:
    end = _closed_log_indexing_every_batch(pdir)
    tidx = pdir / f"{0:020d}.timeindex"
    raw = bytearray(tidx.read_bytes())
    ts, rel = struct.unpack_from(">qI", raw, len(raw) - 12)
    struct.pack_into(">qI", raw, len(raw) - 12, ts, rel + 1)  # inside a batch
    tidx.write_bytes(bytes(raw))
    log = Log.open(pdir, LogConfig(index_interval_bytes=1), ManualClock(TS), recovery_point=end)
    assert_indexes_match_scan(log)
    log.close()


def test_recovery_compares_the_first_validated_batch_with_the_last_trusted_one(pdir: Path) -> None:
    # the epoch before the first validated batch is the last trusted batch's (5 here), not only the previous
    # segment's: a damaged, lower epoch after it must be cut (the epoch is outside the CRC)
    cfg = LogConfig(index_interval_bytes=1)
    log = Log.open(pdir, cfg, ManualClock(TS))
    log.append_as_leader(batch(1), 0)
    log.append_as_leader(batch(1), 5)
    log.flush()
    checkpointed = log.recovery_point
    log.append_as_leader(batch(1), 5)  # offset 2, validated at the next open
    log.close()
    seg = pdir / f"{0:020d}.log"
    data = bytearray(seg.read_bytes())
    third = [p for p, _ in iter_batches(bytes(data))][2]
    rb.stamp(data, third, base_offset=2, partition_leader_epoch=3)
    seg.write_bytes(bytes(data))
    log = Log.open(pdir, cfg, ManualClock(TS), recovery_point=checkpointed)
    assert checkpointed == log.log_end_offset == 2
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(0, 0), (5, 1)]
    log.close()


def test_a_timestamp_lookup_inside_a_batch_never_answers_below_the_log_start(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(batch(4), 0)  # offsets 0-3 at TS..TS+3
    log.maybe_increment_log_start_offset(2)
    assert log.fetch_offset_by_timestamp(TS) == TimestampOffset(TS + 2, 2, 0)
    log.close()


def test_a_checkpointed_log_start_below_the_first_segment_opens_at_its_base(pdir: Path) -> None:
    # retention deleted segments before the log start checkpoint was rewritten: the stale value must not
    # open a log start pointing at offsets no segment holds
    log = open_log(pdir, segment_bytes=300)
    for _ in range(4):
        log.append_as_leader(batch(1, size=200), 0)
    log.maybe_increment_log_start_offset(2)
    assert log.delete_old_segments() == 2
    end = log.log_end_offset
    log.close()
    log = Log.open(pdir, LogConfig(segment_bytes=300), ManualClock(TS), recovery_point=end, log_start_offset=0)
    assert log.log_start_offset == log.segments[0].base_offset == 2
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 1 << 20)
    log.close()


def test_an_epoch_cache_rebuilt_at_open_starts_at_the_log_start(pdir: Path) -> None:
    # rebuilt from the batches (the checkpoint is unreadable), the cache also sees those below the log start
    log = open_log(pdir)
    log.append_as_leader(batch(2), 1)
    log.append_as_leader(batch(2), 2)
    log.maybe_increment_log_start_offset(3)
    log.close()
    (pdir / "leader-epoch-checkpoint").write_text("garbage\n")
    log = Log.open(pdir, LogConfig(), ManualClock(TS), recovery_point=4, log_start_offset=3)
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(2, 3)]
    log.close()


def test_a_rebuilt_epoch_cache_keeps_a_newer_epoch_assigned_at_the_leo(pdir: Path) -> None:
    # a leader's epoch assigned before its first append is in no batch: rebuilding the cache from the batches
    # must keep the checkpoint's last entry when it starts at the LEO with a newer epoch
    log = open_log(pdir)
    log.append_as_leader(batch(2), 1)
    log.maybe_assign_epoch_start_offset(5, 2)
    log.close()
    (pdir / "leader-epoch-checkpoint").write_text("0\n2\n0 0\n5 2\n")  # epoch 0 contradicts the batches
    log = Log.open(pdir, LogConfig(), ManualClock(TS), recovery_point=0)
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(1, 0), (5, 2)]
    log.close()


def test_a_batch_without_a_leader_epoch_is_refused_over_an_epoch_assigned_at_the_leo(pdir: Path) -> None:
    # every cache entry starts at or after the batch (this replica led at the LEO and wrote nothing), so no
    # earlier epoch refuses it: an unstamped batch must still be refused
    log = open_log(pdir)
    log.maybe_assign_epoch_start_offset(3, 0)
    with pytest.raises(StaleLeaderEpochError):
        log.append_as_follower(batch(1, epoch=-1))
    assert log.log_end_offset == 0
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(3, 0)]
    log.close()
