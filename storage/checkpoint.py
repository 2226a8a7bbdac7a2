"""Checkpoint files, in Kafka's versioned text format, written atomically.

Offset checkpoints (``replication-offset-checkpoint``,
``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``)::

    0                      <- version
    2                      <- number of entries
    orders 0 1234          <- topic partition offset
    orders 1 99

``leader-epoch-checkpoint`` (one per partition directory)::

    0
    2
    3 0                    <- epoch start_offset
    5 1200

Writes go to ``<name>.tmp``, which is fsynced, renamed over the target, and
then the directory is fsynced, so a crash leaves either the old or the new
file. A malformed file raises ``CheckpointError`` naming the file and line.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from common.wire import TopicPartition
from storage.epoch_cache import EpochEntry

VERSION = 0


class CheckpointError(ValueError):
    """A checkpoint file that cannot be parsed."""


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write ``text`` to ``path`` through ``<name>.tmp`` (fsync, rename, directory fsync). On ``OSError`` the
    target is untouched and the temp file is removed (best effort: a full disk must not keep a half-written
    ``.tmp`` that uses space); the error propagates."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            data = text.encode() if isinstance(text, str) else text
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # e.g. a directory in its place: nothing of ours to remove
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _format(lines: Iterable[str]) -> str:
    body = list(lines)
    return "\n".join([str(VERSION), str(len(body)), *body]) + "\n"


def _parse(path: Path, fields: int) -> list[list[str]]:
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not text: {exc}") from None
    lines = text.splitlines()
    if len(lines) < 2:
        raise CheckpointError(f"{path}: missing version or count line")
    if lines[0].strip() != str(VERSION):
        raise CheckpointError(f"{path}: unsupported version {lines[0].strip()!r}")
    try:
        count = int(lines[1])
    except ValueError:
        raise CheckpointError(f"{path}: bad count line {lines[1]!r}") from None
    rows = [line.split() for line in lines[2:] if line.strip()]
    if len(rows) != count:
        raise CheckpointError(f"{path}: count says {count}, {len(rows)} entries")
    for i, row in enumerate(rows):
        if len(row) != fields:
            raise CheckpointError(f"{path}: line {i + 3}: expected {fields} fields, got {row!r}")
    return rows


def _int(path: Path, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise CheckpointError(f"{path}: {raw!r} is not an integer") from None


def write_offsets(path: Path, offsets: dict[TopicPartition, int]) -> None:
    for tp in offsets:
        if not tp.topic or any(c.isspace() for c in tp.topic):
            raise ValueError(f"topic {tp.topic!r} cannot be written to a checkpoint")
    write_atomic(path, _format(f"{tp.topic} {tp.partition} {off}" for tp, off in sorted(offsets.items())))


def read_offsets(path: Path) -> dict[TopicPartition, int]:
    """Entries of an offset checkpoint; an absent file is empty."""
    if not path.exists():
        return {}
    return {TopicPartition(r[0], _int(path, r[1])): _int(path, r[2]) for r in _parse(path, 3)}


def write_epochs(path: Path, entries: list[EpochEntry]) -> None:
    write_atomic(path, _format(f"{e.epoch} {e.start_offset}" for e in entries))


MAX_EPOCH = 2**31 - 1  # partition_leader_epoch is an int32 in the batch header
MAX_OFFSET = 2**63 - 1


def read_epochs(path: Path) -> list[EpochEntry]:
    """The entries of a ``leader-epoch-checkpoint``; an absent file is empty. ``CheckpointError`` unless
    every epoch and start offset is in range (0..int32, 0..int64) and both strictly increase from line to
    line, as the cache keeps them: Kafka's ``LeaderEpochFileCache`` refuses such entries too. A file that
    parses but breaks this is damaged, not a cache to believe (recovery would otherwise judge the batches
    by it); the log rebuilds the cache from the batches instead (``Log._rebuild_epochs``)."""
    if not path.exists():
        return []
    entries = [EpochEntry(_int(path, r[0]), _int(path, r[1])) for r in _parse(path, 2)]
    previous: EpochEntry | None = None
    for i, e in enumerate(entries):
        if not (0 <= e.epoch <= MAX_EPOCH and 0 <= e.start_offset <= MAX_OFFSET):
            raise CheckpointError(f"{path}: line {i + 3}: epoch {e.epoch} or start offset {e.start_offset} "
                                  f"out of range")
        if previous is not None and (e.epoch <= previous.epoch or e.start_offset <= previous.start_offset):
            raise CheckpointError(f"{path}: line {i + 3}: ({e.epoch}, {e.start_offset}) does not follow "
                                  f"({previous.epoch}, {previous.start_offset}): both must increase")
        previous = e
    return entries


def read_properties(path: Path) -> dict[str, str]:
    """A Java-style ``key=value`` file such as ``meta.properties`` (``#`` comments skipped)."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out
