"""The Log's producer state: leader checks, follower updates, truncation, retention, expiration, snapshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from common.clock import ManualClock
from common.config import broker_config
from common.errors import ErrorCode
from common.wire import TopicPartition
from storage.log import Log, LogConfig, snapshot_path
from storage.log_manager import PRODUCER_EXPIRATION_CHECK_INTERVAL_MS, LogManager
from storage.producer_state import OutOfOrderSequenceError, ProducerStateError
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


def snapshots(pdir: Path) -> list[int]:
    """The offsets of the producer snapshots on disk."""
    return sorted(int(p.name.split(".")[0]) for p in pdir.glob("*.snapshot"))


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


def test_a_truncation_at_a_one_record_batch_forgets_it(pdir: Path) -> None:
    # the cut batch's last offset is the truncation offset itself: it is gone from the log, so its retry
    # is appended, not answered as a duplicate of records no longer there
    log = open_log(pdir)
    log.append_as_leader(ibatch(0), 0)  # offsets 0-1
    log.append_as_leader(ibatch(2, n=1), 0)  # offset 2 alone
    log.truncate_to(2)
    entry = log.producer_state.entry(PID)
    assert entry is not None and [m.first_seq for m in entry.batches] == [0]
    info = log.append_as_leader(ibatch(2, n=1), 0)  # the retry after a leader change
    assert (info.duplicate, info.first_offset) == (False, 2)
    assert log.log_end_offset == 3 and record_count(log) == 3
    log.close()


def test_truncation_keeps_the_producers_older_cached_batches(pdir: Path) -> None:
    log = open_log(pdir)
    for seq in range(0, 14, 2):  # seven batches, offsets 0-13; the cache holds sequences 4-13
        log.append_as_leader(ibatch(seq), 0)
    log.truncate_to(10)  # cuts sequences 10-13
    entry = log.producer_state.entry(PID)
    # the producer keeps cached batches, so only the cut ones leave (no header read; Kafka would replay the
    # log and hold 0-8): what it can still retry is among them
    assert entry is not None and [m.first_seq for m in entry.batches] == [4, 6, 8]
    assert log.append_as_leader(ibatch(8), 0).duplicate  # a surviving batch: a duplicate
    retry = log.append_as_leader(ibatch(10), 0)  # a cut one: appended, once
    assert (retry.duplicate, retry.first_offset) == (False, 10)
    assert log.append_as_leader(ibatch(10), 0).duplicate
    assert log.log_end_offset == 12 and record_count(log) == 12
    log.close()


def test_truncation_of_all_a_producers_cached_batches_reloads_its_older_ones(pdir: Path) -> None:
    # The cache held sequences 4-13 only; the truncation cuts them all but leaves 0-3 in the log. Forgetting
    # the producer (as this log once did) let it be accepted at any sequence, a gap included, and its state
    # differ from a replica that never had the cut batches. As Kafka's truncateAndReload, it is rebuilt from
    # the log: its batches 0-3 are back; pid 9, whose only batch was cut, is gone.
    log = open_log(pdir)
    for seq in range(0, 14, 2):
        log.append_as_leader(ibatch(seq), 0)
    log.append_as_leader(ibatch(0, pid=9), 0)  # offsets 14-15
    log.truncate_to(4)
    entry = log.producer_state.entry(PID)
    assert entry is not None and [m.first_seq for m in entry.batches] == [0, 2]
    assert log.producer_state.entry(9) is None
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(ibatch(8), 0)  # a gap: 4 is next
    assert log.append_as_leader(ibatch(2), 0).duplicate
    retry = log.append_as_leader(ibatch(4), 0)  # the cut one: appended, once
    assert (retry.duplicate, retry.first_offset) == (False, 4)
    assert log.append_as_leader(ibatch(4), 0).duplicate
    log.close()


def test_a_truncated_replica_has_the_state_of_one_that_never_had_the_cut_batches(tmp_path: Path) -> None:
    leader, follower = open_log(tmp_path / "a-0"), open_log(tmp_path / "b-0")
    for seq in range(5):
        leader.append_as_leader(ibatch(seq, n=1), 0)
    follower.append_as_follower(leader.read(0, 1 << 20).records)
    leader.append_as_leader(b"".join(ibatch(seq, n=1) for seq in range(5, 10)), 0)  # only the old leader
    leader.truncate_to(5)  # it follows the replica that never had them
    assert leader.producer_state.entries() == follower.producer_state.entries()
    leader.close()
    follower.close()


def test_truncation_reads_no_batch_header_below_the_newest_snapshot(pdir: Path) -> None:
    """The first segment's bytes are lost (zeroed on disk) before a truncation in the last one. A truncation
    does replay batch headers, as Kafka's truncateAndReload + loadProducerState does, but only from the
    newest snapshot at or below the cut (taken at the roll, at offset 4): the zeroed segment is never read,
    and the producer's batches there come from the snapshot."""
    log = open_log(pdir, segment_bytes=200)
    log.append_as_leader(ibatch(0), 0)
    log.append_as_leader(ibatch(2), 0)
    log.roll()
    log.append_as_leader(ibatch(4), 0)  # offsets 4-5, in the second segment
    assert snapshot_path(pdir, 4).exists()
    first = sorted(pdir.glob("*.log"))[0]
    first.write_bytes(bytes(first.stat().st_size))
    log.truncate_to(4)
    entry = log.producer_state.entry(PID)
    assert entry is not None and [m.first_seq for m in entry.batches] == [0, 2]
    assert log.append_as_leader(ibatch(2), 0).duplicate
    assert log.append_as_leader(ibatch(4), 0).first_offset == 4


