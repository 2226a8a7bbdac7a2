"""The log of one partition: an ordered list of segments plus its leader-epoch cache.

Directory ``<data-dir>/<topic>-<partition>/`` holds the segments
(``<20-digit base>.log/.index/.timeindex``, see ``storage.segment`` and
``storage.index``), ``leader-epoch-checkpoint`` (``storage.checkpoint``) and
producer-state snapshots ``<20-digit offset>.snapshot``, taken at each roll
and at a clean close (``_load_producer_state``).
The recovery point and log start offset are persisted by the ``LogManager``'s
checkpoint files; the high watermark is not the log's business.

Blocking I/O and the event loop
-------------------------------
``Log.open`` (which may validate whole segments) is blocking: call it through
``asyncio.to_thread`` (``LogManager`` does). Once open, a ``Log`` belongs to one
thread (the event loop) and is not thread-safe. Appends and reads are bounded
in size (a produce request, ``replica.fetch.max.bytes``) and are done inline
with ``os.writev`` / ``os.pread`` on the page cache: at a few MiB a thread hop
costs more than the copy. The fsync of a rolled segment can be large (up to
``segment.bytes`` of dirty pages): with ``defer_roll_flush`` set (the
``LogManager`` sets it) ``roll`` only queues the segment and
``flush_rolled_segments`` fsyncs duplicated descriptors in a worker thread,
like Kafka's scheduled ``flush-log`` task; otherwise ``roll`` fsyncs inline.
Kafka schedules that task at once on each roll; ``LogManager`` runs it on
its one-second tick instead, with the unlinking (and retention when due). In
the produce benchmark, flushing each rolled segment at once and deleting
every 100 ms (the work spread evenly) cost the broker more per request than
the tick's bursts (docs/benchmarks/broker.md, thirteenth session); the
recovery point lags by at most a tick more.
Likewise with ``defer_file_deletion`` the files of deleted segments (retention,
truncation) are only renamed ``*.deleted`` and ``unlink_deleted_segments``
removes them in a worker thread.

Flush policy (Kafka's): no fsync per append; fsync when ``flush.messages``
messages or ``flush.ms`` are reached (checked on append and by ``maybe_flush``),
on roll, and on close. ``recovery_point`` is the offset up to which everything
is known to be on disk.

Recovery (``open``): every batch at or after the recovery point is validated
(``LogSegment.recover``: length, magic, CRC, record count, offset continuity,
epoch order, ``segment.epoch_cut``); the first bad byte and everything after it
is cut, later segments are deleted, and the indexes of the recovered segments
are rebuilt. An epoch cache the batches contradict is rebuilt from them, never
a reason to cut (Kafka's recovery heals the cache the same way). Batches below
the recovery point were fsynced and are trusted: their
indexes are only sanity-checked (sorted, in range, last entry pointing at a
batch with its offset, tail parsing to the end of file), and a segment that
fails those checks is validated in full. After a clean close the recovery
point is the LEO, so reopening validates nothing.

Offsets, like Kafka: ``truncate_to(offset)`` removes the batch holding
``offset`` and all later ones (so the LEO is the start of that batch, which is
``offset`` whenever offset is a batch boundary, as replication guarantees).
``read`` returns whole batches; the first may begin before ``start_offset``.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import secrets
import shutil
import struct
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from common.clock import Clock
from common.config import Config
from common.errors import ErrorCode, MinibrokerError
from common.logging import get_logger
from common.wire import TopicPartition
from storage import checkpoint
from storage import index as ix
from storage.epoch_cache import EpochEntry, LeaderEpochCache
from storage.producer_state import ProducerBatch, ProducerStateManager, decode_snapshot, encode_snapshot
from storage.record_batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    BatchTooLargeError,
    BatchTooShortError,
    InvalidBatchError,
    iter_batches,
)
from storage.segment import BatchMeta, LogSegment, RecoveryResult, log_path, segment_base

EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
SNAPSHOT_SUFFIX = ".snapshot"  # producer-state snapshots, <20-digit offset>.snapshot (see _load_producer_state)


def snapshot_path(dir: Path, offset: int) -> Path:
    return dir / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offset(name: str) -> int | None:
    """The offset of a producer snapshot file named ``<20 digits>.snapshot``, else None."""
    stem, dot, ext = name.partition(".")
    if dot and "." + ext == SNAPSHOT_SUFFIX and len(stem) == 20 and stem.isascii() and stem.isdigit():
        return int(stem)
    return None
DELETED_DIR_SUFFIX = "-delete"  # a partition directory renamed for removal (Log.delete)
_MAX_PARTITION = 2**31 - 1  # an int32, as Kafka's partition ids
_NEVER_MS = 2**63 - 1  # flush.ms default: no time-based flush
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3  # KIP-734: the record carrying the largest timestamp

_HEADER_FIELDS = struct.Struct(">qiibIhiqqqhii")
_STAMP_PREFIX = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch: bytes [0, 16)

log = get_logger("storage.log")


class StorageError(MinibrokerError):
    code = ErrorCode.KAFKA_STORAGE_ERROR


class OffsetOutOfRangeError(MinibrokerError):
    code = ErrorCode.OFFSET_OUT_OF_RANGE


class OffsetMismatchError(MinibrokerError):
    """A follower append that does not start at the LEO or is not contiguous."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


class StaleLeaderEpochError(MinibrokerError):
    """An append whose leader epoch is older than the log's latest epoch."""

    code = ErrorCode.FENCED_LEADER_EPOCH


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    retention_ms: int = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    flush_messages: int = 2**63 - 1
    flush_ms: int = 2**63 - 1
    max_message_bytes: int = 1024 * 1024 + 12

    @classmethod
    def from_config(cls, cfg: Config) -> LogConfig:
        return cls(
            segment_bytes=cfg.get_int("log.segment.bytes"),
            segment_ms=cfg.get_int("log.roll.ms"),
            retention_bytes=cfg.get_int("log.retention.bytes"),
            retention_ms=cfg.get_int("log.retention.ms"),
            index_interval_bytes=cfg.get_int("log.index.interval.bytes"),
            flush_messages=cfg.get_int("log.flush.interval.messages"),
            flush_ms=cfg.get_int("log.flush.interval.ms"),
            max_message_bytes=cfg.get_int("message.max.bytes"),
        )


class AppendInfo(NamedTuple):
    """Immutable like the frozen dataclasses elsewhere, but a NamedTuple: building a frozen
    dataclass costs about 1 µs, a tenth of a whole 16 KiB append.

    ``duplicate``: the idempotent batches were appended before; nothing was written, and
    ``first_offset``/``last_offset`` are the original batches' (the other counts are 0)."""

    first_offset: int
    last_offset: int
    num_records: int
    max_timestamp: int
    size_bytes: int
    batches: int
    duplicate: bool = False


