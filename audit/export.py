"""Offline export of broker data directories (and a workload history) to Parquet.

Reads the files of stopped (or running) brokers directly, never through the
API, with storage's own decoders (``storage.record_batch``,
``storage.checkpoint``), and writes the tables described in ``audit.schema``.

Inputs: each ``--data-dir`` is either a broker data directory (it holds
``meta.properties`` with ``node.id``) or a cluster directory from ``cluster
up`` whose ``broker-<id>/`` subdirectories are broker data directories.

Per broker data directory (DESIGN.md "Storage")::

    meta.properties, replication-offset-checkpoint (HW), recovery-point-offset-checkpoint,
    log-start-offset-checkpoint, <topic>-<partition>/{<20-digit base>.log, leader-epoch-checkpoint}

Segments are scanned in base-offset order, batch by batch, as recovery would:
a batch that fails the frame checks (length, magic, CRC, count) or whose
records do not decode ends the scan of that segment file and becomes a
``damaged`` row (``corrupt_batch`` / ``bad_records``); the scan goes on with
the next segment. An incomplete batch at the end of a partition's last segment
is a ``torn_tail`` (what a kill mid-append leaves; recovery truncates it),
unless its length claims more than any broker writes (``MAX_BATCH_BYTES``) or
a whole valid batch follows it (``_tail_kind``); then, and anywhere else, it is
``corrupt_batch``. A ``replication-offset-checkpoint`` absent from a broker whose
partitions hold records is ``missing_checkpoint`` (``missing_hw_checkpoint``). Unreadable checkpoints are
``bad_checkpoint`` rows and their values are unknown (-1). Numbers that do not
fit their Parquet column (int64 offsets and times, int32 partitions, epochs and
broker ids) count as unreadable: such a checkpoint is ``bad_checkpoint``, such a
batch ``corrupt_batch`` (offsets) or ``bad_records`` (timestamps), a
segment name ``bad_name``, and a ``<topic>-<partition>`` directory name is not a
partition directory. Nothing of this is fatal: the export always completes and
the audit reports the damage.

The output is written into a temporary sibling of ``--out`` and renamed into
place only when every table and the manifest are written: a failed export
leaves ``--out`` as it was (absent if it was absent).

LEO is the next offset after the last readable batch (the base offset of the
last segment when it is empty). Log start is computed as ``storage.log`` does
when it opens the log: the checkpoint's value (else the first segment's base
offset), but never below the first segment's base offset (retention deleted
segments and the broker died before it rewrote the checkpoint) nor above the
LEO. The latest epoch is the leader-epoch cache's last entry, else the last
batch's epoch.

Controller metadata: given a cluster directory, its ``controller/`` data dir
(``metadata.snapshot`` + ``metadata.journal``) is replayed read-only with
``controller.journal.read_image`` (no lock: a running controller may hold it;
a torn tail is left out, never truncated; nothing is written) into the
``assignments`` table. Damaged metadata is a ``bad_metadata`` damage row and
the export has no metadata then; the manifest's ``metadata_note`` says why an
export has none.

History: several files in one ``--history`` directory get their process names
prefixed with the file's stem (``history-rerun:c0``), since each run numbers
its clients and their ``seq`` from 0 again.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit import schema
from audit.history import HistoryFormatError, find_history_files, read_history
from common.clock import Clock, SystemClock
from common.digits import parse_digits
from common.fsutil import make_dirs, remove_empty_dirs
from common.logging import get_logger
from common.wire import TopicPartition
from controller.journal import JOURNAL_NAME, SNAPSHOT_NAME, read_image
from controller.state import MetadataImage
from storage.checkpoint import CheckpointError, read_epochs, read_offsets, read_properties
from storage.log import opened_log_start, parse_topic_partition
from storage.producer_state import increment_sequence
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

log = get_logger(__name__)

META_FILE = "meta.properties"
HW_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
SEGMENT_RE = re.compile(r"^(\d{20})\.log$", re.ASCII)
CONTROLLER_DIR = "controller"  # the controller's data dir in a cluster directory (cli.cluster.plan)
BROKER_DIR_RE = re.compile(r"^broker-(\d+)$", re.ASCII)
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAGIC_OFFSET = 16  # the magic byte's position in a batch header (storage.record_batch)


class ExportError(ValueError):
    """Input the export cannot work with (not a data directory, a bad history, ...)."""


@dataclass(frozen=True, slots=True)
class BrokerDir:
    broker_id: int
    path: Path
    meta_error: str = ""  # why meta.properties was unusable when the id came from a broker-<id> name


@dataclass(frozen=True, slots=True)
class Damage:
    broker: int | None  # None: the controller's metadata
    tp: TopicPartition | None
    file: Path
    position: int
    kind: str
    error: str

    def row(self, root: Path) -> dict[str, Any]:
        return {"broker": self.broker, "topic": self.tp.topic if self.tp else None,
                "partition": self.tp.partition if self.tp else None, "file": _rel(self.file, root),
                "position": self.position, "kind": self.kind, "error": self.error}


@dataclass
class ExportSummary:
    out: Path
    brokers: list[int] = field(default_factory=list)
    replicas: int = 0
    records: int = 0
    damaged: int = 0
    torn_tails: int = 0
    sends: int = 0
    polls: int = 0
    history_torn_lines: int = 0
    history_files: list[str] = field(default_factory=list)
    assignments: int | None = None  # partitions in the controller's metadata; None without metadata
    metadata_note: str = ""

    def lines(self) -> list[str]:
        return [f"exported {self.records} records of {self.replicas} replicas on brokers "
                f"{', '.join(map(str, self.brokers)) or '-'} to {self.out}",
                f"history: {self.sends} sends, {self.polls} polls from "
                f"{', '.join(self.history_files) or 'no history file'}"
                + (f" ({self.history_torn_lines} torn last line(s) skipped)" if self.history_torn_lines else "")
                + (" -- no sends: nothing to check the writes against" if self.history_files and not self.sends
                   else ""),
                f"controller metadata: {self.assignments} partition assignments" if self.assignments is not None
                else self.metadata_note,
                f"damaged regions: {self.damaged} (torn tails: {self.torn_tails})"
                + (" -- see damaged.parquet" if self.damaged else "")]


# ---------------------------------------------------------------- numbers

def _int32(value: int) -> bool:
    return INT32_MIN <= value <= INT32_MAX


def _int64(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


# ---------------------------------------------------------------- discovery

def _meta_broker_id(meta: Path) -> tuple[int | None, str]:
    """(broker id, why not) from ``meta.properties``."""
    try:
        props = read_properties(meta)
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{META_FILE} is unreadable: {exc}"
    key = "node.id" if "node.id" in props else "broker.id"
    if key not in props:
        return None, f"{META_FILE} has no node.id"
    raw = props[key]
    shown = repr(raw if len(raw) <= 40 else raw[:40] + "...")
    if raw.lstrip("+-").isdigit() and len(raw) > 20:  # int() refuses over 4300 digits
        return None, f"{META_FILE} {key} {shown} is out of range for a 32-bit broker id"
    try:
        value = int(raw)
    except ValueError:
        return None, f"{META_FILE} {key} {shown} is not an integer"
    if not _int32(value):
        return None, f"{META_FILE} {key} {shown} is out of range for a 32-bit broker id"
    return value, ""


def _broker_id(path: Path) -> tuple[int | None, str]:
    """(broker id, what is wrong with ``meta.properties`` or ""): its node.id, else the id of a
    ``broker-<id>`` directory name."""
    meta = path / META_FILE
    problem = ""
    if meta.is_file():
        broker_id, problem = _meta_broker_id(meta)
        if broker_id is not None:
            return broker_id, ""
    m = BROKER_DIR_RE.match(path.name)
    return (parse_digits(m.group(1), INT32_MAX) if m else None), problem


def discover_broker_dirs(paths: list[Path]) -> list[BrokerDir]:
    """Broker data directories under the given paths; ``ExportError`` if one holds none."""
    found: dict[Path, BrokerDir] = {}
    for path in paths:
        if not path.is_dir():
            raise ExportError(f"{path} is not a directory")
        if (path / META_FILE).is_file():
            candidates = [path]
        else:
            candidates = sorted(p for p in path.iterdir() if p.is_dir() and BROKER_DIR_RE.match(p.name))
        if not candidates:
            raise ExportError(f"{path} is neither a broker data directory (no {META_FILE}) "
                              "nor a cluster directory (no broker-<id>/ subdirectories)")
        for c in candidates:
            broker_id, problem = _broker_id(c)
            if broker_id is None:
                raise ExportError(f"{c}: cannot tell the broker id ({problem or 'no ' + META_FILE})")
            found[c.resolve()] = BrokerDir(broker_id, c, problem)  # a bad meta.properties becomes damage
    ids = [b.broker_id for b in found.values()]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ExportError(f"broker id(s) {dupes} appear in more than one data directory")
    return sorted(found.values(), key=lambda b: b.broker_id)


def partition_dirs(broker_dir: Path) -> list[tuple[TopicPartition, Path]]:
    """``<topic>-<partition>`` directories, named as the broker reads them (``storage.log.
    parse_topic_partition``); anything else (``...-delete``, stray dirs, ``s-01``, a partition number beyond
    int32) is skipped, as the broker skips it."""
    out = []
    for p in sorted(broker_dir.iterdir()):
        try:
            tp = parse_topic_partition(p)
        except ValueError:
            continue
        if p.is_dir():
            out.append((tp, p))
    return out


def segment_files(pdir: Path) -> tuple[list[tuple[int, Path]], list[Path]]:
    """(base offset, path) of the ``.log`` files in offset order, and misnamed ``.log`` files
    (a 20-digit name above int64 is misnamed too)."""
    good, bad = [], []
    for p in pdir.iterdir():
        if p.suffix != ".log" or not p.is_file():
            continue
        m = SEGMENT_RE.match(p.name)
        base = parse_digits(m.group(1), INT64_MAX) if m else None
        if base is not None:
            good.append((base, p))
        else:
            bad.append(p)
    return sorted(good), sorted(bad)


# ---------------------------------------------------------------- scanning

@dataclass
class ReplicaScan:
    """What one partition directory holds."""

    broker: int
    tp: TopicPartition
    segments: int = 0
    batches: int = 0
    records: int = 0
    first_base: int | None = None
    next_offset: int | None = None
    last_epoch: int | None = None
    damage: list[Damage] = field(default_factory=list)


class _OutOfRange(Exception):
    """A batch whose numbers do not fit their Parquet columns; ``kind`` is the damage kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _record_rows(broker: int, tp: TopicPartition, segment: str, pos: int, h: BatchHeader,
                 buf: Any) -> list[dict[str, Any]]:
    if h.next_offset > INT64_MAX:  # base_offset is outside the CRC: a flipped bit gets here
        raise _OutOfRange("corrupt_batch", f"batch at {pos}: offsets {h.base_offset}..{h.last_offset} "
                                           "go beyond int64")
    rows = []
    for r in decode_records(buf, pos):
        timestamp = record_timestamp(h, r)
        if not INT64_MIN <= timestamp <= INT64_MAX:
            raise _OutOfRange("bad_records", f"batch at {pos}: record {r.offset_delta} has a timestamp "
                                             "beyond int64")
        rows.append({"broker": broker, "topic": tp.topic, "partition": tp.partition,
                     "offset": h.base_offset + r.offset_delta, "leader_epoch": h.partition_leader_epoch,
                     "batch_base_offset": h.base_offset, "batch_last_offset": h.last_offset,
                     "batch_crc": h.crc, "key": r.key, "value": r.value,
                     "timestamp": timestamp, "producer_id": h.producer_id,
                     "producer_epoch": h.producer_epoch,
                     # a batch's sequences wrap from 2**31-1 to 0, as its producer's do (Kafka's
                     # DefaultRecordBatch.incrementSequence)
                     "sequence": increment_sequence(h.base_sequence, r.offset_delta) if h.base_sequence >= 0
                     else -1,
                     "segment": segment, "position": pos})
    return rows


