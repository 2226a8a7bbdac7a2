"""LogManager: load, create, checkpoints, retention tick, delete, close."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from common.clock import ManualClock
from common.config import broker_config
from common.wire import TopicPartition
from storage import checkpoint
from storage.log import LogConfig, StorageError
from storage.log_manager import HW_CHECKPOINT, LOG_START_CHECKPOINT, RECOVERY_CHECKPOINT, LogManager
from tests.storage.helpers import TS, batch

A = TopicPartition("orders", 0)
B = TopicPartition("orders", 1)
C = TopicPartition("my-topic", 12)


async def test_create_load_and_checkpoints(tmp_path: Path) -> None:
    clock = ManualClock(TS)
    mgr = LogManager(tmp_path, broker_config(), clock)
    await mgr.load()
    assert mgr.logs() == {}
    cfg = LogConfig(segment_bytes=1000)
    logs = await asyncio.gather(*(mgr.get_or_create_log(tp, cfg) for tp in (A, A, B, C)))
    assert logs[0] is logs[1]
    for i, tp in enumerate((A, B, C)):
        lg = mgr.get_log(tp)
        assert lg is not None
        for _ in range(i + 3):
            lg.append_as_leader(batch(2, size=200), 1)
    mgr.checkpoint_high_watermarks({A: 4, B: 2})
    assert mgr.read_high_watermarks() == {A: 4, B: 2}
    mgr.get_log(A).maybe_increment_log_start_offset(2)  # type: ignore[union-attr]
    await mgr.close()
    assert checkpoint.read_offsets(tmp_path / RECOVERY_CHECKPOINT) == {A: 6, B: 8, C: 10}
    assert checkpoint.read_offsets(tmp_path / LOG_START_CHECKPOINT) == {A: 2, B: 0, C: 0}

    mgr2 = LogManager(tmp_path, broker_config(), clock)
    await mgr2.load()
    assert set(mgr2.logs()) == {A, B, C}
    assert {tp: lg.log_end_offset for tp, lg in mgr2.logs().items()} == {A: 6, B: 8, C: 10}
    assert mgr2.get_log(A).log_start_offset == 2  # type: ignore[union-attr]
    assert mgr2.read_high_watermarks() == {A: 4, B: 2}
    await mgr2.delete_log(B)
    assert not (tmp_path / "orders-1").exists()
    assert B not in checkpoint.read_offsets(tmp_path / RECOVERY_CHECKPOINT)
    await mgr2.close()


async def test_unreadable_checkpoints_fall_back_to_full_recovery(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, broker_config(), ManualClock(TS))
    await mgr.load()
    lg = await mgr.get_or_create_log(A, LogConfig())
    lg.append_as_leader(batch(3), 0)
    await mgr.close()
    for name in (RECOVERY_CHECKPOINT, LOG_START_CHECKPOINT, HW_CHECKPOINT):
        (tmp_path / name).write_text("garbage\n")
    (tmp_path / "not-a-partition-dir").mkdir()
    (tmp_path / "meta.properties").write_text("broker.id=1\n")
    mgr = LogManager(tmp_path, broker_config(), ManualClock(TS))
    await mgr.load()
    assert mgr.read_high_watermarks() == {}
    assert mgr.get_log(A).log_end_offset == 3  # type: ignore[union-attr]
    await mgr.close()


@pytest.mark.parametrize("name", [HW_CHECKPOINT, RECOVERY_CHECKPOINT, LOG_START_CHECKPOINT])
async def test_a_checkpoint_path_that_is_a_directory_fails_the_load(tmp_path: Path, name: str) -> None:
    # Found by review: it was read as unreadable (a warning) and the broker started, led, and halted at its
    # first checkpoint write; Kafka fails at load
    (tmp_path / name).mkdir()
    mgr = LogManager(tmp_path, broker_config(), ManualClock(TS))
    with pytest.raises(StorageError, match=rf"{name} is not a regular file: the {name} checkpoint can never"):
        await mgr.load()


async def test_tick_runs_retention_bounded_by_hw_and_checkpoints(tmp_path: Path) -> None:
    clock = ManualClock(TS)
    hws = {A: 0}
    cfg = broker_config({"log.retention.check.interval.ms": 1000, "log.flush.offset.checkpoint.interval.ms": 1000})
    mgr = LogManager(tmp_path, cfg, clock, high_watermarks=lambda: dict(hws))
    await mgr.load()
    lg = await mgr.get_or_create_log(A, LogConfig(segment_bytes=600, retention_bytes=700))
    for _ in range(8):
        lg.append_as_leader(batch(1, size=250), 0)
    segments = len(lg.segments)
    clock.advance(1000)
    await mgr.tick()
    assert len(lg.segments) == segments  # HW 0: nothing may go
    assert lg.recovery_point == lg.segments[-1].base_offset  # deferred roll fsyncs done
    assert checkpoint.read_offsets(tmp_path / RECOVERY_CHECKPOINT) == {A: lg.recovery_point}
    hws[A] = lg.log_end_offset
    clock.advance(1000)
    await mgr.tick()
    assert len(lg.segments) < segments and lg.log_start_offset == lg.segments[0].base_offset
    assert list((tmp_path / "orders-0").glob("*.deleted")) == []  # renamed on the loop, unlinked in a thread
    assert len(list((tmp_path / "orders-0").glob("*.log"))) == len(lg.segments)
    mgr.start()
    await mgr.close()


async def test_after_a_restart_retention_waits_for_the_topic_s_own_config(tmp_path: Path) -> None:
    """Logs are loaded with the broker's defaults (log.retention.ms: 7 days); a topic's own retention (30 days
    here, or -1) comes with its LeaderAndIsr. Until then retention leaves the log alone: it deleted 10-day-old
    data of a 30-day topic at its first pass after a restart."""
    clock = ManualClock(TS)
    hws: dict[TopicPartition, int] = {}
    cfg = broker_config({"log.retention.check.interval.ms": 1000})
    thirty_days = LogConfig(segment_bytes=600, retention_ms=30 * 24 * 3_600_000)
    mgr = LogManager(tmp_path, cfg, clock, high_watermarks=lambda: dict(hws))
    await mgr.load()
    lg = await mgr.get_or_create_log(A, thirty_days)
    for i in range(6):
        lg.append_as_leader(batch(1, size=250, ts=TS + i), 0)
    hws[A] = lg.log_end_offset
    await mgr.close()
    clock.advance(10 * 24 * 3_600_000)
    mgr = LogManager(tmp_path, cfg, clock, high_watermarks=lambda: dict(hws))
    await mgr.load()
    reloaded = mgr.get_log(A)
    assert reloaded is not None
    segments = len(reloaded.segments)
    clock.advance(1000)
    await mgr.tick()
    assert (len(reloaded.segments), reloaded.log_start_offset) == (segments, 0), "the 7-day default applied"
    await mgr.get_or_create_log(A, thirty_days)  # the LeaderAndIsr: the topic's config
    clock.advance(1000)
    await mgr.tick()
    assert reloaded.log_start_offset == 0, "10 days old, kept 30"
    await mgr.get_or_create_log(A, LogConfig(segment_bytes=600, retention_ms=24 * 3_600_000))
    clock.advance(1000)
    await mgr.tick()
    assert reloaded.log_start_offset == 6, "a topic's own retention still applies"
    await mgr.close()


async def test_a_pass_expires_a_bounded_number_of_idle_active_segments(tmp_path: Path) -> None:
    """Expiring an active segment rolls first (fsyncs on the event loop): the idle partitions of a topic, all
    due in one pass, are spread over passes."""
    clock = ManualClock(TS)
    mgr = LogManager(tmp_path, broker_config(), clock, high_watermarks=lambda: {tp: 1 for tp in tps})
    mgr.max_active_expiries_per_pass = 2
    await mgr.load()
    tps = [TopicPartition("idle", p) for p in range(5)]
    for tp in tps:
        (await mgr.get_or_create_log(tp, LogConfig(retention_ms=1000))).append_as_leader(batch(1), 0)
    clock.advance(10_000)
    expired = []
    for _ in range(3):
        mgr.run_retention()
        expired.append(sum(1 for tp in tps if mgr.logs()[tp].log_start_offset == 1))
    assert expired == [2, 4, 5]
    await mgr.close()


async def test_invalid_topic_partition_refused(tmp_path: Path) -> None:
    import pytest

    mgr = LogManager(tmp_path, broker_config(), ManualClock(TS))
    await mgr.load()
    for tp in (TopicPartition("", 0), TopicPartition("a/b", 0), TopicPartition("..", 0), TopicPartition("t", -1),
               TopicPartition("has space", 0)):
        with pytest.raises(ValueError):
            await mgr.get_or_create_log(tp, LogConfig())
    assert list(tmp_path.iterdir()) == []
    await mgr.close()


async def test_checkpoint_writes_from_several_threads_do_not_collide(tmp_path: Path) -> None:
    # a periodic HW checkpoint cancelled at shutdown goes on in its thread while the final one starts;
    # both write through the same temp file, so an unserialised pair could fail or interleave
    import threading

    lm = LogManager(tmp_path, broker_config(), ManualClock())
    await lm.load()
    errors: list[BaseException] = []

    def writer(hw: int) -> None:
        for _ in range(100):
            try:
                lm.checkpoint_high_watermarks({A: hw})
            except BaseException as exc:  # collected for the assertion below
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(hw,)) for hw in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert checkpoint.read_offsets(tmp_path / HW_CHECKPOINT)[A] in (1, 2, 3)
    await lm.close()



async def test_a_deleted_log_leaves_nothing_a_recreated_topic_would_open(tmp_path: Path) -> None:
    """The directory is renamed out of its live name before it is removed (Kafka's -delete suffix); a
    removal cut short leaves a -delete directory, which the next load removes and never opens."""
    clock = ManualClock(TS)
    mgr = LogManager(tmp_path, broker_config(), clock)
    await mgr.load()
    lg = await mgr.get_or_create_log(A, LogConfig())
    lg.append_as_leader(batch(3), 1)
    await mgr.delete_log(A)
    assert mgr.get_log(A) is None and sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == []
    # what a crash half-way through a removal leaves: the renamed directory with its files
    leftover = tmp_path / f"{A}.0123456789abcdef-delete"
    leftover.mkdir()
    (leftover / "00000000000000000000.log").write_bytes(b"old records")
    await mgr.close()
    mgr = LogManager(tmp_path, broker_config(), clock)
    await mgr.load()
    assert mgr.logs() == {} and not leftover.exists()
    again = await mgr.get_or_create_log(A, LogConfig())
    assert (again.log_start_offset, again.log_end_offset) == (0, 0)
    await mgr.close()


async def test_a_log_being_deleted_is_closed_on_the_loop_before_the_removal_thread_starts(tmp_path: Path) -> None:
    """The periodic tick uses every listed log on the event loop: a deletion must take the log out of use there,
    not in the worker thread that removes its files (a tick then fsynced a segment that thread was closing:
    fd -1 or EBADF, the latter taken for a failure of the data dir)."""
    clock = ManualClock(TS)
    mgr = LogManager(tmp_path, broker_config({"log.flush.interval.ms": 1000}), clock)
    await mgr.load()
    lg = await mgr.get_or_create_log(A, LogConfig(flush_ms=1000))
    lg.append_as_leader(batch(3), 1)
    clock.advance(2_000)  # a flush is due at the next tick
    deleting = asyncio.ensure_future(mgr.delete_log(A))
    await asyncio.sleep(0)  # the deletion has reached its worker thread
    with pytest.raises(StorageError, match="deleted"):
        lg.read(0, 1 << 20)
    await mgr.tick()  # raises nothing: the log is skipped, whatever the thread is doing
    await deleting
    assert mgr.get_log(A) is None and mgr.failure is None
    await mgr.close()


async def test_a_delete_that_cannot_rename_fails_and_is_retried(tmp_path: Path) -> None:
    """A failed deletion raises (StopReplica answers KAFKA_STORAGE_ERROR, the controller retries) and the log
    stays listed, so the retry deletes it; it used to be dropped from the map and reported deleted while
    its directory stayed under the live name."""
    import subprocess

    clock = ManualClock(TS)
    data = tmp_path / "data"
    mgr = LogManager(data, broker_config(), clock)
    await mgr.load()
    (await mgr.get_or_create_log(A, LogConfig())).append_as_leader(batch(3), 1)
    # an immutable data dir: nothing in it can be renamed, not even by root
    if subprocess.run(["chattr", "+i", str(data)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        with pytest.raises(OSError):
            await mgr.delete_log(A)
        assert mgr.get_log(A) is not None and (data / str(A)).is_dir()
    finally:
        subprocess.run(["chattr", "-i", str(data)], check=True)
    await mgr.delete_log(A)
    assert mgr.get_log(A) is None and not (data / str(A)).exists()
    await mgr.close()


def test_only_canonical_partition_numbers_name_a_partition_directory() -> None:
    """``s-01`` parsed as partition 1 took over ``s-1``'s log; only ``str(int)`` names count (Kafka writes
    partition dirs the same way), and an int32 at most."""
    from storage.log import parse_topic_partition

    assert parse_topic_partition(Path("s-0")) == TopicPartition("s", 0)
    assert parse_topic_partition(Path("my-topic-12")) == TopicPartition("my-topic", 12)
    assert parse_topic_partition(Path("t-2147483647")) == TopicPartition("t", 2**31 - 1)
    for name in ("s-01", "s-00", "s-+1", "s-1.5", "s-1 ", "s-\u0661", "s-\uff11", "s-2147483648", "s-", "-1", "s1"):
        with pytest.raises(ValueError):
            parse_topic_partition(Path(name))


async def test_a_stray_directory_with_a_leading_zero_does_not_take_over_the_partition(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A directory ``s-01`` next to ``s-1`` was loaded as partition s-1 (first in sort order), hiding the
    records of ``s-1`` and taking its new writes. It is not a partition directory: left alone, with a
    warning; ``s-1`` is loaded."""
    s1 = TopicPartition("s", 1)
    mgr = LogManager(tmp_path, broker_config(), ManualClock(TS))
    await mgr.load()
    lg = await mgr.get_or_create_log(s1, LogConfig())
    for _ in range(50):
        lg.append_as_leader(batch(1), 0)
    other = await mgr.get_or_create_log(TopicPartition("x", 1), LogConfig())
    other.append_as_leader(batch(3), 0)
    await mgr.close()
    (tmp_path / "x-1").rename(tmp_path / "s-01")
    stray = sorted(p.name for p in (tmp_path / "s-01").iterdir())

    mgr2 = LogManager(tmp_path, broker_config(), ManualClock(TS))
    await mgr2.load()
    loaded = mgr2.get_log(s1)
    assert loaded is not None and loaded.dir == tmp_path / "s-1" and loaded.log_end_offset == 50
    assert set(mgr2.logs()) == {s1}
    assert any("unknown_dir_ignored" in r.getMessage() and "s-01" in r.getMessage() for r in caplog.records)
    loaded.append_as_leader(batch(1), 0)
    await mgr2.close()
    assert sorted(p.name for p in (tmp_path / "s-01").iterdir()) == stray  # untouched


