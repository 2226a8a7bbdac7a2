"""Sparse offset and time indexes of one segment.

On disk, like Kafka (big-endian, fixed-size entries, no header)::

    <base>.index      8 bytes/entry: relative offset uint32, file position uint32
    <base>.timeindex 12 bytes/entry: timestamp int64, relative offset uint32

Relative offset = offset - segment base offset. The entries live in memory
(Python lists, bisected on lookup); the ones not yet on disk are appended to
the file in bulk at flush, roll and close (``persist``), never per append.
Recovery rebuilds an index that is missing or inconsistent from a scan of the
log, so a crash that loses unpersisted entries loses nothing.

Which batches get entries (``IndexRule``, used by append and by rebuild, so a
rebuilt index equals the one appends made): an offset entry ``(base_offset,
position)`` for a batch when more than ``index.interval.bytes`` bytes were
appended since the previous entry (the first batch of a segment never gets
one: position 0 is implied); with it a time entry ``(max timestamp so far,
base_offset)`` if that timestamp is larger than the last time entry's. Every
batch up to and including that one has max_timestamp <= the entry's.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
NO_TIMESTAMP = -1


@dataclass(slots=True)
class SparseIndex:
    """(key, value) pairs with strictly increasing keys and values."""

    keys: list[int] = field(default_factory=list)
    values: list[int] = field(default_factory=list)
    persisted: int = 0  # entries already in the file
    file_longer: bool = False  # the file still holds entries truncated away here (persist cuts them)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def dirty(self) -> bool:
        """The file differs from the entries: new ones to append, or truncated ones to cut."""
        return self.persisted != len(self.keys) or self.file_longer

    def append(self, key: int, value: int) -> None:
        self.keys.append(key)
        self.values.append(value)

    def floor(self, key: int) -> int:
        """Index of the last entry with entry key <= key, or -1."""
        return bisect_right(self.keys, key) - 1

    def truncate_keys_from(self, key: int) -> None:
        """Drop entries with entry key >= key."""
        self.truncate_count(bisect_left(self.keys, key))

    def truncate_values_from(self, value: int) -> None:
        self.truncate_count(bisect_left(self.values, value))

    def truncate_count(self, n: int) -> None:
        del self.keys[n:]
        del self.values[n:]
        if n < self.persisted:
            self.persisted = n
            self.file_longer = True


def offset_index_path(dir: Path, base: int) -> Path:
    return dir / f"{base:020d}.index"


def time_index_path(dir: Path, base: int) -> Path:
    return dir / f"{base:020d}.timeindex"


def encode_offset_entries(idx: SparseIndex, base: int, start: int) -> bytes:
    return b"".join(OFFSET_ENTRY.pack(idx.keys[i] - base, idx.values[i]) for i in range(start, len(idx)))


def encode_time_entries(idx: SparseIndex, base: int, start: int) -> bytes:
    return b"".join(TIME_ENTRY.pack(idx.keys[i], idx.values[i] - base) for i in range(start, len(idx)))


def persist(path: Path, idx: SparseIndex, data: bytes, entry_size: int, *, fsync: bool) -> None:
    """Make the file hold exactly the in-memory entries (appending the new ones)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != idx.persisted * entry_size:
            os.ftruncate(fd, idx.persisted * entry_size)
        if data:
            os.pwrite(fd, data, idx.persisted * entry_size)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    idx.persisted = len(idx)
    idx.file_longer = False


def load_offset_index(path: Path, base: int, log_size: int) -> SparseIndex | None:
    """The entries, or None if the file is absent or fails the sanity checks."""
    raw = _read(path, OFFSET_ENTRY.size)
    if raw is None:
        return None
    idx = SparseIndex()
    for rel, pos in OFFSET_ENTRY.iter_unpack(raw):
        if (idx.keys and (base + rel <= idx.keys[-1] or pos <= idx.values[-1])) or pos >= log_size or pos == 0:
            return None
        idx.append(base + rel, pos)
    idx.persisted = len(idx)
    return idx


def load_time_index(path: Path, base: int, offsets: SparseIndex) -> SparseIndex | None:
    raw = _read(path, TIME_ENTRY.size)
    if raw is None:
        return None
    idx = SparseIndex()
    known = set(offsets.keys)
    for ts, rel in TIME_ENTRY.iter_unpack(raw):
        if (idx.keys and (ts <= idx.keys[-1] or base + rel <= idx.values[-1])) or base + rel not in known:
            return None
        idx.append(ts, base + rel)
    idx.persisted = len(idx)
    return idx


def _read(path: Path, entry_size: int) -> bytes | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return raw if len(raw) % entry_size == 0 else None


@dataclass(slots=True)
class IndexRule:
    """The per-batch indexing decision, shared by append and rebuild."""

    interval_bytes: int
    bytes_since_entry: int = 0
    max_timestamp: int = NO_TIMESTAMP

    def on_batch(self, offsets: SparseIndex, times: SparseIndex, base_offset: int, position: int,
                 size: int, max_timestamp: int) -> None:
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
        if self.bytes_since_entry > self.interval_bytes:
            offsets.append(base_offset, position)
            if self.max_timestamp > (times.keys[-1] if times.keys else NO_TIMESTAMP):
                times.append(self.max_timestamp, base_offset)
            self.bytes_since_entry = 0
        self.bytes_since_entry += size