# The largest batch a broker can write: a leader takes batches only from a Produce body, which the server
# refuses above ``broker.server.MAX_BODY_BYTES`` (64 MiB; a test keeps the two equal), and a follower copies
# the leader's batches. ``message.max.bytes`` and ``segment.bytes`` are lower by default but configurable up
# to 2**31-1, so they bound nothing the export can rely on.
MAX_BATCH_BYTES = 64 * 1024 * 1024


def _incomplete(buf: Any, pos: int) -> str | None:
    """Why the bytes at ``pos`` are not a whole batch, or None if they frame one."""
    left = len(buf) - pos
    if left < HEADER_SIZE:
        return f"{left} bytes left, less than a batch header"
    header = parse_header(buf, pos)
    if header.batch_length < MIN_BATCH_LENGTH and not any(buf[pos:]):
        return f"{left} zero bytes"
    if header.batch_length >= MIN_BATCH_LENGTH and pos + header.size > len(buf):
        return f"batch of {header.size} bytes, {left} left"
    return None


def _whole_batch_after(buf: Any, pos: int, next_offset: int) -> int | None:
    """The position of the first whole, valid batch (``check_frame``: length, magic, CRC, count) that starts
    after ``pos`` and continues the log (its base offset at least ``next_offset``), or None.

    A partial last write is a prefix of the batches one append wrote: no whole batch can follow its start.
    One that does means the length field at ``pos`` lies (a flipped bit), not that the write was cut. Only
    positions whose magic byte is right are framed (``mmap.find``), so the scan stays cheap."""
    magic = bytes([MAGIC])
    q = buf.find(magic, pos + 1 + MAGIC_OFFSET)
    while q != -1:
        start = q - MAGIC_OFFSET
        if len(buf) - start < HEADER_SIZE:
            return None
        header = parse_header(buf, start)
        if (header.batch_length >= MIN_BATCH_LENGTH and start + header.size <= len(buf)
                and header.base_offset >= next_offset):
            try:
                check_frame(buf, start)
                return int(start)
            except InvalidBatchError:
                pass
        q = buf.find(magic, q + 1)
    return None


