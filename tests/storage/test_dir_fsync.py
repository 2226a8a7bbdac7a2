"""The partition directory is fsynced before the recovery point moves over a newly created segment.

A segment's data and indexes being fsynced does not make its directory entry durable: after a power loss
the file could be gone while the recovery point checkpoint says everything below it is on disk (Kafka's
``LocalLog.flush`` calls ``Utils.flushDirIfExists`` for that). The tests watch the ``fsync`` system calls
(``os.fsync`` wrapped) and note, for each on the partition directory, the recovery point at that moment.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from common.clock import ManualClock
from storage.log import Log, LogConfig
from tests.storage.helpers import TS, batch

CFG = LogConfig(segment_bytes=500)


class DirSyncs:
    """Records the recovery point at each fsync of the partition directory."""

    def __init__(self, pdir: Path) -> None:
        self.inode = pdir.stat().st_ino
        self.log: Log | None = None
        self.at: list[int] = []

    def wrap(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def fsync(fd: int) -> None:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode) and st.st_ino == self.inode and self.log is not None:
                self.at.append(self.log.recovery_point)
            real(fd)
        return fsync


def setup(pdir: Path, monkeypatch: pytest.MonkeyPatch, *, defer: bool) -> tuple[Log, DirSyncs]:
    log = Log.open(pdir, CFG, ManualClock(TS))
    log.defer_roll_flush = defer
    log.append_as_leader(batch(2, size=20), 0)  # the epoch checkpoint is written (and the directory synced)
    syncs = DirSyncs(pdir)
    monkeypatch.setattr(os, "fsync", syncs.wrap(os.fsync))
    syncs.log = log
    return log, syncs


def append_until_rolled(log: Log) -> int:
    while len(log.segments) == 1:
        log.append_as_leader(batch(2, size=20), 0)
    return log.segments[-1].base_offset


def test_an_inline_roll_syncs_the_directory_before_moving_the_recovery_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, syncs = setup(tmp_path / "t-0", monkeypatch, defer=False)
    new_base = append_until_rolled(log)
    assert log.recovery_point >= new_base
    assert syncs.at and min(syncs.at) < new_base
    log.close()


async def test_a_deferred_roll_flush_syncs_the_directory_before_moving_the_recovery_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, syncs = setup(tmp_path / "t-0", monkeypatch, defer=True)
    new_base = append_until_rolled(log)
    assert syncs.at == [] and log.recovery_point < new_base
    await log.flush_rolled_segments()
    assert log.recovery_point >= new_base
    assert syncs.at and min(syncs.at) < new_base
    log.close()


def test_a_flush_syncs_the_directory_when_a_segment_was_created(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, syncs = setup(tmp_path / "t-0", monkeypatch, defer=True)  # rolled, its flush not run
    new_base = append_until_rolled(log)
    log.flush()
    assert log.recovery_point == log.log_end_offset > new_base
    assert syncs.at and min(syncs.at) < new_base
    before = len(syncs.at)
    log.append_as_leader(batch(2, size=20), 0)
    log.flush()  # no segment created since: no directory fsync
    assert len(syncs.at) == before
    log.close()