def scenario_a(log: Log) -> int:
    """The reviewer's scenario: a producer's only batch, then other traffic until retention deletes it.
    -> the batch's offset."""
    first = log.append_as_leader(ibatch(0), 0).first_offset
    for i in range(12):
        log.append_as_leader(batch(1, size=100, tag=i), 0)
    assert log.delete_old_segments(high_watermark=log.log_end_offset) > 0
    assert log.log_start_offset > first
    return first


def test_retention_keeps_producers_and_a_retry_of_a_deleted_batch_is_a_duplicate(pdir: Path) -> None:
    log = Log.open(pdir, LogConfig(segment_bytes=400, retention_bytes=400, retention_ms=-1), ManualClock(TS))
    first = scenario_a(log)
    leo = log.log_end_offset
    again = log.append_as_leader(ibatch(0), 0)  # the retry of the batch whose answer was lost
    assert (again.duplicate, again.first_offset) == (True, first)
    assert log.log_end_offset == leo
    log.maybe_increment_log_start_offset(leo)
    assert log.append_as_leader(ibatch(0), 0).duplicate
    log.close()


def test_a_restart_keeps_producers_whose_batches_retention_deleted(pdir: Path) -> None:
    cfg = LogConfig(segment_bytes=400, retention_bytes=400, retention_ms=-1)
    log = Log.open(pdir, cfg, ManualClock(TS))
    first = scenario_a(log)
    log.close()
    log = Log.open(pdir, cfg, ManualClock(TS))
    leo = log.log_end_offset
    again = log.append_as_leader(ibatch(0), 0)
    assert (again.duplicate, again.first_offset) == (True, first)
    assert log.log_end_offset == leo
    log.close()