def _tail_kind(buf: Any, pos: int, next_offset: int, torn: str) -> tuple[str, str]:
    """(kind, error) of an incomplete batch at ``pos`` in a partition's last segment: a ``torn_tail`` (a
    partial last write, informational) unless its length field claims more than any broker writes or a
    whole valid batch follows it (then the length is damaged: ``corrupt_batch``)."""
    if len(buf) - pos < HEADER_SIZE:
        return "torn_tail", torn
    header = parse_header(buf, pos)
    if header.size > MAX_BATCH_BYTES:
        return "corrupt_batch", (f"{torn}: batch_length claims {header.size} bytes, more than the largest batch a "
                                 f"broker writes ({MAX_BATCH_BYTES})")
    after = _whole_batch_after(buf, pos, next_offset) if header.batch_length >= MIN_BATCH_LENGTH else None
    if after is not None:
        return "corrupt_batch", f"{torn}, but a whole valid batch starts at {after}: the batch length is damaged"
    return "torn_tail", torn


def scan_segment(scan: ReplicaScan, path: Path, *, last: bool) -> Iterator[dict[str, Any]]:
    """Record rows of one segment file; damage is appended to ``scan.damage``."""
    size = path.stat().st_size
    if size == 0:
        return
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 0
        while pos < size:
            torn = _incomplete(buf, pos)
            if torn is not None:
                expected = scan.next_offset if scan.next_offset is not None else 0
                kind, error = _tail_kind(buf, pos, expected, torn) if last else ("corrupt_batch", torn)
                scan.damage.append(Damage(scan.broker, scan.tp, path, pos, kind, error))
                return
            try:
                header = check_frame(buf, pos)
                rows = _record_rows(scan.broker, scan.tp, path.name, pos, header, buf)
            except InvalidBatchError as exc:
                kind = "bad_records" if exc.code.name == "INVALID_RECORD" else "corrupt_batch"
                scan.damage.append(Damage(scan.broker, scan.tp, path, pos, kind,
                                          f"{type(exc).__name__}: {exc}"))
                return
            except _OutOfRange as exc:
                scan.damage.append(Damage(scan.broker, scan.tp, path, pos, exc.kind, f"out of range: {exc}"))
                return
            scan.batches += 1
            scan.records += len(rows)
            scan.next_offset = header.next_offset
            scan.last_epoch = header.partition_leader_epoch
            yield from rows
            pos += header.size