async def test_io_failures_of_the_data_dir_reach_the_handler_once(tmp_path: Path) -> None:
    """Every I/O failure counts as the data dir's (Kafka's LogDirFailureChannel); the first one reaches
    ``on_dir_failure`` with the dir and the error, later ones do not, and the periodic tasks stop. ``close``
    still closes every log: the healthy one is flushed and checkpointed at its end, the failed one keeps
    its older recovery point (its data is re-validated at the next open)."""
    import os

    failures: list[tuple[Path, str]] = []
    clock = ManualClock(TS)
    mgr = LogManager(tmp_path, broker_config(), clock, on_dir_failure=lambda d, e: failures.append((d, e)))
    await mgr.load()
    broken, healthy = await mgr.get_or_create_log(A, LogConfig()), await mgr.get_or_create_log(B, LogConfig())
    broken.append_as_leader(batch(2), 0)
    healthy.append_as_leader(batch(4), 0)
    seg = broken.segments[-1]
    ro = os.open(seg.dir / "00000000000000000000.log", os.O_RDONLY)
    os.dup2(ro, seg.fd)  # the segment's descriptor now refuses writes (EBADF): an OS-level fault
    os.close(ro)
    with pytest.raises(StorageError):
        broken.append_as_leader(batch(1), 0)
    assert len(failures) == 1
    data_dir, error = failures[0]
    assert data_dir == tmp_path and error.startswith("orders-0: OSError") and "Bad file descriptor" in error
    assert mgr.failure == error

    (tmp_path / f"{HW_CHECKPOINT}.tmp").mkdir()  # the next HW checkpoint write fails (EISDIR), even as root
    with pytest.raises(StorageError, match=HW_CHECKPOINT):
        mgr.checkpoint_high_watermarks({A: 2, B: 4})
    with pytest.raises(StorageError):
        broken.read(0, 100)
    assert len(failures) == 1  # once

    healthy.append_as_leader(batch(1), 0)
    clock.advance(120_000)
    await mgr.tick()  # nothing runs on a failed dir: no checkpoint written
    assert not (tmp_path / RECOVERY_CHECKPOINT).exists()
    await mgr.close()
    assert checkpoint.read_offsets(tmp_path / RECOVERY_CHECKPOINT) == {A: 0, B: 5}


