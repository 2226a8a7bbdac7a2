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
import struct
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.clock import Clock
from storage import index as ix
from storage.epoch_cache import LeaderEpochCache
from storage.index import IndexRule, SparseIndex
from storage.record_batch import (
    HEADER_SIZE,
    MAGIC,
    MIN_BATCH_LENGTH,
    BatchHeader,
    InvalidBatchError,
    check_frame,
    decode_records,
    parse_header,
    record_timestamp,
)

SCAN_CHUNK_BYTES = 8 * 1024


BatchMeta = tuple[int, int, int, int]
"""What a segment needs to know about a batch it appends: (base_offset, size, max_timestamp, next_offset).
A plain tuple: the append path is per batch and a dataclass costs a microsecond."""


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    valid_bytes: int
    truncated_bytes: int
    batches: int
    reason: str | None
    # base offset of the first validated batch whose leader epoch is not the one the epoch cache gives for
    # it (None: all agree, or no cache given): the cache, not the batch, is then wrong (see ``recover``)
    epoch_mismatch: int | None = None
    last_epoch: int = -1  # leader epoch of the last batch kept (the ``prev_epoch`` given if none)


def log_path(dir: Path, base: int) -> Path:
    return dir / f"{base:020d}.log"


def segment_base(name: str) -> int | None:
    """The base offset of a segment file named ``<20 digits>.log``, else None."""
    stem, dot, ext = name.partition(".")
    if dot and ext == "log" and len(stem) == 20 and stem.isascii() and stem.isdigit():
        return int(stem)
    return None


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

    def largest_timestamp_ms(self) -> int:
        """Kafka's ``LogSegment.largestTimestamp``: the largest batch timestamp, or the file's last
        modification time when no batch carries one (-1, which a client may send): time-based retention
        would otherwise take the segment for 55 years old and delete it at its first check."""
        if self.rule.max_timestamp >= 0:
            return self.rule.max_timestamp
        return os.fstat(self.fd).st_mtime_ns // 1_000_000

    # ---- opening -------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, dir: Path, base: int, index_interval_bytes: int, now_ms: int) -> LogSegment:
        for path in (ix.offset_index_path(dir, base), ix.time_index_path(dir, base)):
            path.unlink(missing_ok=True)
        fd = os.open(log_path(dir, base), os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        return cls(dir, base, fd, index_interval_bytes, now_ms)

    @classmethod
    def open_existing(cls, dir: Path, base: int, index_interval_bytes: int, now_ms: int,
                      epochs: LeaderEpochCache | None = None,
                      prev_epoch: Callable[[], int] | None = None) -> tuple[LogSegment, RecoveryResult | None]:
        """Open a segment below the recovery point without validating its batches, trusting its
        indexes if they pass the sanity checks (sorted, in range, last entry points at a batch with
        that offset, the tail after it parses to the end of the file). Otherwise the segment is
        recovered like one past the recovery point, which rebuilds the indexes; that result is returned
        (``prev_epoch()``: the leader epoch of the batch before the segment, asked only then)."""
        fd = os.open(log_path(dir, base), os.O_RDWR | os.O_APPEND)
        seg = cls(dir, base, fd, index_interval_bytes, now_ms)
        try:
            seg.size = os.fstat(fd).st_size
            offsets = ix.load_offset_index(ix.offset_index_path(dir, base), base, seg.size)
            times = ix.load_time_index(ix.time_index_path(dir, base), base, offsets) if offsets is not None else None
            if offsets is not None and times is not None and seg._last_entry_ok(offsets):
                seg.offsets, seg.times = offsets, times
                if seg.reload_tail():
                    return seg, None
            return seg, seg.recover(epochs, prev_epoch=prev_epoch() if prev_epoch is not None else -1)
        except BaseException:
            os.close(fd)
            raise

    def _last_entry_ok(self, offsets: SparseIndex) -> bool:
        if not offsets:
            return True
        try:
            header = self.header_at(offsets.values[-1])
        except InvalidBatchError:
            return False
        return header.base_offset == offsets.keys[-1]

    def reload_tail(self, *, check_headers: bool = True) -> bool:
        """Next offset, running max timestamp and index spacing from a header scan after the last
        index entry; False if the scan does not end exactly at the end of the file, or (``check_headers``,
        at open) a header there is not one (magic, record count against last offset delta, offsets
        following on): a batch whose bytes after its first 16 went bad was taken for whole, the log's end
        put inside it."""
        start = self.offsets.values[-1] if self.offsets else 0
        next_offset = self.offsets.keys[-1] if self.offsets else self.base_offset
        max_ts = self.times.keys[-1] if self.times else ix.NO_TIMESTAMP
        end = start
        for pos, h in self.scan(start):
            if check_headers and (h.base_offset != next_offset or not _plausible(h)):
                return False
            next_offset = h.next_offset
            max_ts = max(max_ts, h.max_timestamp)
            end = pos + h.size
        if end != self.size:
            return False
        self.next_offset = next_offset if self.size else self.base_offset
        self.rule = IndexRule(self.index_interval_bytes, self.size - start, max_ts)
        self.first_batch_timestamp = self.header_at(0).max_timestamp if self.size else None
        return True

    def recover(self, epochs: LeaderEpochCache | None = None, from_offset: int | None = None,
                prev_epoch: int = -1) -> RecoveryResult:
        """Validate every batch (length, magic, CRC, count, offset continuity, epoch); cut the rest.

        base_offset and partition_leader_epoch are outside the CRC: offset continuity guards the first,
        ``epoch_cut`` the second (``prev_epoch``: the leader epoch of the batch before the segment, -1 if
        unknown; ``epochs``: the epoch cache as loaded, None to check the order only). A batch whose epoch
        only disagrees with the cache is kept and reported (``epoch_mismatch``) for the caller to heal the
        cache, as Kafka's recovery does.

        With ``from_offset`` (the recovery point) the batches below it are on
        disk already and trusted: the indexes are loaded (if they pass the sanity
        checks; else everything is validated), a header scan from the last index
        entry finds the first batch at or past ``from_offset``, and only the
        batches from there on are validated.
        """
        size = os.fstat(self.fd).st_size
        self.size = size
        pos, expected = 0, self.base_offset
        self.offsets, self.times, self.rule = SparseIndex(), SparseIndex(), IndexRule(self.index_interval_bytes)
        if from_offset is not None and from_offset > self.base_offset:
            trusted = self._trusted_prefix(from_offset)
            if trusted is not None:
                pos, expected, prev_epoch = trusted[0], trusted[1], max(prev_epoch, trusted[2])
        start, start_expected = pos, expected
        found: list[BatchHeader] = []  # the batches that pass the frame and offset checks, in order
        reason = None
        if size:
            with mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) as mm:
                while pos < size:
                    reason = _check(mm, pos, expected)
                    if reason is not None:
                        break
                    h = parse_header(mm, pos)
                    found.append(h)
                    pos += h.size
                    expected = h.next_offset
        keep, epoch_reason, mismatch = epoch_cut([h.partition_leader_epoch for h in found],
                                                 [h.base_offset for h in found], prev_epoch, epochs)
        pos, expected = start, start_expected
        for h in found[:keep]:
            self.rule.on_batch(self.offsets, self.times, h.base_offset, pos, h.size, h.max_timestamp)
            pos += h.size
            expected = h.next_offset
            prev_epoch = h.partition_leader_epoch
        if keep < len(found):
            reason = f"batch at {pos}: {epoch_reason}"
        if pos < size:
            os.ftruncate(self.fd, pos)
            os.fsync(self.fd)
        self.size = pos
        self.next_offset = expected
        self.first_batch_timestamp = self.header_at(0).max_timestamp if pos else None
        self.persist_indexes(fsync=True)
        return RecoveryResult(pos, size - pos, keep, reason, mismatch, prev_epoch)

    def _trusted_prefix(self, from_offset: int) -> tuple[int, int, int] | None:
        """Load the indexes and skip the batches below ``from_offset``: (position, next offset, leader epoch
        of the batch before) where validation starts (-1: epoch unknown), with the index state set as
        appends left it there; None to validate all."""
        base = self.base_offset
        offsets = ix.load_offset_index(ix.offset_index_path(self.dir, base), base, self.size)
        times = ix.load_time_index(ix.time_index_path(self.dir, base), base, offsets) if offsets is not None else None
        if offsets is None or times is None:
            return None
        offsets.truncate_keys_from(from_offset)
        times.truncate_values_from(from_offset)
        if not self._last_entry_ok(offsets):
            return None
        start = offsets.values[-1] if offsets else 0
        pos, expected = start, (offsets.keys[-1] if offsets else base)
        max_ts = times.keys[-1] if times else ix.NO_TIMESTAMP
        epoch = -1
        for p, h in self.scan(start):
            if h.base_offset >= from_offset or h.base_offset != expected or not _plausible(h):
                break  # validated from here: a header gone bad after its length field is caught there
            max_ts = max(max_ts, h.max_timestamp)
            pos, expected, epoch = p + h.size, h.next_offset, h.partition_leader_epoch
        self.offsets, self.times = offsets, times
        self.rule = IndexRule(self.index_interval_bytes, pos - start, max_ts)
        return pos, expected, epoch

    # ---- appending -----------------------------------------------------------------------------------------
    def should_roll(self, append_bytes: int, max_timestamp: int, clock: Clock, segment_bytes: int,
                    segment_ms: int, last_offset: int) -> bool:
        """Kafka's ``LogSegment.shouldRoll``: size, age (by first batch timestamp) or offset overflow."""
        if self.size == 0:
            return False
        if self.size > segment_bytes - append_bytes or last_offset - self.base_offset > 0xFFFFFFFF:
            return True
        first_ts = self.first_batch_timestamp
        if first_ts is not None and first_ts >= 0:
            return max_timestamp - first_ts > segment_ms
        return clock.now_ms() - self.created_ms > segment_ms

    def append(self, chunks: Sequence[bytes | memoryview], nbytes: int, metas: Sequence[BatchMeta]) -> None:
        """Write the batches (already stamped or copied) and index them in memory."""
        try:
            written = os.writev(self.fd, chunks) if len(chunks) <= 512 else os.write(self.fd, b"".join(chunks))
            if written != nbytes:
                _write_rest(self.fd, b"".join(chunks)[written:])
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)  # all or nothing
            raise
        pos = self.size
        for base, size, max_ts, _ in metas:
            self.rule.on_batch(self.offsets, self.times, base, pos, size, max_ts)
            pos += size
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = metas[0][2]
        self.size = pos
        self.next_offset = metas[-1][3]
        self.unflushed = True

    def append_one(self, prefix: bytes, rest: memoryview, nbytes: int, base_offset: int, max_ts: int) -> None:
        """``append`` for one batch written as a stamped prefix plus the rest (the leader's hot path);
        the caller sets ``next_offset``."""
        pos = self.size
        try:
            written = os.writev(self.fd, (prefix, rest))
            if written != nbytes:
                _write_rest(self.fd, (prefix + bytes(rest))[written:])
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, pos)
            raise
        rule = self.rule  # IndexRule.on_batch, inlined (this is the per-batch hot path)
        if max_ts > rule.max_timestamp:
            rule.max_timestamp = max_ts
        if rule.bytes_since_entry > rule.interval_bytes:
            self.offsets.keys.append(base_offset)
            self.offsets.values.append(pos)
            times = self.times.keys
            if rule.max_timestamp > (times[-1] if times else ix.NO_TIMESTAMP):
                times.append(rule.max_timestamp)
                self.times.values.append(base_offset)
            rule.bytes_since_entry = nbytes
        else:
            rule.bytes_since_entry += nbytes
        self.size = pos + nbytes
        self.unflushed = True

    # ---- reading -------------------------------------------------------------------------------------------
    def header_at(self, pos: int) -> BatchHeader:
        return parse_header(os.pread(self.fd, HEADER_SIZE, pos))

    def scan(self, start: int, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of whole batches in [start, end), reading 8 KiB at a time."""
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

    def last_epoch(self) -> int:
        """The leader epoch of the last batch (-1 when empty): a scan from the last index entry."""
        found = self.position_of(self.next_offset - 1) if self.size else None
        return found[1].partition_leader_epoch if found is not None else -1

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
        ``start`` or later (an empty segment has none, whatever ``start``); b"" if the first batch does not fit."""
        if start >= self.next_offset or not self.size:
            return None
        offsets = self.offsets
        positions = offsets.values
        i = bisect_right(offsets.keys, start) - 1
        first_pos = positions[i] if i >= 0 else 0
        budget = first_pos + max_bytes
        if self.size <= budget and self.next_offset <= limit:
            end = self.size
        elif i + 1 < len(positions) and positions[i + 1] > budget:
            end = -1  # not even the next index entry fits: the region path below
        else:
            j = min(bisect_right(positions, budget), bisect_right(offsets.keys, limit)) - 1
            end = positions[j] if j > i else -1
        if end > first_pos:
            data = os.pread(self.fd, end - first_pos, first_pos)
            if _BASE_LEN.unpack_from(data)[0] + _LAST_DELTA.unpack_from(data, 23)[0] >= start:
                return data  # the common case: no copy, no scan
            first, end = _walk(data, start, len(data), limit, True)
            return data[first:end] if first >= 0 else b""
        # No index entry after the first fits: the batch holding ``start`` lies in the region up to the
        # next entry (or the end); read that region once and walk its headers in memory.
        region_end = offsets.values[i + 1] if i + 1 < len(offsets) else self.size
        region = os.pread(self.fd, region_end - first_pos, first_pos)
        if min_one_batch and len(region) >= HEADER_SIZE:  # the region is often exactly one batch
            base, length = _BASE_LEN.unpack_from(region)
            next_offset = base + _LAST_DELTA.unpack_from(region, 23)[0] + 1
            if length + 12 == len(region) and start < next_offset <= limit:
                return region
        first, end = _walk(region, start, max_bytes, limit, min_one_batch)
        if first < 0:
            return b""
        return region if first == 0 and end == len(region) else region[first:end]

    def max_timestamp_from(self, min_offset: int) -> int | None:
        """The largest timestamp of the records at or after ``min_offset``; None when there are none. The
        running maximum when the whole segment counts; else the records of the batch holding ``min_offset``
        (its max timestamp may be a record's below it) and the headers of the batches after it."""
        if min_offset <= self.base_offset:
            return self.rule.max_timestamp if self.size else None
        found = self.position_of(min_offset)
        if found is None:
            return None
        pos, first = found
        tops = [h.max_timestamp for _, h in self.scan(pos + first.size)]
        if first.base_offset >= min_offset:
            tops.append(first.max_timestamp)
        else:
            try:
                records = decode_records(os.pread(self.fd, first.size, pos))
            except InvalidBatchError:
                records = []  # as find_timestamp: such a batch counts by its header
                tops.append(first.max_timestamp)
            tops += [record_timestamp(first, r) for r in records if first.base_offset + r.offset_delta >= min_offset]
        return max(tops, default=None)

    def find_timestamp(self, ts: int, min_offset: int = 0) -> tuple[int, int, int] | None:
        """(timestamp, offset, leader_epoch) of the first record at or after ``min_offset`` with timestamp >= ts."""
        i = self.times.floor(ts - 1)
        from_offset = self.times.values[i] if i >= 0 else self.base_offset
        j = self.offsets.floor(from_offset)
        for pos, h in self.scan(self.offsets.values[j] if j >= 0 else 0):
            if h.max_timestamp < ts or h.last_offset < min_offset:
                continue
            data = os.pread(self.fd, h.size, pos)
            try:
                records = decode_records(data)
            except InvalidBatchError:
                # Records that pass the produce path's frame checks (CRC, count) but do not decode: the
                # batch's header says it reaches ts, so its first offset is the answer, and a consumer
                # starting there gets the batch's CorruptRecordError rather than this lookup failing.
                return h.max_timestamp, max(h.base_offset, min_offset), h.partition_leader_epoch
            for r in records:
                found = record_timestamp(h, r)
                if found >= ts and h.base_offset + r.offset_delta >= min_offset:
                    return found, h.base_offset + r.offset_delta, h.partition_leader_epoch
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
        # the batches kept are not judged here (a batch gone bad below the cut stays, as in Kafka, whose
        # truncation reads nothing): the tail's headers are read for the index state only
        self.reload_tail(check_headers=False)
        self.persist_indexes(fsync=False)
        return removed

    def persist_indexes(self, *, fsync: bool) -> None:
        base = self.base_offset
        if self.offsets.dirty or fsync or not self._index_files_exist():
            ix.persist(ix.offset_index_path(self.dir, base), self.offsets,
                       ix.encode_offset_entries(self.offsets, base, self.offsets.persisted),
                       ix.OFFSET_ENTRY.size, fsync=fsync)
        if self.times.dirty or fsync or not self._index_files_exist():
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

    def delete(self, *, defer: bool = False) -> list[Path]:
        """Remove the files; with ``defer`` only rename them to ``*.deleted`` (cheap) and return
        them for a worker thread to unlink (freeing a large file's blocks can take a while).
        ``*.deleted`` leftovers are removed when the log is next opened."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        renamed = []
        for path in (log_path(self.dir, self.base_offset), ix.offset_index_path(self.dir, self.base_offset),
                     ix.time_index_path(self.dir, self.base_offset)):
            if not defer:
                path.unlink(missing_ok=True)
                continue
            target = path.with_name(path.name + ".deleted")
            with contextlib.suppress(FileNotFoundError):
                path.rename(target)
                renamed.append(target)
        return renamed


_BASE_LEN = struct.Struct(">qi")
_LAST_DELTA = struct.Struct(">i")


def _walk(buf: bytes, start: int, max_bytes: int, limit: int, min_one_batch: bool) -> tuple[int, int]:
    """[first, end) of the whole batches in ``buf`` to return for a read; (-1, -1) if none."""
    pos, n, first, end = 0, len(buf), -1, -1
    while n - pos >= HEADER_SIZE:
        base, length = _BASE_LEN.unpack_from(buf, pos)
        size = length + 12
        if length < MIN_BATCH_LENGTH or pos + size > n:
            break
        next_offset = base + _LAST_DELTA.unpack_from(buf, pos + 23)[0] + 1
        if first < 0:
            if next_offset <= start:
                pos += size
                continue
            if next_offset > limit or (size > max_bytes and not min_one_batch):
                return -1, -1
            first = pos
        elif next_offset > limit or pos + size - first > max_bytes:
            break
        end = pos + size
        pos += size
    return first, end


def _plausible(h: BatchHeader) -> bool:
    """The header fields a scan can check besides the length (the CRC needs the whole batch): magic 2, and a
    record count that matches the last offset delta."""
    return h.magic == MAGIC and h.record_count >= 1 and h.last_offset_delta == h.record_count - 1


def _check(buf: mmap.mmap, pos: int, expected: int) -> str | None:
    try:
        h = check_frame(buf, pos)
    except InvalidBatchError as exc:
        return f"{type(exc).__name__}: {exc}"
    if h.base_offset != expected:
        return f"batch at {pos}: base_offset {h.base_offset}, expected {expected}"
    return None


def epoch_cut(batch_epochs: Sequence[int], bases: Sequence[int], prev_epoch: int,
              epochs: LeaderEpochCache | None) -> tuple[int, str | None, int | None]:
    """How many of the validated batches (their leader epochs and base offsets, in log order, each
    already past the CRC and offset checks) to keep, why the next one is cut, and the base offset of
    the first kept batch whose epoch the cache has wrong (None: all agree). Pure.

    The leader epoch is outside the CRC. Three rules, the first two cutting:

    1. Order: epochs never decrease along a log (the appends refuse it), so a batch below the one before
       it (``prev_epoch`` for the first) is damage, or batches a truncation removed that came back after
       a power loss because the cut was not on disk. It is cut, unless the batch before it is the odd one
       out (its own epoch against the cache, the cut one's agreeing): then that one goes (a damaged epoch
       raised above the next batch's).
    2. A new epoch: the cache (its checkpoint) is fsynced before the first batch of a new epoch is
       written (``Log._leader_epoch_check``, ``Log._follow_epochs``), so a batch with an epoch above every
       epoch the cache knows, where the cache agreed with every batch before it, is damage (this is what
       catches a damaged epoch in the last batch, which rule 1 cannot see).
    3. Any other disagreement with the cache is the cache's fault and cuts nothing: a damaged or stale
       checkpoint must not delete valid, CRC-checked data (a checkpoint saying ``5 14`` where epoch 5
       starts at 10 once cut offsets 10-19 here). Kafka's ``LogSegment.recover`` never cuts on epochs:
       it assigns each recovered batch's epoch to the cache, which heals it; the caller does that here
       (``Log._rebuild_epochs``) when a mismatch is returned. Rules 1 and 2 are this log's additions to
       Kafka, which leaves a damaged epoch in place; they never fire on a log the appends wrote.
    """
    latest = epochs.latest_epoch() if epochs is not None else None
    agreed = [_agrees(epochs, e, b) for e, b in zip(batch_epochs, bases, strict=True)]
    mismatch = None
    for i, epoch in enumerate(batch_epochs):
        before = batch_epochs[i - 1] if i else prev_epoch
        if epoch < before:
            if i and agreed[i] and not agreed[i - 1]:
                return i - 1, f"leader epoch {before} above the {epoch} after it, and not the cache's", \
                    _first_mismatch(agreed[:i - 1], bases)
            return i, f"leader epoch {epoch} below {before} before it", mismatch
        if latest is not None and epoch > latest and all(agreed[:i]):
            return i, f"leader epoch {epoch} above every epoch in the cache (latest {latest})", mismatch
        if mismatch is None and not agreed[i]:
            mismatch = bases[i]
    return len(batch_epochs), None, mismatch


def _agrees(epochs: LeaderEpochCache | None, epoch: int, base: int) -> bool:
    """Whether the cache says ``epoch`` covers ``base`` (True where it knows nothing: no cache, an unstamped
    batch, an offset below its first entry, which is the log start)."""
    want = epochs.epoch_for_offset(base) if epochs is not None and epoch >= 0 else None
    return want is None or want == epoch


def _first_mismatch(agreed: Sequence[bool], bases: Sequence[int]) -> int | None:
    return next((bases[i] for i, ok in enumerate(agreed) if not ok), None)


def _write_rest(fd: int, rest: bytes) -> None:
    while rest:
        rest = rest[os.write(fd, rest):]