def scan_partition(broker: int, tp: TopicPartition, pdir: Path) -> tuple[ReplicaScan, Iterator[dict[str, Any]]]:
    scan = ReplicaScan(broker, tp)
    segments, misnamed = segment_files(pdir)
    scan.damage += [Damage(broker, tp, p, 0, "bad_name", "a .log file not named by a 20-digit base offset")
                    for p in misnamed]
    scan.segments = len(segments)
    if segments:
        scan.first_base = segments[0][0]

    def rows() -> Iterator[dict[str, Any]]:
        for i, (base, path) in enumerate(segments):
            if scan.next_offset is None or scan.next_offset < base:
                scan.next_offset = base  # an empty (or fully damaged) segment still marks its base
            try:
                yield from scan_segment(scan, path, last=i == len(segments) - 1)
            except OSError as exc:
                scan.damage.append(Damage(broker, tp, path, 0, "unreadable", str(exc)))

    return scan, rows()


# ---------------------------------------------------------------- replica state

@dataclass(frozen=True, slots=True)
class Checkpoints:
    hw: dict[TopicPartition, int]
    recovery: dict[TopicPartition, int]
    log_start: dict[TopicPartition, int]


def _checked_offsets(path: Path) -> dict[TopicPartition, int]:
    """``read_offsets``, with ``CheckpointError`` for a partition beyond int32 or an offset beyond int64."""
    offsets = read_offsets(path)
    for tp, offset in offsets.items():
        if not _int32(tp.partition) or not _int64(offset):
            raise CheckpointError(f"{path}: entry {tp.topic} {tp.partition} {offset} is out of range "
                                  "(partition int32, offset int64)")
    return offsets


