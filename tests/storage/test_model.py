"""Model-based test: random operation sequences on a real Log against a plain in-memory model.

The model is a list of batches (base, last, epoch, bytes), the log start offset
and a naive leader-epoch list. After every step the LEO, log start offset,
latest epoch, epoch lookups and the bytes a full read returns must agree.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from common.clock import ManualClock
from storage.log import Log, LogConfig, TimestampOffset
from storage.record_batch import build_batch, iter_batches, stamp
from tests.storage.scan import assert_indexes_match_scan

TS = 1_700_000_000_000


@dataclass
class MBatch:
    base: int
    last: int
    epoch: int
    data: bytes
    first_ts: int


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="model-"))
        self.clock = ManualClock(TS)
        self.config = LogConfig(segment_bytes=1400, index_interval_bytes=120, retention_bytes=-1, retention_ms=-1)
        self.log = Log.open(self.tmp / "m-0", self.config, self.clock)
        self.batches: list[MBatch] = []
        self.start = 0
        self.epochs: list[tuple[int, int]] = []
        # the newest epoch this log has seen: leaders' epochs only grow, so no append goes below it, even once
        # truncations emptied the cache (a retention to the LEO, then a truncation at it, as Kafka's truncateTo)
        self.top_epoch = 0
        self.counter = 0
        self.ts = TS

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- model helpers ----------------------------------------------------------------------------------------
    @property
    def leo(self) -> int:
        return self.batches[-1].last + 1 if self.batches else self._empty_leo

    _empty_leo = 0

    def _latest_epoch(self) -> int:
        return max(self.epochs[-1][0] if self.epochs else 0, self.top_epoch)

    def _model_assign(self, epoch: int, start: int) -> None:
        self.top_epoch = max(self.top_epoch, epoch)
        if self.epochs and (epoch < self.epochs[-1][0] or
                            (epoch == self.epochs[-1][0] and start >= self.epochs[-1][1])):
            return
        self.epochs = [(e, s) for e, s in self.epochs if e < epoch and s < start] + [(epoch, start)]

    def _make(self, n: int, size: int) -> tuple[bytes, int]:
        self.counter += 1
        self.ts += 7
        data = build_batch([(b"k", bytes([self.counter % 256]) * size, self.ts + i) for i in range(n)],
                           timestamp_ms=self.ts)
        return data, self.ts

    def _record(self, data: bytes, epoch: int, ts: int) -> None:
        buf = bytearray(data)
        n = len(list(iter_batches(data)))
        assert n == 1
        base = self.leo
        stamp(buf, 0, base_offset=base, partition_leader_epoch=epoch)
        count = int.from_bytes(buf[57:61], "big")
        self.batches.append(MBatch(base, base + count - 1, epoch, bytes(buf), ts))

    # ---- rules ------------------------------------------------------------------------------------------------
    @rule(n=st.integers(1, 6), size=st.integers(0, 150), bump=st.booleans())
    def append_leader(self, n: int, size: int, bump: bool) -> None:
        epoch = self._latest_epoch() + int(bump)
        data, ts = self._make(n, size)
        info = self.log.append_as_leader(data, epoch)
        assert info.first_offset == self.leo
        self._model_assign(epoch, self.leo)
        self._record(data, epoch, ts)

    @rule(counts=st.lists(st.integers(1, 4), min_size=2, max_size=4), size=st.integers(0, 60), bump=st.booleans())
    def append_leader_many(self, counts: list[int], size: int, bump: bool) -> None:
        epoch = self._latest_epoch() + int(bump)
        made = [self._make(n, size) for n in counts]
        info = self.log.append_as_leader(b"".join(d for d, _ in made), epoch)
        assert (info.first_offset, info.batches, info.num_records) == (self.leo, len(counts), sum(counts))
        self._model_assign(epoch, self.leo)
        for data, ts in made:
            self._record(data, epoch, ts)

    @rule(counts=st.lists(st.integers(1, 4), min_size=2, max_size=4), size=st.integers(0, 60), bump=st.booleans())
    def append_follower_many(self, counts: list[int], size: int, bump: bool) -> None:
        epoch = self._latest_epoch() + int(bump)
        parts = []
        start = self.leo
        for n in counts:
            data, ts = self._make(n, size)
            buf = bytearray(data)
            stamp(buf, 0, base_offset=self.leo, partition_leader_epoch=epoch)
            parts.append(bytes(buf))
            self._record(data, epoch, ts)
        self.log.append_as_follower(b"".join(parts))
        self._model_assign(epoch, start)

    @rule(n=st.integers(1, 6), size=st.integers(0, 150), bump=st.booleans())
    def append_follower(self, n: int, size: int, bump: bool) -> None:
        epoch = self._latest_epoch() + int(bump)
        data, ts = self._make(n, size)
        buf = bytearray(data)
        stamp(buf, 0, base_offset=self.leo, partition_leader_epoch=epoch)
        self.log.append_as_follower(bytes(buf))
        self._model_assign(epoch, self.leo)
        self._record(data, epoch, ts)

    @rule(data=st.data(), max_bytes=st.integers(1, 3000), capped=st.booleans())
    def read(self, data: st.DataObject, max_bytes: int, capped: bool) -> None:
        start = data.draw(st.integers(self.start, self.leo))
        hw = data.draw(st.integers(start, self.leo)) if capped else None
        got = self.log.read(start, max_bytes, hw).records
        limit = self.leo if hw is None else hw
        want = [b for b in self.batches if b.last >= start and b.last < limit]
        parts = [got[p:p + h.size] for p, h in iter_batches(got)]
        assert sum(len(p) for p in parts) == len(got)
        if want:
            assert parts, "at least one batch"
            assert parts == [b.data for b in want[:len(parts)]]
            assert len(parts) == 1 or len(got) <= max_bytes
        else:
            assert got == b""

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(data=st.data())
    def increment_log_start(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.start, self.leo))
        self.log.maybe_increment_log_start_offset(target)
        self.start = max(self.start, target)
        self.epochs = self._trim_start(self.start)

    def _trim_start(self, start: int) -> list[tuple[int, int]]:
        before = [(e, s) for e, s in self.epochs if s <= start]
        after = [(e, s) for e, s in self.epochs if s > start]
        return ([(before[-1][0], start)] if before else []) + after

    @rule(retention=st.integers(0, 2000))
    def retention(self, retention: int) -> None:
        self.log.update_config(LogConfig(**{**self._cfg(), "retention_bytes": retention}))
        self.log.delete_old_segments()
        self.log.update_config(self.config)
        new_start = self.log.log_start_offset
        assert new_start >= self.start
        assert new_start == self.start or any(b.base == new_start for b in self.batches) or new_start == self.leo
        self.start = new_start
        self.epochs = self._trim_start(self.start)

    @rule(data=st.data(), by_time=st.booleans())
    def retention_below_hw(self, data: st.DataObject, by_time: bool) -> None:
        hw = data.draw(st.integers(self.start, self.leo))
        cfg = {**self._cfg(), "retention_ms": 0} if by_time else {**self._cfg(), "retention_bytes": 0}
        self.log.update_config(LogConfig(**cfg))
        self.clock.advance(1_000_000)
        self.log.delete_old_segments(high_watermark=hw)
        self.log.update_config(self.config)
        new_start = self.log.log_start_offset
        assert new_start == self.start or self.start < new_start <= hw  # never data at or above the HW
        self.start = new_start
        self.epochs = self._trim_start(self.start)

    def _cfg(self) -> dict[str, int]:
        c = self.config
        return {"segment_bytes": c.segment_bytes, "index_interval_bytes": c.index_interval_bytes,
                "retention_bytes": c.retention_bytes, "retention_ms": c.retention_ms}

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(0, self.leo + 2))
        removed = self.log.truncate_to(target)
        assert removed == (target < self.leo)
        if target >= self.leo:
            self.epochs = [(e, s) for e, s in self.epochs if s < self.leo]  # an epoch that never appended goes
            return
        if target < self.start:
            self._reset(target)
            return
        leo = next(b.base for b in self.batches if b.last >= target)  # the whole batch holding target goes
        if leo < self.start:
            self._reset(target)
            return
        self.batches = [b for b in self.batches if b.last < target]
        if not self.batches:
            self._empty_leo = leo
        self.epochs = [(e, s) for e, s in self.epochs if s < leo]

    def _reset(self, offset: int) -> None:
        self.batches = []
        self._empty_leo = offset
        self.start = offset
        self.epochs = []

    @rule(ahead=st.integers(0, 50))
    def truncate_fully(self, ahead: int) -> None:
        offset = self.leo + ahead
        self.log.truncate_fully_and_start_at(offset)
        self._reset(offset)

    @rule()
    def assign_epoch(self) -> None:
        epoch = self._latest_epoch() + 1
        self.log.maybe_assign_epoch_start_offset(epoch, self.leo)
        self._model_assign(epoch, self.leo)

    @rule(flush=st.booleans())
    def reopen(self, flush: bool) -> None:
        if flush:
            self.log.flush()
        rp = self.log.recovery_point
        self.log.close()
        self.log = Log.open(self.tmp / "m-0", self.config, self.clock, recovery_point=rp,
                            log_start_offset=self.start)
        assert_indexes_match_scan(self.log)

    @precondition(lambda self: bool(self.batches))
    @rule(data=st.data())
    def by_timestamp(self, data: st.DataObject) -> None:
        live = [b for b in self.batches if b.last >= self.start]
        if not live:
            return
        b = data.draw(st.sampled_from(live))
        found = self.log.fetch_offset_by_timestamp(b.first_ts)
        # records are built with increasing timestamps, so the first at or after ts is the batch's first
        expected = max(b.base, self.start)
        assert found == TimestampOffset(b.first_ts + (expected - b.base), expected, b.epoch)

    # ---- invariants -------------------------------------------------------------------------------------------
    @invariant()
    def agrees(self) -> None:
        log = self.log
        assert (log.log_end_offset, log.log_start_offset) == (self.leo, self.start)
        assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == self.epochs
        for epoch in range(-1, self._latest_epoch() + 2):
            assert log.end_offset_for_epoch(epoch) == self._end_offset_for(epoch)
        data = b""
        pos = self.start
        while pos < self.leo:
            got = log.read(pos, 1 << 20).records
            if not got:
                break
            data += got
            pos = list(iter_batches(got))[-1][1].next_offset
        assert data == b"".join(b.data for b in self.batches if b.last >= self.start)

    def _end_offset_for(self, epoch: int) -> tuple[int, int]:
        if epoch < 0 or not self.epochs:
            return -1, -1
        if self.epochs[-1][0] == epoch:
            return epoch, self.leo
        older = [(e, s) for e, s in self.epochs if e <= epoch]
        newer = [(e, s) for e, s in self.epochs if e > epoch]
        if not newer:
            return -1, -1
        if not older:
            return epoch, newer[0][1]
        return older[-1][0], newer[0][1]


LogMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestLogModel = LogMachine.TestCase


class LogMachineSoak(LogMachine):
    pass


LogMachineSoak.TestCase.settings = settings(max_examples=1000, stateful_step_count=60, deadline=None)
TestLogModelSoak = pytest.mark.slow(pytest.mark.timeout(1800)(LogMachineSoak.TestCase))
