"""``minibroker dump-log``: one JSON line per batch of a ``.log`` file or a partition directory.

Each line: ``file``, ``position``, ``size``, ``base_offset``, ``last_offset``,
``record_count``, ``leader_epoch``, ``magic``, ``attributes``, ``crc``,
``first_timestamp``, ``max_timestamp``, ``producer_id``, ``producer_epoch``,
``base_sequence``, ``valid`` and, when invalid, ``error``. ``--records`` adds the
decoded records (``key``/``value`` as text when UTF-8, else ``key_b64``/``value_b64``).
A batch whose length is unusable ends the file's listing with a line that says
why; a batch that fails only its CRC or record checks is reported and skipped.

Offsets must run on without a hole or a step back: each valid batch's
``base_offset`` is the previous valid batch's ``last_offset`` + 1, within a file
and, for a partition directory, from one segment file to the next (files in
name order, which is base-offset order). A batch that breaks this carries
``"non_consecutive": {"after": <previous last_offset>}``, and ``dump`` returns
the pairs so the command can list them on stderr, as Kafka's DumpLogSegments
lists "X is followed by Y" (it checks within a file only; a hole between
segments here means a lost segment file, so it is reported too). This log has
no compaction, so a hole is never legitimate.
"""

from __future__ import annotations

import base64
import json
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from storage.record_batch import (
    HEADER_SIZE,
    MIN_BATCH_LENGTH,
    BatchHeader,
    InvalidBatchError,
    Record,
    decode_records,
    parse_header,
    record_timestamp,
    validate_batch,
)
from storage.segment import segment_base


class DumpError(Exception):
    """PATH is not a .log file or a directory holding them."""


def log_files(path: Path) -> list[Path]:
    """A segment file as given, or a directory's segment files in offset order: either way only files named
    ``<20-digit base offset>.log``, never other ``.log`` files such as a process log. Kafka's
    DumpLogSegments picks how to decode a file by its name; any other file here (a checkpoint, an index,
    a snapshot) would be read as batches and print made-up headers, or nothing at all with success."""
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if segment_base(p.name) is not None and p.is_file()),
                       key=lambda p: p.name)
        if not files:
            raise DumpError(f"{path}: no segment files (<20-digit base offset>.log) in this directory")
        return files
    if path.is_file():
        if segment_base(path.name) is None:
            raise DumpError(f"{path}: not a segment file (expected a name <20-digit base offset>.log, "
                            f"e.g. {0:020d}.log)")
        return [path]
    if path.exists():
        raise DumpError(f"{path}: not a regular file or a directory")
    raise DumpError(f"{path}: no such file or directory")


@dataclass
class DumpResult:
    invalid: int = 0  # invalid batches and unusable tails
    non_consecutive: list[tuple[str, int, int]] = field(default_factory=list)  # (file, previous last, base)

    @property
    def clean(self) -> bool:
        return not self.invalid and not self.non_consecutive


def dump(path: Path, out: TextIO, *, records: bool = False) -> DumpResult:
    """Write the lines; what was wrong with the batches."""
    result = DumpResult()
    last: int | None = None  # last_offset of the previous valid batch, carried across a directory's files
    for file in log_files(path):
        for line in dump_file(file, records=records):
            if not line["valid"]:
                result.invalid += 1
            else:
                if last is not None and line["base_offset"] != last + 1:
                    line["non_consecutive"] = {"after": last}
                    result.non_consecutive.append((line["file"], last, line["base_offset"]))
                last = line["last_offset"]
            out.write(json.dumps(line) + "\n")
    return result


def dump_file(file: Path, *, records: bool = False) -> Iterator[dict[str, Any]]:
    size = file.stat().st_size
    if size == 0:
        return
    fd = os.open(file, os.O_RDONLY)
    try:
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            yield from _batches(mm, str(file), size, records)
    finally:
        os.close(fd)


def _batches(buf: mmap.mmap, name: str, size: int, records: bool) -> Iterator[dict[str, Any]]:
    pos = 0
    while pos < size:
        if size - pos < HEADER_SIZE:
            yield {"file": name, "position": pos, "size": size - pos, "valid": False,
                   "error": f"partial batch header: {size - pos} bytes"}
            return
        h = parse_header(buf, pos)
        line: dict[str, Any] = {
            "file": name, "position": pos, "size": h.size, "base_offset": h.base_offset,
            "last_offset": h.last_offset, "record_count": h.record_count, "leader_epoch": h.partition_leader_epoch,
            "magic": h.magic, "attributes": h.attributes, "crc": h.crc, "first_timestamp": h.first_timestamp,
            "max_timestamp": h.max_timestamp, "producer_id": h.producer_id, "producer_epoch": h.producer_epoch,
            "base_sequence": h.base_sequence, "valid": True,
        }
        try:
            validate_batch(buf, pos)
        except InvalidBatchError as exc:
            line["valid"] = False
            line["error"] = f"{type(exc).__name__}: {exc}"
        if line["valid"] and records:
            line["records"] = [_record(h, r) for r in decode_records(buf, pos)]
        yield line
        if h.batch_length < MIN_BATCH_LENGTH or pos + h.size > size:
            return  # no trustworthy way to find the next batch
        pos += h.size


def _record(h: BatchHeader, r: Record) -> dict[str, Any]:
    out: dict[str, Any] = {"offset": h.base_offset + r.offset_delta, "timestamp": record_timestamp(h, r)}
    for name, raw in (("key", r.key), ("value", r.value)):
        if raw is None:
            out[name] = None
            continue
        try:
            out[name] = raw.decode("utf-8")
        except UnicodeDecodeError:
            out[name + "_b64"] = base64.b64encode(raw).decode()
    out["headers"] = [[k, base64.b64encode(v).decode()] for k, v in r.headers]
    return out