def _checked_epochs(path: Path) -> list[dict[str, int]]:
    """``read_epochs`` as rows, with ``CheckpointError`` for an epoch beyond int32 or an offset beyond int64."""
    rows = []
    for e in read_epochs(path):
        if not _int32(e.epoch) or not _int64(e.start_offset):
            raise CheckpointError(f"{path}: entry {e.epoch} {e.start_offset} is out of range "
                                  "(epoch int32, start offset int64)")
        rows.append({"epoch": e.epoch, "start_offset": e.start_offset})
    return rows


def read_checkpoints(b: BrokerDir, damage: list[Damage]) -> Checkpoints:
    def one(name: str) -> dict[TopicPartition, int]:
        try:
            return _checked_offsets(b.path / name)
        except (CheckpointError, OSError, UnicodeDecodeError) as exc:
            damage.append(Damage(b.broker_id, None, b.path / name, 0, "bad_checkpoint", str(exc)))
            return {}

    return Checkpoints(one(HW_CHECKPOINT), one(RECOVERY_CHECKPOINT), one(LOG_START_CHECKPOINT))


def missing_hw_checkpoint(b: BrokerDir, records: int) -> Damage | None:
    """A ``missing_checkpoint`` damage row when the broker's partition dirs hold ``records`` but its
    ``replication-offset-checkpoint`` does not exist.

    ``storage.checkpoint.read_offsets`` reads an absent file as empty, so every replica of that broker would
    get HW -1, commit nothing and drop out of ``replica_divergence`` and ``inconsistent_offsets`` without a
    word. A broker writes the file every ``replica.high.watermark.checkpoint.interval.ms`` (5 s) and on every
    graceful shutdown (``ReplicaManager.shutdown``), empty partitions included, and never deletes it; chaos
    runs and ``cluster down`` stop brokers gracefully before the export. So with records present, the file
    is absent only if someone removed it, or if the broker was SIGKILLed (or is being exported live) before
    its first checkpoint and was never stopped gracefully since: an export of such a cluster is not the
    normal flow, and the audit failing on it (naming the file) is better than comparing nothing silently.
    A broker without records needs no HW and gets no row."""
    path = b.path / HW_CHECKPOINT
    if records == 0 or path.exists():  # (a dangling symlink reads as absent too)
        return None
    return Damage(b.broker_id, None, path, 0, "missing_checkpoint",
                  f"{HW_CHECKPOINT} is absent but the broker's partition dirs hold {records} records: its HWs "
                  "are unknown (-1), so its replicas commit nothing and are not compared")


def _log_start(checkpointed: int | None, first_base: int | None, leo: int) -> int:
    """The log start as the broker computes it when it opens the log (``storage.log.opened_log_start``);
    without a segment, the checkpoint's value."""
    if first_base is None:
        return checkpointed if checkpointed is not None else 0
    return opened_log_start(checkpointed, first_base, leo)