class FetchData(NamedTuple):
    """What ``read`` returns (a NamedTuple for the same reason as ``AppendInfo``)."""

    records: bytes
    first_offset: int  # base offset of the first returned batch; -1 if empty


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    timestamp: int
    offset: int
    leader_epoch: int


EMPTY_FETCH = FetchData(b"", -1)


def parse_topic_partition(dir: Path) -> TopicPartition:
    """The partition of a directory named ``<topic>-<partition>``, the partition number written as the
    broker writes it (``str(int)``: ASCII digits, no sign, no leading zero, at most 2^31 - 1). Anything
    else (``s-01``, ``s-+1``, non-ASCII digits) is not a partition directory: read as one it would take
    over the log of the partition it parses to, hiding that log's records (Kafka refuses such duplicates)."""
    topic, sep, partition = dir.name.rpartition("-")
    if (not sep or not topic or not partition.isascii() or not partition.isdigit()
            or (partition[0] == "0" and partition != "0") or int(partition) > _MAX_PARTITION):
        raise ValueError(f"{dir}: not a <topic>-<partition> directory")
    return TopicPartition(topic, int(partition))


def opened_log_start(checkpointed: int | None, first_base: int, log_end_offset: int) -> int:
    """The log start a log opens with: the checkpointed value (else the first segment's base), never below
    the first segment's base (retention deleted segments before the checkpoint was rewritten) nor above the
    LEO. ``audit.export`` computes the same from the files."""
    return min(max(checkpointed if checkpointed is not None else first_base, first_base), log_end_offset)