async def test_a_checkpoint_that_cannot_be_written_fails_the_dir_and_leaves_the_old_file(tmp_path: Path) -> None:
    failures: list[tuple[Path, str]] = []
    mgr = LogManager(tmp_path, broker_config(), ManualClock(TS), on_dir_failure=lambda d, e: failures.append((d, e)))
    await mgr.load()
    mgr.checkpoint_high_watermarks({A: 3})
    before = (tmp_path / HW_CHECKPOINT).read_bytes()
    (tmp_path / f"{HW_CHECKPOINT}.tmp").mkdir()
    with pytest.raises(StorageError):
        mgr.checkpoint_high_watermarks({A: 9})
    assert (tmp_path / HW_CHECKPOINT).read_bytes() == before
    assert [(d, HW_CHECKPOINT in e and "IsADirectoryError" in e) for d, e in failures] == [(tmp_path, True)]
    await mgr.close()


async def test_a_partition_that_cannot_be_opened_fails_the_load_naming_it_and_closes_the_others(
        tmp_path: Path) -> None:
    """``Log.open``'s error names the partition dir (the broker prints it as its one line); the logs opened
    before it are closed, not left open."""
    import os

    mgr = LogManager(tmp_path, broker_config(), ManualClock(TS))
    await mgr.load()
    for tp in (A, B):
        (await mgr.get_or_create_log(tp, LogConfig())).append_as_leader(batch(2), 0)
    await mgr.close()
    (tmp_path / str(B) / "00000000000000000050.log").mkdir()  # a directory named like a segment
    fds = len(os.listdir("/proc/self/fd"))
    mgr2 = LogManager(tmp_path, broker_config(), ManualClock(TS))
    with pytest.raises(StorageError, match=rf"{tmp_path / str(B)}: cannot open log: .*Is a directory"):
        await mgr2.load()
    assert mgr2.logs() == {} and len(os.listdir("/proc/self/fd")) == fds