def replica_row(b: BrokerDir, scan: ReplicaScan, pdir: Path, cps: Checkpoints) -> dict[str, Any]:
    epochs: list[dict[str, int]] = []
    try:
        epochs = _checked_epochs(pdir / EPOCH_CHECKPOINT)
    except (CheckpointError, OSError, UnicodeDecodeError) as exc:
        scan.damage.append(Damage(b.broker_id, scan.tp, pdir / EPOCH_CHECKPOINT, 0, "bad_checkpoint", str(exc)))
    latest = epochs[-1]["epoch"] if epochs else (scan.last_epoch if scan.last_epoch is not None else -1)
    leo = scan.next_offset if scan.next_offset is not None else 0
    log_start = _log_start(cps.log_start.get(scan.tp), scan.first_base, leo)
    return {"broker": b.broker_id, "topic": scan.tp.topic, "partition": scan.tp.partition,
            "data_dir": str(b.path), "high_watermark": cps.hw.get(scan.tp, -1), "log_end_offset": leo,
            "log_start_offset": log_start, "recovery_point": cps.recovery.get(scan.tp, -1),
            "latest_epoch": latest, "epoch_cache": epochs, "segments": scan.segments, "batches": scan.batches,
            "records": scan.records,
            "damaged": any(d.kind not in schema.INFORMATIONAL_DAMAGE for d in scan.damage)}


# ---------------------------------------------------------------- controller metadata

@dataclass(frozen=True, slots=True)
class Metadata:
    """The controller's partition assignments, or why the export has none."""

    assignments: list[dict[str, Any]] | None
    note: str = ""  # why ``assignments`` is None
    damage: list[Damage] = field(default_factory=list)
    sources: list[Path] = field(default_factory=list)


def find_controller_dirs(paths: list[Path]) -> tuple[list[Path], str]:
    """The controller data dirs (``controller/`` with a snapshot or a journal) of the cluster directories
    among ``paths``; when there is none, why."""
    clusters = [p for p in paths if p.is_dir() and not (p / META_FILE).is_file()]
    if not clusters:
        return [], "no controller metadata: broker data dirs were given, not a cluster dir"
    found = [p / CONTROLLER_DIR for p in clusters
             if any((p / CONTROLLER_DIR / name).is_file() for name in (SNAPSHOT_NAME, JOURNAL_NAME))]
    if not found:
        return [], (f"no controller metadata: no {CONTROLLER_DIR}/{SNAPSHOT_NAME} or {JOURNAL_NAME} in "
                    + ", ".join(map(str, clusters)))
    return found, ""


def assignment_rows(image: MetadataImage) -> list[dict[str, Any]]:
    """One row per partition; ``ValueError`` for a number that does not fit its int32 column."""
    rows = []
    for tp, st in sorted(image.partitions.items()):
        numbers = [tp.partition, st.leader, st.leader_epoch, *st.replicas, *st.isr]
        if not all(isinstance(n, int) and _int32(n) for n in numbers):
            raise ValueError(f"partition {tp.topic}-{tp.partition}: a number beyond int32 in {st}")
        rows.append({"topic": tp.topic, "partition": tp.partition, "replicas": list(st.replicas),
                     "isr": list(st.isr), "leader": st.leader, "leader_epoch": st.leader_epoch})
    return rows


def load_metadata(paths: list[Path]) -> Metadata:
    """The assignments of the controllers of the cluster directories among ``paths``, read-only
    (``controller.journal.read_image``: no lock, a running controller's torn tail is left alone). Damaged
    metadata is a ``bad_metadata`` damage row and no assignments, never an error."""
    dirs, note = find_controller_dirs(paths)
    rows: list[dict[str, Any]] = []
    damage: list[Damage] = []
    for d in dirs:
        try:
            rows += assignment_rows(read_image(d))
        except Exception as exc:  # whatever replaying damaged metadata raises is damage, never fatal
            damage.append(Damage(None, None, d, 0, "bad_metadata", f"{type(exc).__name__}: {exc}"))
            log.info("export_damage_found", file=str(d), kind="bad_metadata", error=str(exc))
    if damage:
        return Metadata(None, "controller metadata unreadable (see damaged_files)", damage, dirs)
    if not dirs:
        return Metadata(None, note)
    return Metadata(rows, sources=dirs)


# ---------------------------------------------------------------- export