class Log:
    def __init__(self, dir: Path, config: LogConfig, clock: Clock, tp: TopicPartition) -> None:
        self.dir = dir
        self.config = config
        self.clock = clock
        self.topic_partition = tp
        self.segments: list[LogSegment] = []
        self._bases: list[int] = []
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.recovery_point = 0
        self.epoch_cache = LeaderEpochCache()
        self.producer_state = ProducerStateManager()
        self._snapshots: list[int] = []  # offsets of the producer snapshots on disk, ascending
        self.defer_roll_flush = False
        self.defer_file_deletion = False  # LogManager: deleted segments are renamed, then unlinked off the loop
        self._pending_deletions: list[Path] = []
        self._rolled_unflushed: list[LogSegment] = []
        self._unflushed_messages = 0
        self._last_flush_ms = clock.monotonic_ms()
        self._generation = 0  # bumped by truncation: a deferred flush must not move the recovery point
        # Segment files created (count) and how many of those creations a directory fsync has made durable:
        # the recovery point never moves over a segment whose directory entry a power loss could still undo
        # (Kafka's LocalLog.flush fsyncs the directory when it flushes a segment at or above the recovery
        # point, Utils.flushDirIfExists).
        self._dir_changes = 0
        self._dir_synced = 0
        self._failed: str | None = None
        # Called with (this log, the error) on every I/O failure of an opened log, before the operation
        # raises: the ``LogManager`` reports it as a failure of its data dir (Kafka's LogDirFailureChannel).
        self.on_io_failure: Callable[[Log, str], None] | None = None
        self._log = log.bind(topic=tp.topic, partition=tp.partition)

    # ---- open and recovery ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, dir: Path, config: LogConfig, clock: Clock, *, recovery_point: int = 0,
             log_start_offset: int | None = None) -> Log:
        """Open (creating if needed) and recover a partition directory. Blocking."""
        self = cls(dir, config, clock, parse_topic_partition(dir))
        try:
            dir.mkdir(parents=True, exist_ok=True)
            self._load(recovery_point, log_start_offset)
        except (OSError, InvalidBatchError, checkpoint.CheckpointError, StorageError) as exc:
            self._close_segments()
            raise StorageError(f"{dir}: cannot open log: {exc}") from exc
        return self

    def _load(self, recovery_point: int, log_start_offset: int | None) -> None:
        bases = self._clean_directory()
        entries = self._read_epochs()
        epochs_unreadable = entries is None
        self.epoch_cache = LeaderEpochCache(entries, on_change=self._write_epochs)
        floor = max([b for b in bases if b <= recovery_point], default=bases[0] if bases else 0)
        now = self.clock.now_ms()
        epoch_mismatch: int | None = None  # first validated batch whose epoch the cache has wrong
        prev_epoch = -1
        for i, base in enumerate(bases):
            if base < floor:
                seg, result = LogSegment.open_existing(self.dir, base, self.config.index_interval_bytes, now,
                                                       self.epoch_cache, self._last_epoch)
                if result is not None:
                    self._log.warning("segment_indexes_rebuilt", base_offset=base, offset=seg.next_offset,
                                      truncated_bytes=result.truncated_bytes, reason=result.reason)
            else:
                if base == floor:
                    prev_epoch = self._last_epoch()
                seg, result = self._recover_segment(base, now, recovery_point if base == floor else None,
                                                    prev_epoch)
                prev_epoch = result.last_epoch
            if result is not None and epoch_mismatch is None:
                epoch_mismatch = result.epoch_mismatch
            self.segments.append(seg)
            # A segment that was validated (past the recovery point, or below it with indexes that failed the
            # sanity checks) and does not end where the next begins was cut: everything after it goes, as
            # Kafka's recoverLog deletes all segments after an invalid batch. Offsets stay contiguous (safety
            # invariant 3) and the replica fetches the rest again. Kafka's loadSegmentFiles ignores the cut of
            # a segment below the recovery point (recoverSegment) and keeps the later ones: a hole, in which
            # reads return the next segment's batches; we follow its recovery rule instead. Failing the log
            # (StorageError) would take the partition offline for damage that a refetch repairs.
            if ((seg.base_offset >= floor or result is not None) and i + 1 < len(bases)
                    and seg.next_offset != bases[i + 1]):
                self._drop_after(bases[i + 1:], seg)
                break
            if i + 1 < len(bases) and seg.next_offset != bases[i + 1]:
                # two trusted segments that do not meet (a segment file gone, or one whose indexes were
                # believed over a damaged tail): a hole reads return the next segment's batches across, as in
                # Kafka, which does not look. Said, so that an operator can tell where offsets are missing.
                self._log.warning("log_has_a_hole", offset=seg.next_offset, next_segment_base_offset=bases[i + 1])
        if not self.segments:
            start = log_start_offset or 0
            self.segments.append(LogSegment.create(self.dir, start, self.config.index_interval_bytes, now))
            self._dir_changes += 1
        self._bases = [s.base_offset for s in self.segments]
        self.log_end_offset = self.segments[-1].next_offset
        self.log_start_offset = opened_log_start(log_start_offset, self.segments[0].base_offset,
                                                 self.log_end_offset)
        if epochs_unreadable:
            self._rebuild_epochs()
        elif epoch_mismatch is not None:
            # Kafka's recovery assigns each recovered batch's epoch to the cache, so a wrong cache heals;
            # here the whole cache is rebuilt from the batches, which also mends what it says about the
            # trusted ones (a checkpoint that is wrong at one offset is not to be believed at the others).
            self._log.warning("epoch_checkpoint_disagrees_with_log", offset=epoch_mismatch,
                              entries=[(e.epoch, e.start_offset) for e in self.epoch_cache.entries()])
            self._rebuild_epochs()
        elif (contradicted := self._epochs_of_end_batches_contradicted()) is not None:
            # after a clean stop no batch is validated against the cache, so a checkpoint that parses but is
            # wrong (one changed digit) was believed: a leader then refused every append as stale, a follower
            # every fetched batch. The first and the last batch are read (two headers) to check it.
            self._log.warning("epoch_checkpoint_disagrees_with_log", offset=contradicted,
                              entries=[(e.epoch, e.start_offset) for e in self.epoch_cache.entries()])
            self._rebuild_epochs()
        # Entries past the LEO describe lost data; one AT the LEO is a leader's assignment with no data yet.
        self.epoch_cache.truncate_from_end(self.log_end_offset + 1)
        if not self.epoch_cache.entries() and self.log_end_offset > self.log_start_offset:
            # A missing (or empty) checkpoint over stamped batches is as wrong as an unreadable one: rebuilt
            # too. Nothing is written when no batch carries an epoch (>= 0): the cache is right empty. Nor when
            # every batch is below the log start: a truncation at the LEO there leaves the cache empty (as
            # Kafka's truncateTo does to the entry at the LEO), and a restart must not bring it back.
            self._rebuild_epochs(only_if_found=True)
        self.epoch_cache.truncate_from_start(self.log_start_offset)
        self.recovery_point = self.log_end_offset
        self._load_producer_state()
        self._log.info("log_opened", log_start_offset=self.log_start_offset, offset=self.log_end_offset,
                       segments=len(self.segments), leader_epoch=self.epoch_cache.latest_epoch(),
                       producers=len(self.producer_state))

    def _epochs_of_end_batches_contradicted(self) -> int | None:
        """During ``_load``: the base offset of the first batch at the log start, or of the last batch, when
        the epoch cache says another epoch held it than the batch carries (None when both agree; a batch that
        carries no epoch, or an empty cache, is left to the rules after the call in ``_load``)."""
        if not self.epoch_cache.entries() or self.log_end_offset <= self.log_start_offset:
            return None
        ends = []
        for seg in self.segments:  # the first batch holding an offset at or past the log start
            if seg.size and seg.next_offset > self.log_start_offset:
                ends.append(seg.position_of(self.log_start_offset))
                break
        last = next((seg for seg in reversed(self.segments) if seg.size), None)
        if last is not None:
            ends.append(last.position_of(last.next_offset - 1))
        for found in ends:
            if found is None:
                continue
            header = found[1]
            epoch = header.partition_leader_epoch
            if epoch >= 0 and self.epoch_cache.epoch_for_offset(max(header.base_offset,
                                                                     self.log_start_offset)) != epoch:
                return header.base_offset
        return None

    def _clean_directory(self) -> list[int]:
        """Remove leftovers (temp files, orphan indexes); the sorted segment base offsets."""
        bases = []
        for path in self.dir.iterdir():
            name, _, ext = path.name.partition(".")
            base = segment_base(path.name)
            if path.name.endswith((".tmp", ".deleted", ".cleaned", ".swap")):
                path.unlink(missing_ok=True)
            elif base is not None:
                bases.append(base)
            elif ext in ("index", "timeindex") and not (self.dir / f"{name}.log").exists():
                path.unlink(missing_ok=True)
        return sorted(bases)

    def _last_epoch(self) -> int:
        """During ``_load``: the leader epoch of the last batch of the segments opened so far (-1 if none)."""
        for seg in reversed(self.segments):
            if seg.size:
                return seg.last_epoch()
        return -1

    def _recover_segment(self, base: int, now: int, recovery_point: int | None,
                         prev_epoch: int) -> tuple[LogSegment, RecoveryResult]:
        fd = os.open(log_path(self.dir, base), os.O_RDWR | os.O_APPEND)
        seg = LogSegment(self.dir, base, fd, self.config.index_interval_bytes, now)
        result = seg.recover(self.epoch_cache, recovery_point, prev_epoch)
        if result.truncated_bytes:
            self._log.warning("log_recovery_truncated", base_offset=base, offset=seg.next_offset,
                              position=result.valid_bytes, truncated_bytes=result.truncated_bytes,
                              reason=result.reason)
        seg.flush()
        return seg, result

    def _drop_after(self, bases: Sequence[int], seg: LogSegment) -> None:
        self._log.warning("log_recovery_dropped_segments", offset=seg.next_offset, base_offsets=list(bases))
        for base in bases:
            doomed = LogSegment(self.dir, base, -1, self.config.index_interval_bytes, 0)
            doomed.delete()

    def _read_epochs(self) -> list[EpochEntry] | None:
        """The checkpointed epoch entries; None when the file is there but unreadable."""
        path = self.dir / EPOCH_CHECKPOINT
        try:
            return checkpoint.read_epochs(path)
        except checkpoint.CheckpointError as exc:
            self._log.warning("epoch_checkpoint_unreadable", error=str(exc))
            return None

    def _rebuild_epochs(self, *, only_if_found: bool = False) -> None:
        """The epoch cache from the batches' own leader epochs (each epoch starts at the first batch that
        carries it), for an unreadable checkpoint or one the recovered batches contradict. An empty cache
        would answer OffsetsForLeaderEpoch wrongly: as a leader, an older epoch would end where its own
        began, and a follower could keep data it wrote in an older epoch that the leader never had (Kafka
        takes the log dir offline). The old cache's last entry is kept if it starts at the LEO with a newer
        epoch than any batch: a leader's assignment before its first append, which no batch can show.
        ``only_if_found``: leave the cache (and file) alone if no batch carries an epoch."""
        old = self.epoch_cache.latest_entry()
        entries: list[EpochEntry] = []
        for seg in self.segments:
            if not seg.size:
                continue
            with mmap.mmap(seg.fd, seg.size, access=mmap.ACCESS_READ) as view:  # headers only are read
                for _pos, header in iter_batches(view):
                    epoch = header.partition_leader_epoch
                    if epoch >= 0 and (not entries or epoch > entries[-1].epoch):
                        entries.append(EpochEntry(epoch, header.base_offset))
        if (old is not None and old.start_offset == self.log_end_offset
                and (not entries or (old.epoch > entries[-1].epoch and old.start_offset > entries[-1].start_offset))):
            entries.append(old)
        if only_if_found and not entries:
            return
        self.epoch_cache = LeaderEpochCache(entries, on_change=self._write_epochs)
        self._write_epochs(self.epoch_cache.entries())
        self._log.warning("epoch_checkpoint_rebuilt", entries=len(entries),
                          leader_epoch=self.epoch_cache.latest_epoch())

    def _load_producer_state(self) -> None:
        """The producer state after recovery: the newest usable snapshot, then the batch headers from its
        offset on; without one, every batch header of the log. As Kafka's ``UnifiedLog.loadProducerState``.

        A snapshot at offset X describes the batches below X (and the producers of batches retention has
        deleted since, which a replay cannot find: why snapshots are taken at every roll, not only at a
        clean close). It is used only if X is at most the recovered LEO: recovery after a power loss may
        cut the log below a snapshot written before it (then it would claim batches no longer in the log).
        Any truncation below X deletes the snapshot first (``_delete_producer_snapshots_above``), so the
        batches below an X <= the LEO are the ones it describes. Snapshots above the LEO, and damaged ones,
        are deleted (durably: a later truncation must not find one it does not know about); a damaged one
        falls back to the next older."""
        # regular files only, as Kafka's isSnapshotFile: a directory so named failed the whole broker's start
        found = sorted(o for p in self.dir.iterdir() if (o := snapshot_offset(p.name)) is not None and p.is_file())
        doomed = [o for o in found if o > self.log_end_offset]
        for offset in doomed:
            self._log.warning("producer_snapshot_ahead_of_log", snapshot_offset=offset, offset=self.log_end_offset)
        usable = [o for o in found if o <= self.log_end_offset]
        replay_from = 0
        while usable:
            offset = usable.pop()
            try:
                at, entries = decode_snapshot(snapshot_path(self.dir, offset).read_text())  # SnapshotError
                if at != offset:
                    raise ValueError(f"holds offset {at}, named {offset}")
            except (OSError, ValueError) as exc:  # also UnicodeDecodeError
                self._log.warning("producer_snapshot_unreadable", snapshot_offset=offset, error=str(exc))
                doomed.append(offset)
                continue
            self.producer_state.load(entries)
            self._snapshots = [*usable, offset]
            replay_from = offset
            break
        if doomed:
            for offset in doomed:
                snapshot_path(self.dir, offset).unlink(missing_ok=True)
            checkpoint.fsync_dir(self.dir)
        self._replay_producer_state(replay_from)

    def _replay_producer_state(self, from_offset: int) -> None:
        """Apply the idempotent batches from ``from_offset`` (a batch boundary) on, reading their headers
        (one 61-byte unpack per batch, through the page cache). Batches below the log start still in a
        segment are applied too: retention does not forget producers. Their entries take the time of the
        open as their last activity (see ``ProducerEntry``)."""
        state, now = self.producer_state, self.clock.now_ms()
        for seg in self.segments:
            if not seg.size or seg.next_offset <= from_offset:
                continue
            with mmap.mmap(seg.fd, seg.size, access=mmap.ACCESS_READ) as view:  # headers only are read
                for _pos, h in iter_batches(view):
                    if h.producer_id >= 0 and h.base_offset >= from_offset:
                        state.apply((ProducerBatch(h.producer_id, h.producer_epoch, h.base_sequence,
                                                   h.record_count, h.base_offset,
                                                   h.base_offset + h.last_offset_delta),), now)

    def _take_producer_snapshot(self) -> None:
        """The producer state at the LEO as ``<LEO>.snapshot``, atomically (temp file, fsync, rename, directory
        fsync); at each roll and at a clean close, as Kafka's ``takeSnapshot``. Skipped while there is nothing
        to remember (no producers, no older snapshot to supersede), so logs without idempotent producers never
        pay for it. Kafka 3.5+ fsyncs the roll's snapshot on its scheduler (KAFKA-15046); here it is inline,
        as before that, on the rolls of logs with idempotent producers only. A failure leaves the older
        snapshots, which still hold: a warning."""
        offset = self.log_end_offset
        if not self.producer_state and not self._snapshots:
            return
        try:
            checkpoint.write_atomic(snapshot_path(self.dir, offset),
                                    encode_snapshot(offset, self.producer_state.entries()))
        except OSError as exc:
            self._log.warning("producer_snapshot_not_written", snapshot_offset=offset, error=str(exc))
            self._report_io_failure(exc)
            return
        if not self._snapshots or self._snapshots[-1] < offset:  # the LEO never goes below the newest one
            self._snapshots.append(offset)

    def _delete_producer_snapshots_above(self, offset: int) -> None:
        """Delete the snapshots that describe batches at or after ``offset`` (about to be cut); durably
        (directory fsync) before the cut, so no crash leaves one over a log without those batches."""
        doomed = [o for o in self._snapshots if o > offset]
        if not doomed:
            return
        try:
            for o in doomed:
                snapshot_path(self.dir, o).unlink(missing_ok=True)
            checkpoint.fsync_dir(self.dir)
        except OSError as exc:
            self._fail(exc)
        self._snapshots = [o for o in self._snapshots if o <= offset]

    def _delete_producer_snapshots_before(self, offset: int) -> None:
        """After retention: keep the newest snapshot at or below ``offset`` (the first segment's base) and
        those after it; older ones are never read again (Kafka's ``deleteSnapshotsBefore``)."""
        keep_from = max((o for o in self._snapshots if o <= offset), default=None)
        if keep_from is None:
            return
        for o in [o for o in self._snapshots if o < keep_from]:
            try:
                snapshot_path(self.dir, o).unlink(missing_ok=True)
            except OSError as exc:  # harmless here: an old snapshot is only read if every newer one is damaged;
                self._log.warning("producer_snapshot_not_deleted", snapshot_offset=o, error=str(exc))
                self._report_io_failure(exc)  # but an I/O error is the data dir's failure all the same
                continue
            self._snapshots.remove(o)

    def remove_expired_producers(self, expiration_ms: int) -> int:
        """Forget producers with no append for ``expiration_ms`` (``producer.id.expiration.ms``). -> count."""
        removed = self.producer_state.remove_expired(self.clock.now_ms(), expiration_ms)
        if removed:
            self._log.info("producers_expired", count=removed, producers=len(self.producer_state))
        return removed

    def _write_epochs(self, entries: list[EpochEntry]) -> None:
        try:
            checkpoint.write_epochs(self.dir / EPOCH_CHECKPOINT, entries)
        except OSError as exc:
            self._fail(exc)

    # ---- appending -----------------------------------------------------------------------------------------
    def append_as_leader(self, records: bytes | bytearray, leader_epoch: int) -> AppendInfo:
        """Assign offsets from the LEO and stamp ``leader_epoch`` (records already validated).

        The stamped header prefix (base_offset, batch_length, epoch: bytes 0-16) is written from a
        small buffer and the rest straight from ``records`` with one ``os.writev``: no copy."""
        if self._failed is not None:
            self._check_usable()
        if self.epoch_cache.latest_epoch() != leader_epoch:
            self._leader_epoch_check(leader_epoch)
        n = len(records)
        if n >= HEADER_SIZE:
            f = _HEADER_FIELDS.unpack_from(records, 0)
            seg, cfg = self.segments[-1], self.config
            first_ts = seg.first_batch_timestamp
            # The hot path (one batch, no roll due): a few microseconds of Python per batch matter
            # next to a ~7 µs write of 16 KiB, so it skips the general path's lists and calls.
            # ``f[9] < 0``: producer_id -1; idempotent batches take the general path (producer state checks).
            if (f[1] + LOG_OVERHEAD == n and f[9] < 0 and f[1] >= MIN_BATCH_LENGTH
                    and seg.size + n <= cfg.segment_bytes
                    and first_ts is not None and 0 <= f[8] - first_ts <= cfg.segment_ms and first_ts >= 0
                    and self.log_end_offset + f[6] - seg.base_offset <= 0xFFFFFFFF):
                offset = self.log_end_offset
                next_offset = offset + f[6] + 1
                try:
                    seg.append_one(_STAMP_PREFIX.pack(offset, f[1], leader_epoch), memoryview(records)[16:], n,
                                   offset, f[8])
                except OSError as exc:
                    self._fail(exc)
                seg.next_offset = self.log_end_offset = next_offset
                self._unflushed_messages += f[12]
                if self._unflushed_messages >= cfg.flush_messages or cfg.flush_ms < _NEVER_MS:
                    self.maybe_flush()
                return AppendInfo(offset, next_offset - 1, f[12], f[8], n, 1)
        view = memoryview(records)
        chunks: list[bytes | memoryview] = []
        metas: list[BatchMeta] = []
        idempotent: list[ProducerBatch] | None = None
        offset, pos, num_records, max_ts = self.log_end_offset, 0, 0, -1
        while pos < n:
            f = self._frame(records, pos, n)
            size, lod, batch_max_ts, count = f[1] + LOG_OVERHEAD, f[6], f[8], f[12]
            if f[9] >= 0:
                if idempotent is None:
                    idempotent = []
                idempotent.append(ProducerBatch(f[9], f[10], f[11], count, offset, offset + lod))
            chunks.append(_STAMP_PREFIX.pack(offset, size - LOG_OVERHEAD, leader_epoch))
            chunks.append(view[pos + 16:pos + size])
            metas.append((offset, size, batch_max_ts, offset + lod + 1))
            offset += lod + 1
            pos += size
            num_records += count
            if batch_max_ts > max_ts:
                max_ts = batch_max_ts
        if idempotent is None:
            return self._append(chunks, n, metas, num_records, max_ts)
        # Checked before anything is written; applied only once the write succeeded (all or nothing).
        dup = self.producer_state.check(idempotent, len(metas))
        if dup is not None:
            return AppendInfo(dup.first_offset, dup.last_offset, 0, -1, 0, 0, True)
        info = self._append(chunks, n, metas, num_records, max_ts)
        self.producer_state.apply(idempotent, self.clock.now_ms())
        return info

    def _leader_epoch_check(self, leader_epoch: int) -> None:
        if leader_epoch < 0:
            raise ValueError(f"leader epoch {leader_epoch} < 0")
        latest = self.epoch_cache.latest_epoch()
        if latest is not None and leader_epoch < latest:
            raise StaleLeaderEpochError(f"{self.topic_partition}: leader epoch {leader_epoch} < latest {latest}")
        self.epoch_cache.assign(leader_epoch, self.log_end_offset)

    def append_as_follower(self, records: bytes) -> AppendInfo:
        """Append the leader's batches as they are; they must start at the LEO and be contiguous."""
        self._check_usable()
        metas: list[BatchMeta] = []
        expected, pos, n, num_records, max_ts = self.log_end_offset, 0, len(records), 0, -1
        epochs: list[tuple[int, int]] = []
        idempotent: list[ProducerBatch] | None = None
        while pos < n:
            f = self._frame(records, pos, n)
            size, lod, batch_max_ts, count = f[1] + LOG_OVERHEAD, f[6], f[8], f[12]
            base, epoch = f[0], f[2]
            if base != expected:
                raise OffsetMismatchError(f"{self.topic_partition}: batch at offset {base}, expected {expected}")
            if f[9] >= 0:  # the leader checked it; a follower only records it (Kafka: AppendOrigin.REPLICATION)
                if idempotent is None:
                    idempotent = []
                idempotent.append(ProducerBatch(f[9], f[10], f[11], count, base, base + lod))
            metas.append((base, size, batch_max_ts, base + lod + 1))
            if not epochs or epochs[-1][0] != epoch:
                epochs.append((epoch, base))
            expected = base + lod + 1
            pos += size
            num_records += count
            max_ts = max(max_ts, batch_max_ts)
        self._follow_epochs(epochs)
        info = self._append([records], n, metas, num_records, max_ts)
        if idempotent is not None:
            self.producer_state.apply(idempotent, self.clock.now_ms())
        return info

    def _follow_epochs(self, epochs: list[tuple[int, int]]) -> None:
        """Assign the batches' (epoch, base offset) to the cache, all checked before any is applied.

        Epochs never decrease along the log: a batch older than the epoch of the data before it is
        refused. A cache entry at or past the batch (an assignment with no data, e.g. this replica
        led briefly and wrote nothing) is superseded by the leader's data."""
        sim = [(e.epoch, e.start_offset) for e in self.epoch_cache.entries()]
        for epoch, base in epochs:
            before = [e for e, start in sim if start < base]
            if epoch < 0 and sim:
                raise StaleLeaderEpochError(f"{self.topic_partition}: unstamped batch at {base} after epoch "
                                            f"{sim[-1][0]}")
            if before and epoch < before[-1]:
                raise StaleLeaderEpochError(f"{self.topic_partition}: batch epoch {epoch} at {base} is older "
                                            f"than epoch {before[-1]} before it")
            if epoch >= 0:
                sim = [(e, start) for e, start in sim if start < base]
                if not sim or sim[-1][0] != epoch:
                    sim.append((epoch, base))
        for epoch, base in epochs:
            if epoch < 0:
                continue
            latest = self.epoch_cache.latest_entry()
            if latest is not None and latest.start_offset >= base:
                self.epoch_cache.truncate_from_end(base)
            self.epoch_cache.assign(epoch, base)

    def _frame(self, records: bytes | bytearray, pos: int, n: int) -> tuple[Any, ...]:
        """The header fields (``_HEADER_FIELDS``) of the batch at ``pos``, its length checked."""
        if n - pos < 61:
            raise BatchTooShortError(f"partial batch header at {pos}")
        f = _HEADER_FIELDS.unpack_from(records, pos)
        size = f[1] + LOG_OVERHEAD
        if f[1] < MIN_BATCH_LENGTH or pos + size > n:
            raise BatchTooShortError(f"batch at {pos}: length {f[1]} exceeds the {n - pos} bytes left")
        if size > self.config.segment_bytes:
            raise BatchTooLargeError(f"batch of {size} bytes > segment.bytes {self.config.segment_bytes}")
        return f

    def _append(self, chunks: Sequence[bytes | memoryview], nbytes: int, metas: list[BatchMeta],
                num_records: int, max_ts: int) -> AppendInfo:
        if not metas:
            raise ValueError("nothing to append")
        cfg = self.config
        seg = self.segments[-1]
        first_ts = seg.first_batch_timestamp
        if seg.size and (seg.size > cfg.segment_bytes - nbytes or first_ts is None or first_ts < 0
                         or max_ts - first_ts > cfg.segment_ms or metas[-1][3] - seg.base_offset > 0xFFFFFFFF) \
                and seg.should_roll(nbytes, max_ts, self.clock, cfg.segment_bytes, cfg.segment_ms,
                                    metas[-1][3] - 1):
            self.roll()
            seg = self.segments[-1]
        try:
            seg.append(chunks, nbytes, metas)
        except OSError as exc:
            self._fail(exc)
        first = metas[0][0]
        self.log_end_offset = metas[-1][3]
        self._unflushed_messages += num_records
        if self._unflushed_messages >= cfg.flush_messages or cfg.flush_ms < _NEVER_MS:
            self.maybe_flush()
        return AppendInfo(first, self.log_end_offset - 1, num_records, max_ts, nbytes, len(metas))

    # ---- reading -------------------------------------------------------------------------------------------
    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_batch: bool = True) -> FetchData:
        """Whole batches from the one holding ``start_offset``, at most ``max_bytes`` (at least one
        batch if ``min_one_batch``), none with an offset >= ``max_offset`` (default: the LEO).
        Reads one segment; may return fewer bytes than allowed (the end is a known index entry)."""
        if self._failed is not None:
            self._check_usable()
        leo = self.log_end_offset
        if start_offset < self.log_start_offset or start_offset > leo:
            raise OffsetOutOfRangeError(f"{self.topic_partition}: offset {start_offset} outside "
                                        f"[{self.log_start_offset}, {leo}]")
        limit = leo if max_offset is None else min(max_offset, leo)
        if start_offset >= limit:
            return EMPTY_FETCH
        segments = self.segments
        i = max(bisect_right(self._bases, start_offset) - 1, 0)
        try:
            while i < len(segments):
                data = segments[i].read(start_offset, max_bytes, limit, min_one_batch)
                if data is not None:
                    return FetchData(data, _STAMP_PREFIX.unpack_from(data)[0]) if data else EMPTY_FETCH
                i += 1
        except OSError as exc:
            self._fail(exc)
        return EMPTY_FETCH

    def fetch_offset_by_timestamp(self, ts: int) -> TimestampOffset | None:
        """First record with timestamp >= ts at or after the log start; -1 latest, -2 earliest, -3 the first
        record carrying the largest timestamp (see ``_max_timestamp_offset``)."""
        self._check_usable()
        if ts == MAX_TIMESTAMP:
            return self._max_timestamp_offset()
        if ts == LATEST_TIMESTAMP:
            latest = self.latest_epoch()
            return TimestampOffset(-1, self.log_end_offset, -1 if latest is None else latest)
        if ts == EARLIEST_TIMESTAMP:
            epoch = self.epoch_cache.epoch_for_offset(self.log_start_offset)
            return TimestampOffset(-1, self.log_start_offset, -1 if epoch is None else epoch)
        for seg in self.segments:
            if seg.rule.max_timestamp < ts or seg.next_offset <= self.log_start_offset:
                continue
            try:
                found = seg.find_timestamp(ts, self.log_start_offset)
            except OSError as exc:
                self._fail(exc)
            if found is not None:
                return TimestampOffset(*found)
        return None

    def _max_timestamp_offset(self) -> TimestampOffset | None:
        """Kafka's ListOffsets MAX_TIMESTAMP (KIP-734, ``UnifiedLog.fetchOffsetByTimestamp``): the segment with
        the largest timestamp (the first of equals), and in it the first record carrying that timestamp; None
        for an empty log. Kafka looks at whole segments; here batches below the log start are left out, as in
        the lookups by time, so that the answer is never an offset a consumer cannot read."""
        best: tuple[int, LogSegment] | None = None
        try:
            for seg in self.segments:
                if seg.next_offset <= self.log_start_offset:
                    continue
                top = seg.max_timestamp_from(self.log_start_offset)
                if top is not None and (best is None or top > best[0]):
                    best = top, seg
            found = best[1].find_timestamp(best[0], self.log_start_offset) if best is not None else None
        except OSError as exc:
            self._fail(exc)
        return TimestampOffset(*found) if found is not None else None

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epoch_cache.end_offset_for(epoch, self.log_end_offset)

    def latest_epoch(self) -> int | None:
        return self.epoch_cache.latest_epoch()

    def maybe_assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        """What a new leader does: its epoch starts at its LEO (a stale epoch is ignored).

        ``start_offset`` must be the LEO: an earlier one would claim batches already written under
        older epochs (recovery would then take the cache for damaged and rebuild it from the batches)."""
        if start_offset != self.log_end_offset:
            raise ValueError(f"{self.topic_partition}: epoch {epoch} must start at the LEO "
                             f"{self.log_end_offset}, not {start_offset}")
        self.epoch_cache.assign(epoch, start_offset)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # ---- rolling and flushing ------------------------------------------------------------------------------
    def maybe_roll(self) -> None:
        seg = self.segments[-1]
        if seg.should_roll(0, self.clock.now_ms(), self.clock, self.config.segment_bytes,
                           self.config.segment_ms, self.log_end_offset):
            self.roll()

    def roll(self) -> None:
        """Start a new active segment at the LEO (no-op when the active one is empty)."""
        self._check_usable()
        old = self.segments[-1]
        if old.size == 0:
            return
        try:
            old.persist_indexes(fsync=False)
            if self.defer_roll_flush:
                self._rolled_unflushed.append(old)
            else:
                old.flush()
            new = LogSegment.create(self.dir, self.log_end_offset, self.config.index_interval_bytes,
                                    self.clock.now_ms())
            self._dir_changes += 1
            if not self.defer_roll_flush:
                self._sync_dir()  # the rolled segment's entry (and the new one's) before the recovery point moves
        except OSError as exc:
            self._fail(exc)
        self.segments.append(new)
        self._bases.append(new.base_offset)
        self._take_producer_snapshot()
        if not self.defer_roll_flush and not any(s.unflushed for s in self.segments[:-1]):
            self.recovery_point = max(self.recovery_point, new.base_offset)
        self._log.info("segment_rolled", base_offset=new.base_offset, offset=self.log_end_offset)

    async def flush_rolled_segments(self) -> None:
        """fsync segments rolled with ``defer_roll_flush`` in a worker thread; then move the recovery point."""
        segs, self._rolled_unflushed = self._rolled_unflushed, []
        segs = [s for s in segs if s.fd >= 0]
        if not segs:
            return
        upto, generation, dir_changes = segs[-1].next_offset, self._generation, self._dir_changes
        fds = [os.dup(s.fd) for s in segs]  # a deletion meanwhile closes the originals, not these
        for s in segs:
            for path in (ix.offset_index_path(s.dir, s.base_offset), ix.time_index_path(s.dir, s.base_offset)):
                with contextlib.suppress(FileNotFoundError):
                    fds.append(os.open(path, os.O_RDONLY))
        if dir_changes != self._dir_synced:
            # after the files: the directory holds the entries of the segments just rolled and their
            # successors (a directory renamed away for deletion meanwhile needs none: Kafka's flushDirIfExists)
            with contextlib.suppress(FileNotFoundError):
                fds.append(os.open(self.dir, os.O_RDONLY))
        try:
            await asyncio.to_thread(_fsync_all, fds)
        except OSError as exc:
            self._fail(exc)
        finally:
            for fd in fds:
                os.close(fd)
        self._dir_synced = max(self._dir_synced, dir_changes)
        if generation != self._generation:
            # Truncated meanwhile: those segments may hold new, unflushed data. The ones still rolled go back
            # in the queue for the next round; dropped, they stayed unflushed and held the recovery point
            # where it was until a full flush (a clean shutdown, by default), so a crash re-validated them all.
            # (Kafka flushes up to an offset, so a later flush covers what an earlier one skipped.)
            active, queued = self.segments[-1], set(map(id, self._rolled_unflushed))
            back = [s for s in segs if s.fd >= 0 and s is not active and s.unflushed and id(s) not in queued]
            self._rolled_unflushed[:0] = back
            return
        for s in segs:
            s.unflushed = False
        if not any(s.unflushed for s in self.segments[:-1]):
            self.recovery_point = max(self.recovery_point, min(upto, self.log_end_offset))

    async def unlink_deleted_segments(self) -> None:
        """Unlink the files of segments deleted with ``defer_file_deletion``, in a worker thread."""
        paths, self._pending_deletions = self._pending_deletions, []
        if paths:
            error = await asyncio.to_thread(_unlink_all, paths)
            if error is not None:  # the leftovers go at the next open; the failure is the data dir's
                self._log.warning("segment_files_not_deleted", error=str(error))
                self._report_io_failure(error)

    def maybe_flush(self) -> None:
        """fsync if ``flush.messages`` or ``flush.ms`` says so."""
        if self._unflushed_messages == 0:
            return
        if (self._unflushed_messages >= self.config.flush_messages
                or self.clock.monotonic_ms() - self._last_flush_ms >= self.config.flush_ms):
            self.flush()

    def flush(self) -> None:
        """fsync every segment with unflushed data (and its indexes); recovery point := LEO."""
        self._check_usable()
        try:
            for seg in self.segments:
                if seg.unflushed:
                    seg.flush()
            self._sync_dir()
        except OSError as exc:
            self._fail(exc)
        self._rolled_unflushed = []
        self.recovery_point = self.log_end_offset
        self._unflushed_messages = 0
        self._last_flush_ms = self.clock.monotonic_ms()

    def _sync_dir(self) -> None:
        """fsync the partition directory if a segment was created since the last time (``_dir_changes``)."""
        changes = self._dir_changes
        if changes != self._dir_synced:
            checkpoint.fsync_dir(self.dir)
            self._dir_synced = changes

    # ---- truncation and retention --------------------------------------------------------------------------
    def truncate_to(self, offset: int) -> bool:
        """Remove every batch holding an offset >= ``offset``; True if anything was removed."""
        self._check_usable()
        if offset < 0:
            raise ValueError(f"cannot truncate to {offset}")
        if offset >= self.log_end_offset:
            # Nothing to cut, but (as Kafka's UnifiedLog.truncateTo) drop epoch entries starting at the LEO:
            # a leader deposed before it appended anything left one, and it would make this replica
            # claim an epoch the new leader never saw.
            self.epoch_cache.truncate_from_end(self.log_end_offset)
            return False
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return True
        old_leo = self.log_end_offset
        # a snapshot at ``offset`` (a batch boundary) describes only batches below the cut: it stays
        self._delete_producer_snapshots_above(offset)
        try:
            while len(self.segments) > 1 and self.segments[-1].base_offset > offset:
                self._pending_deletions += self.segments.pop().delete(defer=self.defer_file_deletion)
                self._bases.pop()
            self.segments[-1].truncate_to(offset)
            if self.segments[-1].size == 0:  # as if new: segment.ms counts from now (Kafka's LogSegment.truncateTo)
                self.segments[-1].created_ms = self.clock.now_ms()
        except OSError as exc:
            self._fail(exc)
        if self.segments[-1].next_offset < self.log_start_offset:
            # the batch holding ``offset`` began below the log start: nothing readable is left
            self.truncate_fully_and_start_at(offset)
            return True
        self._after_truncation(self.segments[-1].next_offset)
        self._reload_producer_state()
        # ``log_truncated`` is the broker's event (replica_manager, with the reason); this is the storage detail
        self._log.debug("segments_truncated", offset=self.log_end_offset, previous_offset=old_leo,
                        leader_epoch=self.epoch_cache.latest_epoch())
        return True

    def _reload_producer_state(self) -> None:
        """The producer state after a truncation, as Kafka's ``UnifiedLog.truncateTo``
        (``ProducerStateManager.truncateAndReload``, then ``loadProducerState``): the snapshots above the cut
        are gone already, so the newest one at or below it is loaded and the batch headers from there to the
        new LEO are replayed (``_load_producer_state``, as at open). Dropping only the cut batches from the
        cache is not enough: a producer whose cached batches were all cut would be forgotten although older
        batches of it remain, so this replica would accept a sequence gap from it as leader and its state
        would differ from a replica that never had the cut batches.

        The replay reads every batch header from that snapshot (the last roll) to the cut, ~2.6 us a batch
        (100,000 one-record batches: 260 ms on the event loop), so it runs only when needed, where Kafka
        always replays on its fetcher thread: not while there is no producer and no snapshot (a log no
        idempotent producer writes to), and not when every producer with a cut batch keeps at least one
        cached batch (``ProducerStateManager.truncate_from`` drops the cut ones). A producer that expired
        with batches still in the log comes back from the replay, as in Kafka; it expires again."""
        if not self.producer_state and not self._snapshots:
            return
        if self.producer_state.truncate_from(self.log_end_offset):
            return
        self.producer_state.clear()
        self._snapshots = []
        try:
            self._load_producer_state()
        except OSError as exc:
            self._fail(exc)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete everything; the log restarts empty at ``offset`` (a follower far behind the leader)."""
        self._check_usable()
        if offset < 0:
            raise ValueError(f"cannot start at {offset}")
        self._delete_producer_snapshots_above(-1)
        try:
            for seg in self.segments:
                self._pending_deletions += seg.delete(defer=self.defer_file_deletion)
            self.segments = [LogSegment.create(self.dir, offset, self.config.index_interval_bytes,
                                               self.clock.now_ms())]
            self._dir_changes += 1
        except OSError as exc:
            self._fail(exc)
        self._bases = [offset]
        self.log_start_offset = offset
        self.epoch_cache.clear()
        self.producer_state.clear()
        self._after_truncation(offset)
        self._log.info("log_truncated_fully", offset=offset)

    def _after_truncation(self, leo: int) -> None:
        self.log_end_offset = leo
        self.epoch_cache.truncate_from_end(leo)
        self.recovery_point = min(self.recovery_point, leo)
        # A rolled segment the cut made active again is not a rolled one any more: its deferred flush would
        # mark the appends made during its fsync flushed (``flush`` would then skip it and still move the
        # recovery point to the LEO). It keeps ``unflushed`` and goes with the next ``flush``.
        active = self.segments[-1]
        self._rolled_unflushed = [s for s in self._rolled_unflushed if s.fd >= 0 and s is not active]
        self._generation += 1

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start forward (never past the LEO); segments below it go at the next retention run."""
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(f"{self.topic_partition}: log start {offset} > LEO {self.log_end_offset}")
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        self.epoch_cache.truncate_from_start(offset)
        # Producers are kept (Kafka's onLogStartOffsetIncremented too): a retry of a batch below the log
        # start must stay a duplicate. They go when they expire (remove_expired_producers).
        self._log.info("log_start_offset_incremented", log_start_offset=offset)
        return True

    def delete_old_segments(self, high_watermark: int | None = None, *, expire_active: bool = True) -> int:
        """Kafka's retention: delete whole segments, oldest first, that are past ``retention.ms`` (by their
        largest timestamp), beyond ``retention.bytes``, or wholly below the log start offset; never data at or
        above ``high_watermark`` when given. Returns the count.

        The active segment too, when it is not empty and the HW has reached the LEO (Kafka's
        ``LocalLog.deletableSegments``): a new empty one is rolled first (``UnifiedLog.deleteSegments``), so a
        partition nobody writes to any more does not keep its last segment past retention for ever. Not with
        ``expire_active`` False (the log manager spreads those rolls, each a few fsyncs, over its passes)."""
        self._check_usable()
        now, cfg = self.clock.now_ms(), self.config
        total = self.size_bytes
        doomed = 0
        for i, seg in enumerate(self.segments):
            last = i == len(self.segments) - 1
            if last and (seg.size == 0 or not expire_active):
                break
            upper = self.log_end_offset if last else self.segments[i + 1].base_offset
            if high_watermark is not None and upper > high_watermark:
                break
            if not ((cfg.retention_ms >= 0 and now - seg.largest_timestamp_ms() > cfg.retention_ms)
                    or (cfg.retention_bytes >= 0 and total - seg.size >= cfg.retention_bytes)
                    or (not last and upper <= self.log_start_offset)):
                break
            total -= seg.size
            doomed += 1
        if doomed == len(self.segments):
            self.roll()  # at least one segment always: the new, empty one at the LEO
        if doomed:
            self._delete_first(doomed)
        return doomed

    def _delete_first(self, n: int) -> None:
        gone = self.segments[:n]
        self.segments = self.segments[n:]
        self._bases = self._bases[n:]
        self._rolled_unflushed = [s for s in self._rolled_unflushed if s not in gone]
        try:
            for seg in gone:
                self._pending_deletions += seg.delete(defer=self.defer_file_deletion)
        except OSError as exc:
            self._fail(exc)
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        self.epoch_cache.truncate_from_start(self.log_start_offset)  # producers are kept: see above
        self._delete_producer_snapshots_before(self.segments[0].base_offset)
        self._log.info("segments_deleted", count=n, log_start_offset=self.log_start_offset,
                       base_offsets=[s.base_offset for s in gone])

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def update_config(self, config: LogConfig) -> None:
        """New settings; the index interval applies to segments created from now on."""
        self.config = config

    def close(self) -> None:
        """Flush, write the producer snapshot and close the files (idempotent)."""
        if self._failed is None and self.segments and self.segments[0].fd >= 0:
            self.flush()
            self._take_producer_snapshot()
        self._close_segments()

    def _close_segments(self) -> None:
        for seg in self.segments:
            with contextlib.suppress(OSError):
                seg.close()

    def delete(self) -> None:
        """Close the log and remove its directory (``close_for_deletion``, then ``remove_dir``)."""
        self.close_for_deletion()
        self.remove_dir()

    def close_for_deletion(self) -> None:
        """Mark the log unusable, then close its files: on the thread that owns the log (the event loop in the
        broker), so that no periodic flush, retention pass or read finds a segment being closed under it."""
        self._failed = "deleted"
        self._close_segments()

    def remove_dir(self) -> None:
        """Remove the closed log's directory; blocking, fine on a worker thread. The directory is first
        renamed to ``<topic>-<partition>.<hex>-delete`` (Kafka's ``-delete`` suffix): the rename is atomic, so
        the live name is either gone or this raises ``OSError`` (and a retry tries again). A removal that then
        fails half-way leaves only a ``-delete`` directory, which ``LogManager.load`` removes; never files
        under the live name that a topic re-created with that name would open as its own."""
        if self.dir.exists():
            doomed = self.dir.with_name(f"{self.dir.name}.{secrets.token_hex(8)}{DELETED_DIR_SUFFIX}")
            os.rename(self.dir, doomed)
            checkpoint.fsync_dir(self.dir.parent)
            shutil.rmtree(doomed, ignore_errors=True)
        self._log.info("log_deleted")

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise StorageError(f"{self.topic_partition}: log unusable: {self._failed}")

    def _fail(self, exc: OSError) -> NoReturn:
        """An I/O failure: the log is unusable from now on (never half-written), the failure is reported
        (``on_io_failure``; the broker halts on it), and the operation raises ``StorageError``."""
        self._failed = f"{type(exc).__name__}: {exc}"
        self._log.error("log_io_failed", error=self._failed)
        self._report_io_failure(exc)
        raise StorageError(f"{self.topic_partition}: {self._failed}") from exc

    def _report_io_failure(self, exc: OSError) -> None:
        if self.on_io_failure is not None:
            self.on_io_failure(self, f"{type(exc).__name__}: {exc}")


def _unlink_all(paths: list[Path]) -> OSError | None:
    """Unlink every path (a leftover is removed at the next open); the first error, if any."""
    first: OSError | None = None
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            first = first or exc
    return first


def _fsync_all(fds: list[int]) -> None:
    for fd in fds:
        os.fsync(fd)
