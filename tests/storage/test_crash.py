"""Crash test: cut the active segment anywhere and flip bytes in its tail; reopen.

The reopened log must be a valid prefix of what was written, its indexes must
agree with a full scan, and nothing after the first bad byte may survive.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.clock import ManualClock
from storage.log import Log, LogConfig
from storage.record_batch import iter_batches
from tests.storage.helpers import TS, batch
from tests.storage.scan import assert_indexes_match_scan

CFG = LogConfig(segment_bytes=4000, index_interval_bytes=200)


def write_log(pdir: Path, rng: random.Random, n: int) -> tuple[list[bytes], Log]:
    log = Log.open(pdir, CFG, ManualClock(TS))
    epoch = 0
    for i in range(n):
        epoch += rng.random() < 0.1
        log.append_as_leader(batch(rng.randint(1, 5), size=rng.randint(1, 300), ts=TS + i, tag=i), epoch)
    written = []
    for seg in log.segments:
        data = (seg.dir / f"{seg.base_offset:020d}.log").read_bytes()
        written += [data[p:p + h.size] for p, h in iter_batches(data)]
    return written, log


def all_batches(log: Log) -> list[bytes]:
    out = []
    for seg in log.segments:
        data = (seg.dir / f"{seg.base_offset:020d}.log").read_bytes()
        out += [data[p:p + h.size] for p, h in iter_batches(data)]
    return out


def check_reopened(pdir: Path, written: list[bytes], active_base: int, first_bad: int, boundaries: list[int],
                   recovery_point: int) -> Log:
    log = Log.open(pdir, CFG, ManualClock(TS), recovery_point=recovery_point)
    got = all_batches(log)
    assert got == written[:len(got)], "not a prefix of what was written"
    active = log.segments[-1]
    assert active.base_offset == active_base
    # exactly the whole batches that end at or before the first bad byte survive
    assert active.size == max(b for b in boundaries if b <= first_bad)
    assert log.log_end_offset == active.next_offset
    assert_indexes_match_scan(log)
    latest = log.epoch_cache.latest_entry()
    assert latest is None or latest.start_offset <= log.log_end_offset
    return log


@pytest.mark.parametrize("seed", range(40))
def test_cut_and_flip_active_segment(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    pdir = tmp_path / "t-0"
    written, log = write_log(pdir, rng, rng.randint(5, 60))
    active_base = log.segments[-1].base_offset
    log.close()
    path = pdir / f"{active_base:020d}.log"
    data = bytearray(path.read_bytes())
    boundaries = [0] + [p + h.size for p, h in iter_batches(data)]
    cut = rng.randint(0, len(data))
    del data[cut:]
    first_bad = cut
    flips = rng.randint(0, 3) if data else 0
    for _ in range(flips):
        pos = rng.randint(max(0, len(data) - 2000), len(data) - 1)
        data[pos] ^= rng.randint(1, 255)
        first_bad = min(first_bad, pos)
    path.write_bytes(bytes(data))
    # the recovery point: everything, the active segment, or a batch boundary inside it before the damage
    # (bytes below the recovery point were fsynced, so recovery may trust them)
    inside = [h.next_offset for p, h in iter_batches(path.read_bytes()) if p + h.size <= first_bad]
    rp = rng.choice([0, active_base, *inside[:1], *inside[-1:]])
    log = check_reopened(pdir, written, active_base, first_bad, boundaries, rp)
    # the log keeps working after recovery
    info = log.append_as_leader(batch(2), (log.latest_epoch() or 0) + 1)
    assert info.first_offset == log.log_end_offset - 2
    assert log.read(info.first_offset, 1 << 20).first_offset == info.first_offset
    log.close()


def test_crash_at_every_byte_of_an_append(tmp_path: Path) -> None:
    rng = random.Random(7)
    pdir = tmp_path / "t-0"
    written, log = write_log(pdir, rng, 8)
    before = log.segments[-1].size
    log.append_as_leader(batch(3, size=40) + batch(2, size=10), 9)
    active_base = log.segments[-1].base_offset
    log.close()
    path = pdir / f"{active_base:020d}.log"
    full = path.read_bytes()
    written = all_batches(Log.open(pdir, CFG, ManualClock(TS), recovery_point=active_base))
    epochs = (pdir / "leader-epoch-checkpoint").read_bytes()
    boundaries = [0] + [p + h.size for p, h in iter_batches(full)]
    for cut in range(before, len(full) + 1):
        path.write_bytes(full[:cut])
        (pdir / "leader-epoch-checkpoint").write_bytes(epochs)  # as at the crash: written before the data
        log = Log.open(pdir, CFG, ManualClock(TS), recovery_point=active_base)
        got = all_batches(log)
        assert got == written[:len(got)]
        assert log.segments[-1].size == max(b for b in boundaries if b <= cut)
        assert_indexes_match_scan(log)
        log.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40, 1040))
def test_cut_and_flip_active_segment_soak(tmp_path: Path, seed: int) -> None:
    test_cut_and_flip_active_segment(tmp_path, seed)