def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def prepare_out(out: Path) -> bool:
    """Whether ``out`` exists (as an empty directory or an earlier export, which the export replaces);
    ``ExportError`` for anything else. Changes nothing."""
    if not out.exists():
        if out.is_symlink():
            raise ExportError(f"--out {out} is a dangling symbolic link")
        return False
    if not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a directory")
    entries = [p.name for p in out.iterdir()]
    ours = {schema.MANIFEST, *(f"{n}.parquet" for n in schema.TABLES)}
    if any(name not in ours for name in entries):
        raise ExportError(f"--out {out} is not empty and not an earlier export; choose another directory")
    if os.path.ismount(out.resolve()):
        raise ExportError(f"--out {out} is a mount point, which an export cannot replace as a whole; "
                          "export into a new directory inside it")
    return True


def _make_parents(out: Path, parent: Path) -> Path | None:
    """Create the missing directories up to ``parent``; the topmost one created (None if none was)."""
    p = parent
    while not p.exists():
        if p.is_symlink():
            raise ExportError(f"--out {out}: {p} is a dangling symbolic link")
        p = p.parent
    if not p.is_dir():
        raise ExportError(f"--out {out}: {p} is not a directory")
    try:
        return make_dirs(parent)
    except OSError as exc:
        raise ExportError(f"--out {out}: cannot create {exc.filename or parent}: {exc.strerror or exc}") from None


@contextmanager
def staged_out(out: Path) -> Iterator[Path]:
    """A new temporary sibling directory of ``out`` to write the export into; renamed to ``out``
    (replacing an empty directory or an earlier export) when the block succeeds, removed (with any
    parent directory made for it) when it fails, so ``out`` is never half-written."""
    existed = prepare_out(out)
    target = out.resolve()  # a symlinked --out: replace the directory it points to
    if target.parent == target:
        raise ExportError(f"--out {out}: cannot replace the root directory")
    created = _make_parents(out, target.parent)
    try:
        tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
        tmp.mkdir()
    except OSError as exc:
        remove_empty_dirs(target.parent, created)
        raise ExportError(f"--out {out}: cannot create a directory next to it: {exc.strerror or exc}") from None
    try:
        if existed:
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        yield tmp
        if existed and any(target.iterdir()):  # an earlier export: set it aside, then swap
            old = target.parent / f".{target.name}.{secrets.token_hex(6)}.old"
            os.rename(target, old)
            try:
                os.rename(tmp, target)
            except BaseException:
                os.rename(old, target)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)  # atomically replaces an empty directory too
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty_dirs(target.parent, created)
        raise


def export_brokers(brokers: list[BrokerDir], out: Path, summary: ExportSummary) -> list[Damage]:
    """Write ``records`` and ``replicas``; returns every damage found."""
    damage: list[Damage] = []
    records = schema.TableWriter(out, "records")
    replicas: list[dict[str, Any]] = []
    try:
        for b in brokers:
            if b.meta_error:  # the id came from the broker-<id> name
                damage.append(Damage(b.broker_id, None, b.path / META_FILE, 0, "bad_checkpoint", b.meta_error))
                log.info("export_damage_found", broker_id=b.broker_id, file=str(b.path / META_FILE),
                         kind="bad_checkpoint", error=b.meta_error)
            cps = read_checkpoints(b, damage)
            held = 0  # records in this broker's partition dirs
            for tp, pdir in partition_dirs(b.path):
                scan, rows = scan_partition(b.broker_id, tp, pdir)
                for row in rows:
                    records.add(row)
                replicas.append(replica_row(b, scan, pdir, cps))
                held += scan.records
                damage += scan.damage
                for d in scan.damage:
                    log.info("export_damage_found", broker_id=b.broker_id, topic=tp.topic,
                             partition=tp.partition, file=str(d.file), position=d.position, kind=d.kind,
                             error=d.error)
            missing = missing_hw_checkpoint(b, held)
            if missing is not None:
                damage.append(missing)
                log.info("export_damage_found", broker_id=b.broker_id, file=str(missing.file),
                         kind=missing.kind, error=missing.error)
    finally:
        records.close()
    schema.write_table(out, "replicas", replicas)
    summary.brokers = [b.broker_id for b in brokers]
    summary.replicas = len(replicas)
    summary.records = records.rows
    return damage