def test_the_scan_on_open_keeps_producers_below_the_log_start(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(ibatch(0), 0)  # offsets 0-1
    log.append_as_leader(batch(3), 0)
    log.maybe_increment_log_start_offset(3)  # the batch is still in the segment, below the log start
    log.flush()
    # a crash (no close, no snapshot): the state comes from the headers the segment still holds
    assert not snapshots(pdir)
    log = Log.open(pdir, LogConfig(), ManualClock(TS), recovery_point=5, log_start_offset=3)
    assert log.log_start_offset == 3
    again = log.append_as_leader(ibatch(0), 0)
    assert (again.duplicate, again.first_offset) == (True, 0)
    log.close()


def test_a_reopen_replays_only_the_batches_after_the_snapshot(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=200)
    log.append_as_leader(ibatch(0), 0)
    log.append_as_leader(ibatch(2), 0)
    log.close()  # snapshot at offset 4
    log = open_log(pdir, segment_bytes=200)
    log.append_as_leader(ibatch(4), 0)
    log.append_as_leader(ibatch(0, pid=9), 0)
    log.flush()
    # a crash (the log is not closed): the snapshot of the last close, at offset 4, is used; replaying
    # the batches below it as well would cache sequences 0 and 2 twice
    assert snapshot_path(pdir, 4).exists()
    log = open_log(pdir, segment_bytes=200)
    entry = log.producer_state.entry(PID)
    assert entry is not None and [m.first_offset for m in entry.batches] == [0, 2, 4]
    assert log.producer_state.entry(9) is not None
    log.close()


def test_a_directory_named_as_a_snapshot_is_ignored(pdir: Path) -> None:
    # Found by review: the open read and then unlinked it, and IsADirectoryError stopped the whole broker's start
    log = open_log(pdir)
    log.append_as_leader(ibatch(0), 0)
    log.close()  # snapshot at offset 2
    snapshot_path(pdir, 2).unlink()
    snapshot_path(pdir, 2).mkdir()
    snapshot_path(pdir, 1).mkdir()
    log = open_log(pdir)  # the state comes from the batches
    entry = log.producer_state.entry(PID)
    assert entry is not None and [m.first_offset for m in entry.batches] == [0]
    log.close()


def test_a_damaged_snapshot_falls_back_to_the_scan_with_a_warning(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(ibatch(0), 0)
    log.append_as_leader(ibatch(2), 0)
    log.close()
    snap = snapshot_path(pdir, 4)
    raw = bytearray(snap.read_bytes())
    raw[-3] ^= 1
    snap.write_bytes(bytes(raw))
    with capture_logs() as logs:
        log = open_log(pdir)
    assert [e["error"] for e in logs if e["event"] == "producer_snapshot_unreadable"] == ["CRC mismatch"]
    assert not snap.exists()
    entry = log.producer_state.entry(PID)
    assert entry is not None and [m.first_seq for m in entry.batches] == [0, 2]
    assert log.append_as_leader(ibatch(2), 0).duplicate
    log.close()


def test_a_damaged_newest_snapshot_falls_back_to_the_one_before(pdir: Path) -> None:
    log = open_log(pdir, segment_bytes=200)
    for seq in range(0, 8, 2):
        log.append_as_leader(ibatch(seq), 0)
    log.close()
    taken = snapshots(pdir)
    assert len(taken) >= 2 and taken[-1] == 8
    snapshot_path(pdir, 8).write_text("not a snapshot")
    with capture_logs() as logs:
        log = open_log(pdir, segment_bytes=200)
    assert [e["snapshot_offset"] for e in logs if e["event"] == "producer_snapshot_unreadable"] == [8]
    assert snapshots(pdir) == taken[:-1]
    entry = log.producer_state.entry(PID)
    assert entry is not None and [m.first_seq for m in entry.batches] == [0, 2, 4, 6]  # each batch once
    assert log.append_as_leader(ibatch(6), 0).duplicate
    log.close()


def test_a_snapshot_above_the_recovered_log_end_is_not_used(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(ibatch(0), 0)
    log.append_as_leader(ibatch(2), 0)  # offsets 2-3
    log.close()  # snapshot at offset 4
    seg = sorted(pdir.glob("*.log"))[0]
    second = [pos for pos, _ in iter_batches(seg.read_bytes())][1]
    os.truncate(seg, second + 20)  # a crash cut the last batch (the snapshot is from an earlier close)
    with capture_logs() as logs:
        log = open_log(pdir)
    assert log.log_end_offset == 2
    assert [(e["snapshot_offset"], e["offset"]) for e in logs
            if e["event"] == "producer_snapshot_ahead_of_log"] == [(4, 2)]
    entry = log.producer_state.entry(PID)
    assert entry is not None and entry.last_seq == 1
    retry = log.append_as_leader(ibatch(2), 0)  # not in the log: appended, not answered at offset 2 by the snapshot
    assert (retry.duplicate, retry.first_offset) == (False, 2)
    log.close()


def test_a_truncation_below_the_snapshot_deletes_it(pdir: Path) -> None:
    log = open_log(pdir)
    for seq in range(0, 6, 2):
        log.append_as_leader(ibatch(seq), 0)
    log.close()  # snapshot at offset 6
    snap = snapshot_path(pdir, 6)
    log = open_log(pdir)
    log.append_as_leader(ibatch(6), 0)
    log.truncate_to(6)  # at the snapshot's offset: it still holds
    assert snap.exists()
    log.truncate_to(4)  # below it: it would describe sequences 4-5 at offsets 4-5
    assert not snap.exists()
    log.append_as_leader(batch(3), 0)  # offsets 4-6: the LEO is past the old snapshot's offset again
    log.flush()
    # a crash (no close): a left-over snapshot would be used, and claim sequences 4-5 at offsets 4-5
    log = open_log(pdir)
    entry = log.producer_state.entry(PID)
    assert entry is not None and entry.last_seq == 3
    retry = log.append_as_leader(ibatch(4), 0)
    assert (retry.duplicate, retry.first_offset) == (False, 7)
    log.truncate_fully_and_start_at(20)
    log.close()
    assert not snapshots(pdir)  # no producer left and no older snapshot to supersede: none written


def test_a_full_truncation_deletes_the_snapshot(pdir: Path) -> None:
    log = open_log(pdir)
    log.append_as_leader(ibatch(0), 0)
    log.close()
    log = open_log(pdir)
    log.truncate_fully_and_start_at(0)
    assert not snapshots(pdir)
    log.append_as_leader(batch(5), 0)
    log.flush()
    log = open_log(pdir)  # after a crash: nothing of the old producer
    assert log.producer_state.entry(PID) is None
    log.close()


def filler(tag: int) -> bytes:
    return batch(1, size=100, tag=tag)


def test_a_crash_after_retention_keeps_the_producers_of_deleted_segments(pdir: Path) -> None:
    """Retention deleted every batch of a producer, then the broker crashed (no clean close). The snapshot
    taken at the roll still knows the producer: a retry of its last batch is a duplicate, not a second copy
    (it was forgotten when the only snapshot was the one a clean close writes)."""
    cfg = {"segment_bytes": 400, "retention_bytes": 400, "retention_ms": -1}
    log = open_log(pdir, **cfg)
    log.append_as_leader(ibatch(0), 0)
    first = log.append_as_leader(ibatch(2), 0).first_offset  # its answer is lost
    for tag in range(12):
        log.append_as_leader(filler(tag), 0)
    log.flush()
    assert log.delete_old_segments(high_watermark=log.log_end_offset) > 0
    assert log.log_start_offset > first + 1  # the producer's batches are gone from the log
    leo, start = log.log_end_offset, log.log_start_offset
    log = Log.open(pdir, LogConfig(**cfg), ManualClock(TS), recovery_point=leo, log_start_offset=start)  # a crash
    retry = log.append_as_leader(ibatch(2), 0)
    assert (retry.duplicate, retry.first_offset) == (True, first)
    assert log.log_end_offset == leo
    assert log.append_as_leader(ibatch(4), 0).first_offset == leo  # and the producer goes on
    log.close()


def test_a_crash_after_retention_does_not_go_back_to_an_older_clean_close(pdir: Path) -> None:
    """A clean close long ago left a snapshot; since then the producer appended more, retention deleted
    those batches and the broker crashed. The roll snapshots carry the producer's newer state: the next
    batch is accepted and the retry of the last one is a duplicate (the state went back to the old
    snapshot's, which refused both as out of order)."""
    cfg = {"segment_bytes": 400, "retention_bytes": 400, "retention_ms": -1}
    log = open_log(pdir, **cfg)
    for seq in range(0, 10, 2):
        log.append_as_leader(ibatch(seq), 0)
    log.close()
    log = open_log(pdir, **cfg)
    for seq in range(10, 16, 2):
        last = log.append_as_leader(ibatch(seq), 0).first_offset
    for tag in range(12):
        log.append_as_leader(filler(tag), 0)
    log.flush()
    assert log.delete_old_segments(high_watermark=log.log_end_offset) > 0
    assert log.log_start_offset > last + 1
    leo, start = log.log_end_offset, log.log_start_offset
    log = Log.open(pdir, LogConfig(**cfg), ManualClock(TS), recovery_point=leo, log_start_offset=start)  # a crash
    retry = log.append_as_leader(ibatch(14), 0)
    assert (retry.duplicate, retry.first_offset) == (True, last)
    assert log.append_as_leader(ibatch(16), 0).first_offset == leo
    log.close()


def test_snapshots_follow_rolls_truncation_and_retention(pdir: Path) -> None:
    """One snapshot per roll while the log has producers (none for a log without them); a truncation deletes
    those above the cut, keeping the one at the cut's segment; retention keeps the newest one at or below
    the first segment and those after it."""
    log = open_log(pdir, segment_bytes=400, retention_bytes=-1, retention_ms=-1)
    for tag in range(8):
        log.append_as_leader(filler(tag), 0)
    assert len(log.segments) > 1 and not snapshots(pdir)  # no producer: nothing written
    log.append_as_leader(ibatch(0), 0)
    for tag in range(8):
        log.append_as_leader(filler(tag), 0)
    bases = [s.base_offset for s in log.segments]
    taken = snapshots(pdir)
    assert taken and set(taken) <= set(bases) and taken == [b for b in bases if b > 8]
    log.truncate_to(bases[-2] + 1)  # into the segment before the active one: its base's snapshot stays
    assert snapshots(pdir) == [b for b in taken if b <= bases[-2]]
    log.maybe_increment_log_start_offset(bases[-2])
    log.delete_old_segments()
    assert log.segments[0].base_offset == bases[-2]
    assert snapshots(pdir) == [bases[-2]]
    log.close()

    reopened = open_log(pdir)
    entry = reopened.producer_state.entry(PID)
    assert entry is not None and entry.last_seq == 1
    reopened.close()


async def test_the_log_manager_tick_expires_idle_producers(tmp_path: Path) -> None:
    clock = ManualClock(TS)
    mgr = LogManager(tmp_path, broker_config({"producer.id.expiration.ms": 60_000}), clock)
    await mgr.load()
    log = await mgr.get_or_create_log(TopicPartition("t", 0), LogConfig())
    log.append_as_leader(ibatch(0, pid=1), 0)
    log.append_as_leader(ibatch(0, pid=2), 0)
    clock.advance(PRODUCER_EXPIRATION_CHECK_INTERVAL_MS - 1_000)
    log.append_as_leader(ibatch(2, pid=2), 0)  # pid 2 stays active
    await mgr.tick()  # not due yet: both known, although pid 1 is idle for longer than 60 s
    assert log.producer_state.entry(1) is not None
    clock.advance(1_000)
    await mgr.tick()
    assert log.producer_state.entry(1) is None and log.producer_state.entry(2) is not None
    assert not log.append_as_leader(ibatch(0, pid=1), 0).duplicate  # forgotten: appended again
    clock.advance(PRODUCER_EXPIRATION_CHECK_INTERVAL_MS)
    await mgr.tick()
    assert len(log.producer_state) == 0
    await mgr.close()


def test_expiration_counts_from_the_last_append_and_survives_a_restart(pdir: Path) -> None:
    clock = ManualClock(TS)
    log = open_log(pdir, clock)
    log.append_as_leader(ibatch(0, pid=1), 0)
    clock.advance(50_000)
    log.append_as_leader(ibatch(0, pid=2), 0)
    log.close()
    clock.advance(20_000)
    log = open_log(pdir, clock)  # the snapshot keeps each producer's last append time
    assert log.remove_expired_producers(60_000) == 1
    assert log.producer_state.entry(1) is None and log.producer_state.entry(2) is not None
    log.close()


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
