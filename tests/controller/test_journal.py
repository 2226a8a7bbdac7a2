"""Journal and snapshot: replay equals what was acknowledged; torn tails are cut; snapshots are atomic."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ErrorCode
from common.wire import TopicPartition
from controller.journal import JOURNAL_NAME, SNAPSHOT_NAME, Journal, JournalCorruptError
from controller.state import (
    BrokerFencingRecord,
    ControllerEpochRecord,
    MetadataImage,
    PartitionRecord,
    PartitionState,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    TopicStoppedRecord,
    record_from_dict,
    record_to_dict,
)

OPS: list[list[Record]] = [
    [ControllerEpochRecord(1)],
    [RegisterBrokerRecord(1, "127.0.0.1", 9001, "a", 1)],
    [RegisterBrokerRecord(2, "127.0.0.1", 9002, "b", 2)],
    [TopicRecord("t", {"min.insync.replicas": 2}),
     PartitionRecord("t", 0, (1, 2), (1, 2), 1, 0, 0), PartitionRecord("t", 1, (2, 1), (2, 1), 2, 0, 0)],
    [BrokerFencingRecord(2, 2, True), PartitionRecord("t", 1, (2, 1), (1,), 1, 1, 1)],
    [TopicRecord("gone", {}), PartitionRecord("gone", 0, (1,), (1,), 1, 0, 0)],
    [RemoveTopicRecord("gone", {1: [0]})],
    [TopicStoppedRecord("gone", 1)],
]


def replay(d: Path) -> MetadataImage:
    journal, image = Journal.open(d)
    journal.close()
    return image


def written(d: Path, ops: list[list[Record]]) -> tuple[Journal, MetadataImage]:
    """A journal in ``d`` with ``ops`` appended, and the image they make."""
    journal, image = Journal.open(d)
    for op in ops:
        journal.append(op)
        for r in op:
            image.apply(r)
    return journal, image


def image_of(ops: list[list[Record]]) -> MetadataImage:
    image = MetadataImage()
    for op in ops:
        for r in op:
            image.apply(r)
    return image


def test_producer_ids_records_round_trip_replay_and_snapshot(tmp_path: Path) -> None:
    recs = [ProducerIdsRecord(1, 1, 1000), ProducerIdsRecord(2, 2, 2000), ProducerIdsRecord(1, 1, 1000)]
    for r in recs:
        assert record_from_dict(record_to_dict(r)) == r
    journal, image = written(tmp_path, [[r] for r in recs])
    assert image.next_producer_id == 2000  # a record applied again never moves it back
    journal.close()
    assert replay(tmp_path).next_producer_id == 2000
    assert MetadataImage.from_snapshot(image.to_snapshot()) == image


def test_records_round_trip() -> None:
    for op in OPS:
        for r in op:
            assert record_from_dict(record_to_dict(r)) == r
    with pytest.raises(ValueError):
        record_from_dict({"type": "nope"})
    with pytest.raises(ValueError):
        record_from_dict({"type": "controller_epoch"})


def test_apply_is_deterministic_and_idempotent() -> None:
    image = image_of(OPS)
    assert image.controller_epoch == 1 and image.last_broker_epoch == 2
    assert image.brokers[2].fenced and not image.brokers[1].fenced
    assert set(image.topics) == {"t"}
    assert image.partitions[TopicPartition("t", 1)] == PartitionState((2, 1), (1,), 1, 1, 1)
    again = image_of(OPS + OPS[3:5])
    assert again.partitions == image.partitions
    assert MetadataImage.from_snapshot(image.to_snapshot()) == image


def test_epoch_records_never_move_the_image_back() -> None:
    # both are maxima: a record with an older value (a frame applied again, a snapshot listing brokers in node
    # order rather than epoch order) never lowers them, or the next registration reuses a broker epoch
    image = MetadataImage()
    image.apply(ControllerEpochRecord(5))
    image.apply(ControllerEpochRecord(3))
    assert image.controller_epoch == 5
    image.apply(RegisterBrokerRecord(2, "127.0.0.1", 9002, "b", 7))
    image.apply(RegisterBrokerRecord(1, "127.0.0.1", 9001, "a", 4))
    assert image.last_broker_epoch == 7


def test_replay_returns_every_appended_operation(tmp_path: Path) -> None:
    journal, image = Journal.open(tmp_path)
    assert image == MetadataImage()
    for op in OPS:
        journal.append(op)
    journal.close()
    journal2, replayed = Journal.open(tmp_path)
    assert replayed == image_of(OPS)
    assert journal2.offset == len(OPS)
    journal2.close()


@pytest.mark.parametrize("cut", [1, 4, 7, 8, 20])
def test_torn_tail_is_truncated(tmp_path: Path, cut: int) -> None:
    journal, _image = Journal.open(tmp_path)
    for op in OPS:
        journal.append(op)
    journal.close()
    path = tmp_path / JOURNAL_NAME
    size_before_last = _size_without_last_frame(tmp_path)
    with open(path, "r+b") as f:  # a crash mid-write of the last frame
        f.truncate(path.stat().st_size - cut)
    journal2, replayed = Journal.open(tmp_path)
    assert replayed == image_of(OPS[:-1])
    assert path.stat().st_size == size_before_last
    journal2.append(OPS[-1])  # the journal goes on from the cut
    journal2.close()
    again = replay(tmp_path)
    assert again == image_of(OPS)


def _size_without_last_frame(tmp_path: Path) -> int:
    other = tmp_path / "other"
    j, _image = Journal.open(other)
    for op in OPS[:-1]:
        j.append(op)
    j.close()
    return (other / JOURNAL_NAME).stat().st_size


def test_corrupt_middle_frame_stops_replay_there(tmp_path: Path) -> None:
    journal, _image = Journal.open(tmp_path)
    for op in OPS:
        journal.append(op)
    journal.close()
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # bad CRC in the last frame
    path.write_bytes(bytes(data))
    replayed = replay(tmp_path)
    assert replayed == image_of(OPS[:-1])


def test_a_damaged_frame_with_whole_frames_after_it_is_refused_not_cut(tmp_path: Path) -> None:
    # a crash tears only the last frame; a flipped bit in the middle is disk damage, and cutting there
    # would drop every later acknowledged change (leader epochs the controller would then hand out again)
    journal, _image = written(tmp_path, OPS)
    journal.close()
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    size_of_first_three = _size_of(tmp_path / "three", OPS[:3])
    data[size_of_first_three + 10] ^= 0xFF  # in the payload of frame 4 of 8
    path.write_bytes(bytes(data))
    for _ in range(2):  # the second time too: the lock was released, nothing was cut
        with pytest.raises(JournalCorruptError, match=f"frame at byte {size_of_first_three} is damaged but 4 whole"):
            Journal.open(tmp_path)
    assert path.read_bytes() == bytes(data)


def test_a_damaged_frame_whose_payload_still_decodes_is_caught_by_its_crc(tmp_path: Path) -> None:
    # a changed digit in a broker's host is still valid msgpack: only the CRC tells the frame is damaged
    journal, _image = written(tmp_path, OPS)
    journal.close()
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    host = data.index(b"127.0.0.1")  # in frame 2 of 8, broker 1's registration
    data[host + 8] = ord("7")
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError, match="is damaged but"):
        Journal.open(tmp_path)


def test_an_append_whose_fsync_fails_is_not_acknowledged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the append fsyncs before it returns: a failing fsync (EIO) is its failure, and the journal stops
    import errno
    import os

    from controller import journal as journal_module
    from controller.journal import JournalBrokenError

    journal, _image = Journal.open(tmp_path)
    journal.append(OPS[0])

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(journal_module.os, "fsync", failing_fsync)
    try:
        with pytest.raises(JournalBrokenError, match="Input/output error"):
            journal.append(OPS[1])
        assert journal.offset == 1
    finally:
        monkeypatch.undo()
        journal.close()


def test_a_journal_file_created_at_open_has_its_directory_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the new file's directory entry must be durable before a frame in it is acknowledged
    from controller import journal as journal_module

    synced: list[Path] = []
    real = journal_module.fsync_dir

    def fsync_dir(path: Path) -> None:
        synced.append(Path(path))
        real(path)

    monkeypatch.setattr(journal_module, "fsync_dir", fsync_dir)
    journal, _image = Journal.open(tmp_path)
    journal.close()
    assert tmp_path in synced


def _size_of(d: Path, ops: list[list[Record]]) -> int:
    journal, _image = written(d, ops)
    journal.close()
    return (d / JOURNAL_NAME).stat().st_size


def test_a_frame_above_64_mib_replays_in_the_journal_and_as_the_snapshot(tmp_path: Path) -> None:
    # one operation is one frame and the whole image is one snapshot frame, of any size (a CreateTopics of
    # ~630k partitions passes 64 MiB): a complete frame must replay, never be cut as a torn tail
    big = [TopicRecord("big", {"note": "x" * (65 << 20)})]
    ops = [OPS[0], big, OPS[1]]
    journal, _image = written(tmp_path, ops)
    journal.close()
    assert (tmp_path / JOURNAL_NAME).stat().st_size > 65 << 20
    j2, replayed = Journal.open(tmp_path)
    assert (replayed, j2.offset, j2.truncated_bytes) == (image_of(ops), 3, 0)
    assert j2.snapshot(replayed) is None
    j2.close()
    assert (tmp_path / SNAPSHOT_NAME).stat().st_size > 65 << 20
    assert replay(tmp_path) == image_of(ops)


def test_a_deleted_topic_leaves_the_leader_epoch_its_namesake_starts_at_through_snapshots() -> None:
    image = image_of(OPS[:5])  # t-0 at epoch 0, t-1 at epoch 1
    image.apply(RemoveTopicRecord("t", {}))
    assert image.leader_epoch_floors == {"t": 2}
    again = MetadataImage.from_snapshot(image.to_snapshot())
    assert again == image and again.leader_epoch_floors == {"t": 2}
    again.apply(TopicRecord("t", {}))  # created again: its partition records carry their epochs from here
    assert again.leader_epoch_floors == {}


def test_deleted_topic_names_are_remembered_up_to_a_bound_the_oldest_forgotten_first() -> None:
    from controller import state

    image = MetadataImage()
    for i in range(state.MAX_LEADER_EPOCH_FLOORS + 3):
        image.apply(TopicRecord(f"t{i}", {}))
        image.apply(PartitionRecord(f"t{i}", 0, (1,), (1,), 1, 0, 0))
        image.apply(RemoveTopicRecord(f"t{i}", {}))
    assert len(image.leader_epoch_floors) == state.MAX_LEADER_EPOCH_FLOORS
    newest = f"t{state.MAX_LEADER_EPOCH_FLOORS + 2}"
    assert "t0" not in image.leader_epoch_floors and newest in image.leader_epoch_floors
    assert MetadataImage.from_snapshot(image.to_snapshot()).leader_epoch_floors == image.leader_epoch_floors


def test_snapshot_then_journal(tmp_path: Path) -> None:
    journal, image = written(tmp_path, OPS[:4])
    journal.snapshot(image)
    assert (tmp_path / JOURNAL_NAME).stat().st_size == 0
    for op in OPS[4:]:
        journal.append(op)
    journal.close()
    j2, replayed = Journal.open(tmp_path)
    assert replayed == image_of(OPS)
    assert j2.offset == len(OPS)
    j2.close()


def test_crash_between_snapshot_and_journal_reset_skips_covered_frames(tmp_path: Path) -> None:
    journal, image = written(tmp_path, OPS)
    old_journal = (tmp_path / JOURNAL_NAME).read_bytes()
    journal.snapshot(image)
    journal.close()
    (tmp_path / JOURNAL_NAME).write_bytes(old_journal)  # as if the reset never happened
    replayed = replay(tmp_path)
    assert replayed == image


def test_damaged_snapshot_is_refused(tmp_path: Path) -> None:
    journal, image = Journal.open(tmp_path)
    journal.append(OPS[0])
    image.apply(OPS[0][0])
    journal.snapshot(image)
    journal.close()
    snap = tmp_path / SNAPSHOT_NAME
    snap.write_bytes(snap.read_bytes()[:-2])
    with pytest.raises(JournalCorruptError):
        replay(tmp_path)


@settings(max_examples=30, deadline=None)
@given(cut=st.integers(0, 2000), snap_at=st.integers(0, len(OPS)))
def test_any_crash_point_replays_a_prefix(tmp_path_factory: pytest.TempPathFactory, cut: int, snap_at: int) -> None:
    d = tmp_path_factory.mktemp("j")
    journal, image = Journal.open(d)
    for i, op in enumerate(OPS):
        if i == snap_at:
            journal.snapshot(image)
        journal.append(op)
        for r in op:
            image.apply(r)
    journal.close()
    path = d / JOURNAL_NAME
    with open(path, "r+b") as f:
        f.truncate(max(0, path.stat().st_size - cut))
    replayed = replay(d)
    first = snap_at if snap_at < len(OPS) else 0  # snap_at == len(OPS): no snapshot was taken
    prefixes = [image_of(OPS[:k]) for k in range(first, len(OPS) + 1)]
    assert replayed in prefixes


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_failed_write_refuses_every_later_append(tmp_path: Path) -> None:
    from controller.journal import JournalBrokenError

    journal, _image = Journal.open(tmp_path)
    journal.append(OPS[0])
    good = journal._file
    journal._file = open("/dev/full", "ab", buffering=0)  # noqa: SIM115 - a full disk (ENOSPC on write)
    try:
        with pytest.raises(JournalBrokenError):
            journal.append(OPS[1])
        journal._file.close()
        journal._file = good
        with pytest.raises(JournalBrokenError):
            journal.append(OPS[2])  # the disk came back, but the journal does not trust itself any more
    finally:
        journal.close()
    assert replay(tmp_path) == image_of(OPS[:1])


def test_one_owner_per_data_dir(tmp_path: Path) -> None:
    from controller.journal import DataDirLockedError

    journal, _image = Journal.open(tmp_path)
    try:
        with pytest.raises(DataDirLockedError):
            Journal.open(tmp_path)
    finally:
        journal.close()
    replay(tmp_path)  # free again once closed


def test_a_snapshot_that_cannot_be_written_leaves_the_journal_serving(tmp_path: Path) -> None:
    journal, image = written(tmp_path, OPS[:4])
    (tmp_path / (SNAPSHOT_NAME + ".tmp")).mkdir()  # the snapshot's temp file cannot be created
    try:
        failed = journal.snapshot(image)
        assert failed is not None and "IsADirectoryError" in failed
        for op in OPS[4:]:
            journal.append(op)  # nothing replay relies on changed: appends go on
    finally:
        journal.close()
    (tmp_path / (SNAPSHOT_NAME + ".tmp")).rmdir()
    assert replay(tmp_path) == image_of(OPS)


def test_a_snapshot_that_fails_leaves_no_temp_file(tmp_path: Path) -> None:
    # a partial metadata.snapshot.tmp stayed until a later snapshot succeeded: on a full disk, space the
    # journal needed (found by a disk-full review)
    journal, image = written(tmp_path, OPS[:4])
    (tmp_path / SNAPSHOT_NAME).mkdir()  # written in full, then it cannot take the snapshot's place
    try:
        failed = journal.snapshot(image)
        assert failed is not None
        assert not (tmp_path / (SNAPSHOT_NAME + ".tmp")).exists()
    finally:
        journal.close()


def test_a_journal_that_cannot_be_restarted_after_a_snapshot_is_broken(tmp_path: Path) -> None:
    # it used to be left closed: every later append raised ValueError, which nothing took as fatal, so the
    # controller stayed up and could commit nothing
    from controller.journal import JournalBrokenError

    journal, image = written(tmp_path, OPS[:4])
    (tmp_path / (JOURNAL_NAME + ".tmp")).mkdir()  # the empty journal cannot be written
    try:
        with pytest.raises(JournalBrokenError):
            journal.snapshot(image)
        with pytest.raises(JournalBrokenError):
            journal.append(OPS[4])
    finally:
        journal.close()
    (tmp_path / (JOURNAL_NAME + ".tmp")).rmdir()
    assert replay(tmp_path) == image_of(OPS[:4])  # the snapshot, and the old journal's frames it covers


async def test_the_controller_answers_a_committed_change_and_exits_when_its_snapshot_breaks_the_journal(
        tmp_path: Path) -> None:
    from common.clock import ManualClock
    from common.config import controller_config
    from controller.controller import Controller

    class NoBrokers:  # the propagation transport's interface; nothing listens in this test
        async def call(self, address: str, api: str, body: dict[str, object], *,
                       timeout_s: float | None = None) -> dict[str, object]:
            return {"error": 0, "partitions": []}

    # the first start journals 2 records (the cluster id, the epoch); the registration makes 3: a snapshot
    c = Controller(tmp_path, controller_config({"metadata.snapshot.interval.records": 3}), ManualClock(),
                   transport=NoBrokers(), stall_guard=False)
    await c.start()
    try:
        (tmp_path / (JOURNAL_NAME + ".tmp")).mkdir()
        error, epoch = await c.register_broker(1, "127.0.0.1", 9001, "a")  # committed, then the snapshot fails
        assert error is ErrorCode.NONE and epoch > 0
        assert c.fatal.is_set()  # the process exits, to restart and replay
    finally:
        await c.close()
    (tmp_path / (JOURNAL_NAME + ".tmp")).rmdir()
    journal, image = Journal.open(tmp_path)
    journal.close()
    assert 1 in image.brokers


class _NoBrokers:  # the propagation transport's interface; nothing listens in these tests
    async def call(self, address: str, api: str, body: dict[str, object], *,
                   timeout_s: float | None = None) -> dict[str, object]:
        return {"error": 0, "partitions": []}


async def _started_controller(tmp_path: Path) -> Any:
    from common.clock import ManualClock
    from common.config import controller_config
    from controller.controller import Controller

    c = Controller(tmp_path, controller_config(), ManualClock(), transport=_NoBrokers(), stall_guard=False)
    await c.start()
    return c


async def test_a_commit_cancelled_before_its_journal_write_ends_is_applied_before_it_gives_up(
        tmp_path: Path) -> None:
    """A commit cancelled while its records are on their way to the journal (Controller.close cancels the
    liveness task's fences) gave up at once, and a write already running went on: the records journalled but
    never applied, and the lock free for the next commit to write beside it. It now waits for the write,
    applies it, then raises CancelledError. (The write is held in the loop's one worker thread here.)"""
    import concurrent.futures
    import threading

    c = await _started_controller(tmp_path)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    release = threading.Event()
    busy = loop.run_in_executor(None, release.wait)
    try:
        registering = asyncio.ensure_future(c.register_broker(1, "127.0.0.1", 9001, "a"))
        for _ in range(20):
            await asyncio.sleep(0)
        registering.cancel()
        await asyncio.sleep(0.05)
        assert not registering.done()  # waiting for its write, not gone
        release.set()
        await busy
        with pytest.raises(asyncio.CancelledError):
            await registering
        assert 1 in c.image.brokers  # what the journal holds, the image holds
    finally:
        release.set()
        await c.close()
    journal, image = Journal.open(tmp_path)
    journal.close()
    assert 1 in image.brokers


async def test_a_commit_cancelled_during_a_journal_write_that_fails_still_ends_cancelled(tmp_path: Path) -> None:
    """The write fails after the cancel (a full disk at shutdown): the controller is marked fatal and the commit
    ends with CancelledError. The write's error came out instead, and a liveness loop that logs and goes on
    after an error never ended: Controller.close waited on it for good."""
    import os

    c = await _started_controller(tmp_path)
    r, w = os.pipe()
    os.set_blocking(w, False)
    with contextlib.suppress(BlockingIOError):
        while True:  # fill the pipe: the journal's next write blocks in its thread
            os.write(w, b"x" * 65536)
    os.set_blocking(w, True)
    journal = c._journal
    assert journal is not None
    journal._file.close()
    journal._file = open(w, "ab", buffering=0)  # noqa: SIM115 - written by the journal, closed by its close()
    try:
        registering = asyncio.ensure_future(c.register_broker(1, "127.0.0.1", 9001, "a"))
        await asyncio.sleep(0.1)  # the write is blocked in its thread
        registering.cancel()
        await asyncio.sleep(0.05)
        assert not registering.done()
        os.set_blocking(r, False)
        for _ in range(500):  # drained: the write goes through; the fsync of a pipe then fails (EINVAL)
            with contextlib.suppress(BlockingIOError):
                os.read(r, 1 << 20)
            if registering.done():
                break
            await asyncio.sleep(0.01)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(registering), 10)
        assert c.fatal.is_set()
    finally:
        await asyncio.wait_for(c.close(), 10)
        os.close(r)