def _utf8(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8")


@dataclass(frozen=True, slots=True)
class HistoryRows:
    sends: list[dict[str, Any]]
    polls: list[dict[str, Any]]
    files: list[str]
    torn_lines: int = 0  # torn last lines skipped (``History.torn_lines``, summed over the files)


def process_prefixes(files: list[Path]) -> dict[Path, str]:
    """What to put before each file's process names: nothing for one file; ``<stem>:`` (the file's name
    when stems collide) when several are merged, since each run names its clients ``p0``, ``c0``, ... from
    ``seq`` 0 again and the merged processes would otherwise interleave (false non-monotonic polls)."""
    if len(files) < 2:
        return {f: "" for f in files}
    stems = [f.stem for f in files]
    unique = len(set(stems)) == len(stems)
    return {f: f"{f.stem if unique else f.name}:" for f in files}


def load_history(history: Path | None) -> HistoryRows | None:
    """The history's rows for ``sends`` and ``polls``; None without ``--history``."""
    if history is None:
        return None
    if not history.exists():
        raise ExportError(f"--history {history} does not exist")
    files = find_history_files(history)
    if not files:
        raise ExportError(f"--history {history}: no file whose name contains 'history'")
    sends: list[dict[str, Any]] = []
    polls: list[dict[str, Any]] = []
    torn = 0
    prefixes = process_prefixes(files)
    for path in files:
        try:
            h = read_history(path)
        except (HistoryFormatError, OSError) as exc:
            raise ExportError(f"bad history: {exc}") from None
        prefix = prefixes[path]
        torn += h.torn_lines
        sends += [{"process": prefix + s.process, "seq": s.seq, "topic": s.topic, "partition": s.partition,
                   "offset": s.offset, "key": _utf8(s.key), "value": _utf8(s.value), "outcome": s.outcome.value,
                   "error": s.error, "start_ms": s.start_ms, "time_ms": s.time_ms} for s in h.sends]
        polls += [{"process": prefix + p.process, "seq": p.seq, "topic": p.topic, "partition": p.partition,
                   "offset": p.offset, "key": _utf8(p.key), "value": _utf8(p.value), "time_ms": p.time_ms}
                  for p in h.polls]
    return HistoryRows(sends, polls, [str(f) for f in files], torn)


def export(data_dirs: list[Path], out: Path, *, history: Path | None = None,
           clock: Clock | None = None) -> ExportSummary:
    """The whole export; ``ExportError`` for input it cannot use or an I/O error (``out`` is left as
    it was then: see ``staged_out``)."""
    try:
        brokers = discover_broker_dirs(data_dirs)
        rows = load_history(history)  # before touching --out: a bad history changes nothing
        metadata = load_metadata(data_dirs)
        with staged_out(out) as tmp:
            summary = _write_export(brokers, rows, metadata, tmp, clock)
    except OSError as exc:
        raise ExportError(f"export to {out} failed: {exc}") from None
    summary.out = out
    log.info("export_done", brokers=summary.brokers, records=summary.records, replicas=summary.replicas,
             damaged=summary.damaged, out=str(out))
    return summary


def _write_export(brokers: list[BrokerDir], rows: HistoryRows | None, metadata: Metadata, out: Path,
                  clock: Clock | None) -> ExportSummary:
    summary = ExportSummary(out=out)
    summary.sends = schema.write_table(out, "sends", rows.sends if rows else [])
    summary.polls = schema.write_table(out, "polls", rows.polls if rows else [])
    summary.history_files = rows.files if rows else []
    summary.history_torn_lines = rows.torn_lines if rows else 0
    assignments = schema.write_table(out, "assignments", metadata.assignments or [])
    summary.assignments = assignments if metadata.assignments is not None else None
    summary.metadata_note = metadata.note
    damage = export_brokers(brokers, out, summary) + metadata.damage
    root = Path(os.path.commonpath([str(b.path.resolve()) for b in brokers]))
    schema.write_table(out, "damaged", [d.row(root) for d in damage])
    summary.damaged = sum(d.kind not in schema.INFORMATIONAL_DAMAGE for d in damage)
    summary.torn_tails = len(damage) - summary.damaged
    schema.write_manifest(out, {
        "has_history": rows is not None, "history_torn_lines": summary.history_torn_lines,
        "brokers": summary.brokers,
        "has_metadata": metadata.assignments is not None, "metadata_note": metadata.note,
        "sources": [str(b.path) for b in brokers] + [str(d) for d in metadata.sources] + summary.history_files,
        "counts": {"records": summary.records, "replicas": summary.replicas, "damaged": len(damage),
                   "sends": summary.sends, "polls": summary.polls, "assignments": assignments},
        "created_ms": (clock or SystemClock()).now_ms(),
    })
    return summary
