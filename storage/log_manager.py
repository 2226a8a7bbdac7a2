"""All partition logs of one broker's data directory.

Layout (the broker owns ``meta.properties``; everything else here is ours)::

    <data-dir>/
      replication-offset-checkpoint       HW per partition (written for the broker)
      recovery-point-offset-checkpoint    offset up to which each log is fsynced
      log-start-offset-checkpoint
      <topic>-<partition>/                one ``Log`` each

Opening a log may validate whole segments, so ``load``, ``get_or_create_log``,
``delete_log`` and ``close`` run the blocking work in ``asyncio.to_thread``;
each ``Log`` is touched by one thread at a time (``close`` must come after
request handling stopped). Checkpoint writes are small (one fsync) and inline.

``start()`` (optional) runs Kafka's periodic log tasks on the event loop:
retention every ``log.retention.check.interval.ms`` (bounded by the HW when a
``high_watermarks`` source is given), the ``flush.ms`` policy, deferred roll
fsyncs and the unlinking of deleted segments (renamed ``*.deleted`` on the
loop, like Kafka's async delete) every second, and the recovery-point / log-start checkpoint every
``log.flush.offset.checkpoint.interval.ms``, and the expiration of producer ids idle
longer than ``producer.id.expiration.ms`` every 10 minutes (Kafka's
``producer.id.expiration.check.interval.ms`` default). ``tick()`` runs what is due once.

A data dir that fails (Kafka's LogDirFailureChannel): every I/O error on it
(a log's append, read, flush, roll, truncation, deletion, epoch checkpoint or
producer snapshot; a checkpoint file of this manager; creating or deleting a
partition dir) is reported once, the first, to ``on_dir_failure(data_dir,
error)`` and kept in ``failure``. The broker halts on it: its one data dir is
all it has (Kafka halts when no log dir is left online). Without a handler
the failure is logged; from then on the periodic tasks stop (``close`` still
flushes and closes what it can). A directory whose name is not exactly
``<topic>-<partition>`` as the broker writes it (``s-01``) is not a partition
and is left alone (warning ``unknown_dir_ignored``); two directories for one
partition refuse the load (``DuplicateLogDirError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from common.clock import Clock
from common.config import Config
from common.logging import get_logger
from common.wire import TopicPartition
from storage import checkpoint
from storage.log import DELETED_DIR_SUFFIX, Log, LogConfig, StorageError, parse_topic_partition

HW_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
TICK_S = 1.0
PRODUCER_EXPIRATION_CHECK_INTERVAL_MS = 600_000  # Kafka's producer.id.expiration.check.interval.ms default
DELETED_DIR_RE = re.compile(r"^.+-\d+\.[0-9a-f]{16}" + re.escape(DELETED_DIR_SUFFIX) + "$", re.ASCII)

log = get_logger("storage.log_manager")


class DuplicateLogDirError(StorageError):
    """Two directories hold one partition (Kafka refuses to start: "Duplicate log directories")."""


class LogManager:
    max_active_expiries_per_pass = 64  # see run_retention

    def __init__(self, data_dir: Path, config: Config, clock: Clock, *,
                 high_watermarks: Callable[[], dict[TopicPartition, int]] | None = None,
                 on_dir_failure: Callable[[Path, str], None] | None = None) -> None:
        self.data_dir = data_dir
        self.config = config
        self.clock = clock
        self.high_watermarks = high_watermarks
        self.on_dir_failure = on_dir_failure
        self.failure: str | None = None  # the first I/O failure of the data dir; None while it is healthy
        self._failure_lock = threading.Lock()  # failures come from the event loop and from worker threads
        self._logs: dict[TopicPartition, Log] = {}
        self._creating: dict[TopicPartition, asyncio.Future[Log]] = {}
        self._awaiting_config: set[TopicPartition] = set()  # loaded from disk, topic config not known yet
        self._task: asyncio.Task[None] | None = None
        self._checkpoint_lock = threading.Lock()
        now = clock.monotonic_ms()
        self._last_retention_ms = now
        self._last_checkpoint_ms = now
        self._last_producer_expiration_ms = now

    # ---- loading and lookup --------------------------------------------------------------------------------
    async def load(self) -> None:
        """Open every ``<topic>-<partition>`` directory, recovering from the checkpointed recovery points."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for name in (HW_CHECKPOINT, RECOVERY_CHECKPOINT, LOG_START_CHECKPOINT):
            path = self.data_dir / name
            if os.path.lexists(path) and not path.is_file():
                # as Kafka, which fails at load: this broker would start, lead, and halt at its first
                # checkpoint write (5 s later for the HW)
                raise StorageError(f"{path} is not a regular file: the {name} checkpoint can never be written; "
                                   "remove it and start again")
        recovery = self._read_checkpoint(RECOVERY_CHECKPOINT)
        starts = self._read_checkpoint(LOG_START_CHECKPOINT)
        default = LogConfig.from_config(self.config)
        try:
            await self._load_all(recovery, starts, default)
        except Exception:  # the logs opened so far are closed: a failed load leaves no open files behind
            for lg in self._logs.values():
                lg.on_io_failure = None  # the load's error is the one to report
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(lg.close)
            self._logs.clear()
            raise
        log.info("logs_loaded", count=len(self._logs), data_dir=str(self.data_dir))

    async def _load_all(self, recovery: dict[TopicPartition, int], starts: dict[TopicPartition, int],
                        default: LogConfig) -> None:
        for path in sorted(self.data_dir.iterdir()):
            if path.is_dir() and DELETED_DIR_RE.match(path.name):
                await asyncio.to_thread(shutil.rmtree, path, True)  # a deletion that did not finish
                continue
            if not path.is_dir():
                continue
            try:
                tp = parse_topic_partition(path)
            except ValueError:
                if "-" in path.name:  # looks like one but is not (s-01): say so, never read it as a partition
                    log.warning("unknown_dir_ignored", dir=str(path))
                continue
            previous = self._logs.get(tp)
            if previous is not None:
                raise DuplicateLogDirError(f"duplicate log directories for {tp}: {previous.dir} and {path}")
            opened = await asyncio.to_thread(Log.open, path, default, self.clock,
                                             recovery_point=recovery.get(tp, 0), log_start_offset=starts.get(tp))
            self._adopt(opened)
            self._logs[tp] = opened
            self._awaiting_config.add(tp)

    def _adopt(self, lg: Log) -> None:
        lg.defer_roll_flush = lg.defer_file_deletion = True
        lg.on_io_failure = self._log_io_failed

    def _log_io_failed(self, lg: Log, error: str) -> None:
        self.dir_failed(f"{lg.dir.name}: {error}")

    def dir_failed(self, error: str) -> None:
        """Report an I/O failure of the data dir; only the first reaches ``on_dir_failure`` (which may halt
        the process and never return)."""
        with self._failure_lock:
            if self.failure is not None:
                return
            self.failure = error
        if self.on_dir_failure is None:
            log.error("log_dir_failed", data_dir=str(self.data_dir), error=error)
            return
        self.on_dir_failure(self.data_dir, error)

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    def logs(self) -> dict[TopicPartition, Log]:
        return dict(self._logs)

    async def get_or_create_log(self, tp: TopicPartition, config: LogConfig) -> Log:
        """The partition's log, created (empty) if absent; an existing log takes ``config``."""
        existing = self._logs.get(tp)
        if existing is not None:
            existing.update_config(config)
            self._awaiting_config.discard(tp)
            return existing
        pending = self._creating.get(tp)
        if pending is not None:
            return await asyncio.shield(pending)
        if (not tp.topic or "/" in tp.topic or tp.topic in (".", "..") or tp.partition < 0
                or any(c.isspace() or c == "\0" for c in tp.topic)):
            raise ValueError(f"invalid topic partition {tp!r}")
        future: asyncio.Future[Log] = asyncio.get_running_loop().create_future()
        self._creating[tp] = future
        try:
            try:
                created = await asyncio.to_thread(Log.open, self.data_dir / str(tp), config, self.clock)
            except StorageError as exc:
                if _io_error(exc):
                    self.dir_failed(f"cannot create the log of {tp}: {exc}")
                raise
            self._adopt(created)
            self._logs[tp] = created
            future.set_result(created)
            log.info("log_created", topic=tp.topic, partition=tp.partition)
            return created
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning if nobody else waited
            raise
        finally:
            del self._creating[tp]

    async def delete_log(self, tp: TopicPartition) -> None:
        """Remove the partition's log; on ``OSError`` it stays listed (closed, unusable) so that a retry
        deletes it, rather than answering success over a directory still under its live name."""
        doomed = self._logs.get(tp)
        if doomed is None:
            return
        doomed.close_for_deletion()  # here, not in the thread: the periodic tick uses the log on this loop
        try:
            await asyncio.to_thread(doomed.remove_dir)
        except OSError as exc:
            self.dir_failed(f"cannot delete the log of {tp}: {type(exc).__name__}: {exc}")
            raise
        del self._logs[tp]
        self._awaiting_config.discard(tp)
        self.checkpoint_recovery_points_and_log_starts()

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def read_high_watermarks(self) -> dict[TopicPartition, int]:
        return self._read_checkpoint(HW_CHECKPOINT)

    def checkpoint_high_watermarks(self, hws: dict[TopicPartition, int]) -> None:
        self._write_checkpoint(HW_CHECKPOINT, hws)

    def checkpoint_recovery_points_and_log_starts(self) -> None:
        self._write_checkpoint(RECOVERY_CHECKPOINT, {tp: lg.recovery_point for tp, lg in self._logs.items()})
        self._write_checkpoint(LOG_START_CHECKPOINT, {tp: lg.log_start_offset for tp, lg in self._logs.items()})

    def _read_checkpoint(self, name: str) -> dict[TopicPartition, int]:
        try:
            return checkpoint.read_offsets(self.data_dir / name)
        except (checkpoint.CheckpointError, OSError) as exc:
            # Safe fallback: no recovery point = recover everything; no HW = the broker re-learns it.
            log.warning("checkpoint_unreadable", file=name, error=str(exc))
            return {}

    def _write_checkpoint(self, name: str, offsets: dict[TopicPartition, int]) -> None:
        # One write at a time: each goes through the same ``<name>.tmp``, and writes come from the event
        # loop and from worker threads (the HW checkpoint runs in one, and a periodic write cancelled at
        # shutdown goes on in its thread while the final one starts).
        try:
            with self._checkpoint_lock:
                checkpoint.write_offsets(self.data_dir / name, offsets)
        except OSError as exc:
            error = f"cannot write {self.data_dir / name}: {type(exc).__name__}: {exc}"
            self.dir_failed(error)
            raise StorageError(error) from exc

    # ---- periodic tasks ------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="log-manager")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.tick()
            except Exception:  # keep the periodic tasks alive; the failing log is marked unusable
                log.exception("log_manager_tick_failed")

    async def tick(self) -> None:
        """Run whatever periodic work is due now (nothing once the data dir has failed)."""
        if self.failure is not None:
            return
        now = self.clock.monotonic_ms()
        for lg in list(self._logs.values()):
            with contextlib.suppress(StorageError):
                lg.maybe_flush()
                await lg.flush_rolled_segments()
        if now - self._last_retention_ms >= self.config.get_int("log.retention.check.interval.ms"):
            self._last_retention_ms = now
            self.run_retention()
        if now - self._last_checkpoint_ms >= self.config.get_int("log.flush.offset.checkpoint.interval.ms"):
            self._last_checkpoint_ms = now
            self.checkpoint_recovery_points_and_log_starts()
        if now - self._last_producer_expiration_ms >= PRODUCER_EXPIRATION_CHECK_INTERVAL_MS:
            self._last_producer_expiration_ms = now
            self.remove_expired_producers()
        # Kafka keeps a ``.deleted`` segment for ``log.segment.delete.delay.ms`` (60 s) so that reads
        # already under way on it (zero-copy sends from the file) can finish. Reads here are ``os.pread``
        # calls on the event loop that finish before this tick runs, so nothing can still be reading a
        # renamed segment: its files go on this tick, which also keeps disk and page cache bounded when
        # retention is tight and writes are fast.
        for lg in list(self._logs.values()):
            await lg.unlink_deleted_segments()

    def run_retention(self) -> int:
        hws = self.high_watermarks() if self.high_watermarks is not None else {}
        deleted = 0
        # Expiring an active segment rolls a new one first (an epoch checkpoint and maybe a producer snapshot,
        # each fsynced, on this event loop); the idle partitions of a topic all expire in the same pass, so a
        # pass does at most this many and leaves the rest to the next (Kafka runs retention on a thread).
        active_left = self.max_active_expiries_per_pass
        for tp, lg in list(self._logs.items()):
            if tp in self._awaiting_config:
                # Loaded from disk with the broker's defaults: its topic's own retention.ms / retention.bytes
                # (a longer one, or -1) come with its LeaderAndIsr. Kafka loads logs with their topic configs
                # from the metadata it has caught up on first; until then, nothing is deleted here.
                continue
            with contextlib.suppress(StorageError):
                # A partition the HW source does not know keeps everything at or above its log start.
                bound = hws.get(tp, lg.log_start_offset) if self.high_watermarks is not None else None
                n = lg.delete_old_segments(bound, expire_active=active_left > 0)
                if n and lg.log_start_offset == lg.log_end_offset:  # nothing left: the active one expired too
                    active_left -= 1
                deleted += n
        return deleted

    def remove_expired_producers(self) -> int:
        """Forget, in every log, producers idle longer than ``producer.id.expiration.ms``. -> count."""
        expiration_ms = self.config.get_int("producer.id.expiration.ms")
        return sum(lg.remove_expired_producers(expiration_ms) for lg in list(self._logs.values()))

    async def close(self) -> None:
        """Stop periodic work; flush and close every log; write the checkpoints. Goes on past a failure
        (reported as the data dir's): each log is closed whatever happened to the others.

        Safe after a failure of the dir: a log whose I/O failed is not flushed again (an fsync after a
        failed one may report success over lost pages) and keeps its older recovery point, so the next
        start validates it; the others are flushed and checkpointed at their end as usual."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for tp, lg in self._logs.items():
            try:
                await asyncio.to_thread(lg.close)
                await lg.unlink_deleted_segments()
            except StorageError:
                pass  # reported by the log
            except Exception as exc:  # close the other logs all the same
                log.exception("log_close_failed", topic=tp.topic, partition=tp.partition, error=str(exc))
        try:
            self.checkpoint_recovery_points_and_log_starts()
        except StorageError as exc:  # reported; the older checkpoint stays (recovery validates more)
            log.warning("checkpoint_not_written", error=str(exc))
        log.info("logs_closed", count=len(self._logs))


def _io_error(exc: BaseException) -> bool:
    """Whether an OSError is among the causes of ``exc``."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, OSError):
            return True
        seen = seen.__cause__
    return False
