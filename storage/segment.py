"""One log segment: ``<base>.log`` plus its sparse ``.index`` and ``.timeindex``.

Files are named by the 20-digit base offset, the offset of the segment's first
batch. The ``.log`` file is the concatenation of record batches (see
``storage.record_batch``), appended through one ``O_APPEND`` descriptor with
``os.writev`` and read with ``os.pread``. Index formats and the rule for which
batches are indexed: ``storage.index``.

In memory a segment keeps its size, next offset, both indexes and the running
maximum timestamp, so an append touches no file but the ``.log`` and a read
costs one bisect, at most a short header scan and one ``os.pread``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from storage import index as ix
from storage.index import IndexRule, SparseIndex
from storage.record_batch import (
    HEADER_SIZE,
    MIN_BATCH_LENGTH,
    BatchHeader,
    InvalidBatchError,
    check_frame,
    decode_records,
    parse_header,
)

SCAN_CHUNK_BYTES = 64 * 1024
EpochLookup = Callable[[int], int | None]


@dataclass(frozen=True, slots=True)
class BatchMeta:
    """What the segment needs to know about one batch it appends."""

    base_offset: int
    size: int
    max_timestamp: int
    next_offset: int


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    valid_bytes: int
    truncated_bytes: int
    batches: int
    reason: str | None


def log_path(dir: Path, base: int) -> Path:
    return dir / f"{base:020d}.log"


class LogSegment:
    def __init__(self, dir: Path, base_offset: int, fd: int, index_interval_bytes: int, created_ms: int) -> None:
        self.dir = dir
        self.base_offset = base_offset
        self.fd = fd
        self.index_interval_bytes = index_interval_bytes
        self.created_ms = created_ms
        self.size = 0
        self.next_offset = base_offset
        self.offsets = SparseIndex()
        self.times = SparseIndex()
        self.rule = IndexRule(index_interval_bytes)
        self.first_batch_timestamp: int | None = None
        self.unflushed = False

    # ---- opening -------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, dir: Path, base: int, index_interval_bytes: int, now_ms: int) -> LogSegment:
        for path in (ix.offset_index_path(dir, base), ix.time_index_path(dir, base)):
            path.unlink(missing_ok=True)
        fd = os.open(log_path(dir, base), os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        return cls(dir, base, fd, index_interval_bytes, now_ms)

    @classmethod
    def open_existing(cls, dir: Path, base: int, index_interval_bytes: int, now_ms: int) -> LogSegment:
        """Open without validating batches; load indexes, rebuilding them if they fail the checks."""
        fd = os.open(log_path(dir, base), os.O_RDWR | os.O_APPEND)
        seg = cls(dir, base, fd, index_interval_bytes, now_ms)
        seg.size = os.fstat(fd).st_size
        offsets = ix.load_offset_index(ix.offset_index_path(dir, base), base, seg.size)
        times = ix.load_time_index(ix.time_index_path(dir, base), base, offsets) if offsets is not None else None
        if offsets is None or times is None or not seg._last_entry_ok(offsets):
            seg.rebuild_indexes()
        else:
            seg.offsets, seg.times = offsets, times
            seg.reload_tail()
        return seg

    def _last_entry_ok(self, offsets: SparseIndex) -> bool:
        if not offsets:
            return True
        try:
            header = self.header_at(offsets.values[-1])
        except InvalidBatchError:
            return False
        return header.base_offset == offsets.keys[-1]

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from a header scan (no CRC) and rewrite the files."""
        self.offsets, self.times, self.rule = SparseIndex(), SparseIndex(), IndexRule(self.index_interval_bytes)
        self.next_offset = self.base_offset
        for pos, h in self.scan(0):
            self.rule.on_batch(self.offsets, self.times, h.base_offset, pos, h.size, h.max_timestamp)
            self.next_offset = h.next_offset
        self.first_batch_timestamp = self.header_at(0).max_timestamp if self.size else None
        self.persist_indexes(fsync=False)

    def reload_tail(self) -> None:
        """Next offset, running max timestamp and index spacing from a scan after the last index entry."""
        start = self.offsets.values[-1] if self.offsets else 0
        next_offset = self.offsets.keys[-1] if self.offsets else self.base_offset
        max_ts = self.times.keys[-1] if self.times else ix.NO_TIMESTAMP
        for _, h in self.scan(start):
            next_offset = h.next_offset
            max_ts = max(max_ts, h.max_timestamp)
        self.next_offset = next_offset if self.size else self.base_offset
        self.rule = IndexRule(self.index_interval_bytes, self.size - start, max_ts)
        self.first_batch_timestamp = self.header_at(0).max_timestamp if self.size else None

    def recover(self, epoch_of: EpochLookup | None = None) -> RecoveryResult:
        """Validate every batch (length, magic, CRC, count, offset continuity, epoch); cut the rest.

        ``epoch_of(offset)`` is the leader epoch the epoch cache says covers
        ``offset`` (None when unknown): base_offset and partition_leader_epoch
        are outside the CRC, so continuity and the epoch cache guard them.
        """
        size = os.fstat(self.fd).st_size
        self.offsets, self.times, self.rule = SparseIndex(), SparseIndex(), IndexRule(self.index_interval_bytes)
        pos, count, expected, reason = 0, 0, self.base_offset, None
        if size:
            with mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) as mm:
                while pos < size:
                    reason = _check(mm, pos, expected, epoch_of)
                    if reason is not None:
                        break
                    h = parse_header(mm, pos)
                    self.rule.on_batch(self.offsets, self.times, h.base_offset, pos, h.size, h.max_timestamp)
                    pos += h.size
                    expected = h.next_offset
                    count += 1
        if pos < size:
            os.ftruncate(self.fd, pos)
            os.fsync(self.fd)
        self.size = pos
        self.next_offset = expected
        self.first_batch_timestamp = self.header_at(0).max_timestamp if pos else None
        self.persist_indexes(fsync=True)
        return RecoveryResult(pos, size - pos, count, reason)

    # ---- appending -----------------------------------------------------------------------------------------
    def should_roll(self, append_bytes: int, max_timestamp: int, now_ms: int, segment_bytes: int,
                    segment_ms: int, last_offset: int) -> bool:
        """Kafka's ``LogSegment.shouldRoll``: size, age (by first batch timestamp) or offset overflow."""
        if self.size == 0:
            return False
        if self.size > segment_bytes - append_bytes:
            return True
        if self.first_batch_timestamp is not None and self.first_batch_timestamp >= 0:
            waited = max_timestamp - self.first_batch_timestamp
        else:
            waited = now_ms - self.created_ms
        return waited > segment_ms or last_offset - self.base_offset > 0xFFFFFFFF

    def append(self, chunks: Sequence[bytes | memoryview], nbytes: int, metas: Sequence[BatchMeta]) -> None:
        """Write the batches (already stamped or copied) and index them in memory."""
        write_all(self.fd, chunks, nbytes, self.size)
        pos = self.size
        rule, offsets, times = self.rule, self.offsets, self.times
        for m in metas:
            rule.on_batch(offsets, times, m.base_offset, pos, m.size, m.max_timestamp)
            pos += m.size
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = metas[0].max_timestamp
        self.size = pos
        self.next_offset = metas[-1].next_offset
        self.unflushed = True

    # ---- reading -------------------------------------------------------------------------------------------
    def header_at(self, pos: int) -> BatchHeader:
        return parse_header(os.pread(self.fd, HEADER_SIZE, pos))

    def scan(self, start: int, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of whole batches in [start, end), reading 64 KiB at a time."""
        stop = self.size if end is None else end
        pos = start
        while pos < stop:
            chunk = os.pread(self.fd, min(SCAN_CHUNK_BYTES, stop - pos), pos)
            off = 0
            while len(chunk) - off >= HEADER_SIZE:
                h = parse_header(chunk, off)
                if h.batch_length < MIN_BATCH_LENGTH or pos + off + h.size > stop:
                    return
                yield pos + off, h
                off += h.size
            if off == 0:
                return
            pos += off

    def position_of(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The batch holding ``offset`` or the first after it."""
        i = self.offsets.floor(offset)
        start = self.offsets.values[i] if i >= 0 else 0
        for pos, h in self.scan(start):
            if h.last_offset >= offset:
                return pos, h
        return None

    def read(self, start: int, max_bytes: int, limit: int, min_one_batch: bool) -> bytes | None:
        """Whole batches from the one holding ``start``: at most ``max_bytes`` (but one if
        ``min_one_batch``), none reaching ``limit`` (exclusive). None if no batch here holds
        ``start`` or later; b"" if the first batch does not fit."""
        if start >= self.next_offset:
            return None
        offsets = self.offsets
        i = offsets.floor(start)
        first_pos = offsets.values[i] if i >= 0 else 0
        budget = first_pos + max_bytes
        if self.size <= budget and self.next_offset <= limit:
            end = self.size
        else:
            j = min(bisect_right_values(offsets, budget), offsets.floor(limit))
            end = offsets.values[j] if j > i else -1
        if end > first_pos:
            data = os.pread(self.fd, end - first_pos, first_pos)
            h = parse_header(data)
            if h.last_offset >= start:
                return data
            return _skip_to(data, start)
        return self._read_slow(start, first_pos, max_bytes, limit, min_one_batch)

    def _read_slow(self, start: int, from_pos: int, max_bytes: int, limit: int, min_one_batch: bool) -> bytes:
        first = -1
        end = -1
        for pos, h in self.scan(from_pos):
            if first < 0:
                if h.last_offset < start:
                    continue
                if h.next_offset > limit or (h.size > max_bytes and not min_one_batch):
                    return b""
                first = pos
            elif h.next_offset > limit or pos + h.size - first > max_bytes:
                break
            end = pos + h.size
        return os.pread(self.fd, end - first, first) if first >= 0 else b""

    def find_timestamp(self, ts: int, min_offset: int = 0) -> tuple[int, int, int] | None:
        """(timestamp, offset, leader_epoch) of the first record at or after ``min_offset`` with timestamp >= ts."""
        i = self.times.floor(ts - 1)
        from_offset = self.times.values[i] if i >= 0 else self.base_offset
        j = self.offsets.floor(from_offset)
        for pos, h in self.scan(self.offsets.values[j] if j >= 0 else 0):
            if h.max_timestamp < ts or h.last_offset < min_offset:
                continue
            data = os.pread(self.fd, h.size, pos)
            for r in decode_records(data):
                if h.first_timestamp + r.timestamp_delta >= ts and h.base_offset + r.offset_delta >= min_offset:
                    return h.first_timestamp + r.timestamp_delta, h.base_offset + r.offset_delta, \
                        h.partition_leader_epoch
        return None

    # ---- truncation, flush, close --------------------------------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Drop the batch holding ``offset`` and everything after; returns bytes removed."""
        found = self.position_of(offset)
        if found is None:
            return 0
        pos = found[0]
        removed = self.size - pos
        os.ftruncate(self.fd, pos)
        self.size = pos
        self.offsets.truncate_values_from(pos)
        self.times.truncate_count(len([o for o in self.times.values if o < found[1].base_offset]))
        self.reload_tail()
        self.persist_indexes(fsync=False)
        return removed

    def persist_indexes(self, *, fsync: bool) -> None:
        base = self.base_offset
        if self.offsets.persisted != len(self.offsets) or fsync or not self._index_files_exist():
            ix.persist(ix.offset_index_path(self.dir, base), self.offsets,
                       ix.encode_offset_entries(self.offsets, base, self.offsets.persisted),
                       ix.OFFSET_ENTRY.size, fsync=fsync)
        if self.times.persisted != len(self.times) or fsync or not self._index_files_exist():
            ix.persist(ix.time_index_path(self.dir, base), self.times,
                       ix.encode_time_entries(self.times, base, self.times.persisted),
                       ix.TIME_ENTRY.size, fsync=fsync)

    def _index_files_exist(self) -> bool:
        return ix.offset_index_path(self.dir, self.base_offset).exists() and \
            ix.time_index_path(self.dir, self.base_offset).exists()

    def flush(self) -> None:
        os.fsync(self.fd)
        self.persist_indexes(fsync=True)
        self.unflushed = False

    def close(self) -> None:
        if self.fd >= 0:
            self.persist_indexes(fsync=False)
            os.close(self.fd)
            self.fd = -1

    def delete(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        for path in (log_path(self.dir, self.base_offset), ix.offset_index_path(self.dir, self.base_offset),
                     ix.time_index_path(self.dir, self.base_offset)):
            path.unlink(missing_ok=True)


def bisect_right_values(idx: SparseIndex, value: int) -> int:
    """Index of the last entry with position <= value, or -1."""
    return bisect_right(idx.values, value) - 1


def _skip_to(data: bytes, start: int) -> bytes:
    pos = 0
    while pos < len(data):
        h = parse_header(data, pos)
        if h.last_offset >= start:
            return data[pos:]
        pos += h.size
    return b""


def _check(buf: mmap.mmap, pos: int, expected: int, epoch_of: EpochLookup | None) -> str | None:
    try:
        h = check_frame(buf, pos)
    except InvalidBatchError as exc:
        return f"{type(exc).__name__}: {exc}"
    if h.base_offset != expected:
        return f"batch at {pos}: base_offset {h.base_offset}, expected {expected}"
    if epoch_of is not None:
        want = epoch_of(h.base_offset)
        if want is not None and h.partition_leader_epoch != want:
            return f"batch at {pos}: leader epoch {h.partition_leader_epoch}, epoch cache says {want}"
    return None


def write_all(fd: int, chunks: Sequence[bytes | memoryview], nbytes: int, old_size: int) -> None:
    """Write every byte or none: a short or failed write is cut back to ``old_size`` and raised."""
    try:
        written = os.writev(fd, chunks) if len(chunks) <= 512 else os.write(fd, b"".join(chunks))
        if written < nbytes:
            rest = b"".join(chunks)[written:]
            while rest:
                n = os.write(fd, rest)
                rest = rest[n:]
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, old_size)
        raise
