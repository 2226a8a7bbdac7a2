"""Independent checks used by the crash and model tests: a full scan of a segment file."""

from __future__ import annotations

from pathlib import Path

from storage import index as ix
from storage.index import IndexRule, SparseIndex
from storage.log import Log
from storage.record_batch import check_frame


def scan_indexes(path: Path, base: int, interval: int) -> tuple[SparseIndex, SparseIndex, int]:
    """Indexes a full validating scan of ``path`` produces, and the number of valid bytes."""
    data = path.read_bytes()
    offsets, times, rule = SparseIndex(), SparseIndex(), IndexRule(interval)
    pos = 0
    while pos < len(data):
        h = check_frame(data, pos)
        rule.on_batch(offsets, times, h.base_offset, pos, h.size, h.max_timestamp)
        pos += h.size
    return offsets, times, pos


def assert_indexes_match_scan(log: Log) -> None:
    for seg in log.segments:
        path = seg.dir / f"{seg.base_offset:020d}.log"
        offsets, times, valid = scan_indexes(path, seg.base_offset, seg.index_interval_bytes)
        assert valid == seg.size == path.stat().st_size
        assert (seg.offsets.keys, seg.offsets.values) == (offsets.keys, offsets.values)
        assert (seg.times.keys, seg.times.values) == (times.keys, times.values)
        seg.persist_indexes(fsync=False)
        disk = ix.load_offset_index(ix.offset_index_path(seg.dir, seg.base_offset), seg.base_offset, seg.size)
        assert disk is not None and disk.keys == offsets.keys and disk.values == offsets.values
