"""The controller shell: journal, liveness, timers, metrics and propagation around the pure ops.

Every change follows one path (``_commit``): the pure op plans records, the
records are written to the journal and fsynced, applied to the image, logged,
counted, and only then answered and propagated. A single lock serialises
changes, so the image seen by an op is the one its records apply to.

Liveness (KRaft): ``last_heard`` per unfenced broker on the monotonic clock.
After a restart every unfenced broker counts as alive until its session
timeout, so leaders keep serving while brokers heartbeat the new controller.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from common.clock import Clock
from common.config import Config
from common.errors import ErrorCode
from common.logging import get_logger
from common.wire import TopicPartition, is_cluster_id
from controller import ops
from controller.journal import Journal, JournalBrokenError, JournalCorruptError
from controller.propagator import DELETE_EPOCH, Propagator, Transport
from controller.rules import ElectionReason, expired_brokers
from controller.state import (
    NO_LEADER,
    ClusterIdRecord,
    ControllerEpochRecord,
    MetadataImage,
    ProducerIdsRecord,
    RemoveTopicRecord,
    TopicRecord,
    TopicStoppedRecord,
)
from storage.checkpoint import read_properties, write_atomic

log = get_logger("controller")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.active = Gauge("minibroker_controller_active", "1 while this process is the active controller",
                            registry=self.registry)
        self.epoch = Gauge("minibroker_controller_epoch", "controller epoch", registry=self.registry)
        self.offline = Gauge("minibroker_controller_offline_partitions", "partitions without a leader",
                             registry=self.registry)
        self.fenced = Gauge("minibroker_controller_fenced_brokers", "registered brokers that are fenced",
                            registry=self.registry)
        self.live = Gauge("minibroker_controller_live_brokers", "registered unfenced brokers",
                          registry=self.registry)
        self.elections = Counter("minibroker_controller_elections", "leader elections by reason", ["reason"],
                                 registry=self.registry)
        self.isr_changes = Counter("minibroker_controller_isr_changes", "ISR changes committed",
                                   registry=self.registry)
        self.journal_records = Counter("minibroker_controller_journal_records", "records committed",
                                       registry=self.registry)
        self.propagation_failures = Counter("minibroker_controller_propagation_failures",
                                            "control requests to a broker that failed (retried)", ["broker"],
                                            registry=self.registry)



T = TypeVar("T")


async def _to_its_end(fn: Callable[..., T], *args: Any) -> tuple[asyncio.Future[T], bool]:
    """``fn(*args)`` in a worker thread, awaited to its end even if the caller is cancelled meanwhile: the
    finished work (its result or its exception) and whether the caller was cancelled, for it to raise
    CancelledError once it has done what must follow, whatever the outcome (a cancel lost to a failed write
    left Controller.close waiting on a liveness loop for good). A journal write cannot be stopped once
    started: a commit that gave up on it left the journal ahead of the image (the records written, never
    applied) and released the lock, so the next commit could write beside it and the journal be closed under
    it (Controller.close cancels the liveness task's fences)."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    cancelled = False
    while not work.done():
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:
            break  # the work's own failure: the caller reads it from ``work``
    return work, cancelled

class Controller:
    def __init__(self, data_dir: Path, config: Config, clock: Clock, *, rng: random.Random | None = None,
                 transport: Transport | None = None, stall_guard: bool = True) -> None:
        self.data_dir = data_dir
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random()
        self.image = MetadataImage()
        self.metrics = Metrics()
        self.propagator = Propagator(lambda: self.image, transport, on_failure=self._count_propagation_failure,
                                     on_stopped=self._replicas_deleted)
        self._background: set[asyncio.Task[None]] = set()
        self.last_heard: dict[int, int] = {}  # unfenced brokers -> monotonic ms of last heartbeat
        self.shutting_down: set[int] = set()
        self._journal: Journal | None = None
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stall_guard = stall_guard  # off in tests that move a ManualClock by hand
        self.fatal = asyncio.Event()  # set when the controller cannot go on (journal write failed)

    def _replicas_deleted(self, node_id: int, tps: list[TopicPartition]) -> None:
        """A broker acknowledged StopReplica(delete): record it (a task: the sender must not wait on the lock)."""
        task = asyncio.get_running_loop().create_task(self._confirm_deleted(node_id, {tp.topic for tp in tps}))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _confirm_deleted(self, node_id: int, topics: set[str]) -> None:
        async with self._lock:
            records = [TopicStoppedRecord(t, node_id) for t in sorted(topics)
                       if node_id in self.image.deleting.get(t, {})]
            await self._commit(ops.Plan(list(records)))
        for r in records:
            if r.name not in self.image.deleting:
                log.info("topic_deletion_completed", topic=r.name)

    def _count_propagation_failure(self, node_id: int) -> None:
        self.metrics.propagation_failures.labels(broker=str(node_id)).inc()

    # --- configuration shortcuts ---

    @property
    def session_timeout_ms(self) -> int:
        return self.config.get_int("broker.session.timeout.ms")

    @property
    def unclean_default(self) -> bool:
        return self.config.get_bool("unclean.leader.election.enable")

    def live(self) -> set[int]:
        """Brokers that may lead or join an ISR: registered, unfenced, not shutting down."""
        return {b for b, reg in self.image.brokers.items() if not reg.fenced and b not in self.shutting_down}

    # --- lifecycle ---

    async def start(self) -> None:
        """Replay, bump controller_epoch durably, then act."""
        journal, self.image = await asyncio.to_thread(Journal.open, self.data_dir)
        self._journal = journal
        try:
            in_file = await asyncio.to_thread(read_cluster_id, self.data_dir)
        except BaseException:
            journal.close()
            raise
        if journal.truncated_bytes:
            log.warning("journal_torn_tail_truncated", bytes=journal.truncated_bytes)
        journalled = self.image.cluster_id
        if journalled is not None and in_file is not None and in_file != journalled:
            journal.close()
            raise JournalCorruptError(f"{self.data_dir / META_FILE} names cluster {in_file}, the metadata journal "
                                      f"{journalled}: the two are not from one controller")
        first: list[Any] = []
        if journalled is None:  # a new data dir, or one from before cluster ids: made (or taken from the file)
            made = in_file or new_cluster_id()
            first.append(ClusterIdRecord(made))
            log.info("cluster_id_journalled" if in_file else "cluster_id_created", cluster_id=made)
        await self._commit(ops.Plan([*first, ControllerEpochRecord(self.image.controller_epoch + 1)]))
        if in_file != self.cluster_id:  # the file is a copy, written (again) from the journal
            await asyncio.to_thread(write_cluster_id, self.data_dir, self.cluster_id)
        now = self.clock.monotonic_ms()
        self.last_heard = {b: now for b in self.image.unfenced()}
        self.metrics.active.set(1)
        log.info("controller_started", controller_epoch=self.image.controller_epoch,
                 brokers=len(self.image.brokers), topics=len(self.image.topics),
                 partitions=len(self.image.partitions), journal_offset=journal.offset)
        for b in self.image.unfenced():
            self.propagator.full_sync(b)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._liveness_loop(), name="liveness"))
        self._tasks.append(loop.create_task(self._rebalance_loop(), name="rebalance"))

    async def close(self) -> None:
        self.metrics.active.set(0)
        self._tasks.extend(self._background)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.propagator.close()
        if self._journal is not None:
            self._journal.close()

    # --- the one path for changes ---

    async def _commit(self, plan: ops.Plan) -> None:
        """Journal (fsync), apply, log, count, propagate. Caller holds the lock (or is start())."""
        if not plan.records:
            return
        journal = self._journal
        assert journal is not None, "controller not started"
        old_image_topics = set(self.image.topics)
        old_partitions = dict(self.image.partitions)
        work, cancelled = await _to_its_end(journal.append, plan.records)
        try:
            work.result()
        except JournalBrokenError:
            log.critical("journal_failed", journal_offset=journal.offset, error=journal.broken)
            self.fatal.set()  # the process exits; a restart replays what was acknowledged
            if cancelled:
                raise asyncio.CancelledError from None
            raise
        except BaseException:  # a bug: still never a cancel lost (Controller.close would wait for good)
            if cancelled:
                raise asyncio.CancelledError from None
            raise
        for rec in plan.records:
            self.image.apply(rec)
        self.metrics.journal_records.inc(len(plan.records))
        self._log_changes(plan)
        self._update_gauges()
        self._propagate(plan, old_image_topics, old_partitions)
        if cancelled:  # at shutdown: committed and applied, the snapshot left for the next start
            raise asyncio.CancelledError
        interval = self.config.get_int("metadata.snapshot.interval.records")
        if journal.records_since_snapshot >= interval:
            # The plan is committed (fsynced, applied, propagated): its caller gets its answer whatever
            # becomes of the snapshot, which is housekeeping.
            snapshot, cancelled = await _to_its_end(journal.snapshot, self.image)
            try:
                failed = snapshot.result()
            except JournalBrokenError:
                log.critical("journal_failed", journal_offset=journal.offset, error=journal.broken)
                self.fatal.set()  # the process exits; a restart replays the snapshot and the journal
                if cancelled:
                    raise asyncio.CancelledError from None
                return
            except BaseException:
                if cancelled:
                    raise asyncio.CancelledError from None
                raise
            if failed is None:
                log.info("metadata_snapshot_written", journal_offset=journal.offset)
            else:
                log.warning("metadata_snapshot_failed", journal_offset=journal.offset, error=failed)
            if cancelled:
                raise asyncio.CancelledError

    def _log_changes(self, plan: ops.Plan) -> None:
        for c in plan.changes:
            fields = {"topic": c.tp.topic, "partition": c.tp.partition, "leader": c.new.leader,
                      "leader_epoch": c.new.leader_epoch, "partition_epoch": c.new.partition_epoch,
                      "isr": list(c.new.isr)}
            if c.leader_changed:
                if c.new.leader != NO_LEADER:
                    self.metrics.elections.labels(reason=c.reason.value).inc()
                if c.new.leader == NO_LEADER:
                    log.warning("partition_offline", **fields)
                elif c.reason is ElectionReason.UNCLEAN:
                    log.warning("leader_elected", reason=c.reason.value, unclean=True, **fields)
                else:
                    log.info("leader_elected", reason=c.reason.value, **fields)
            if c.old is not None and c.isr_changed:
                self.metrics.isr_changes.inc()
                log.info("isr_changed", reason=c.reason.value, old_isr=list(c.old.isr), **fields)

    def _update_gauges(self) -> None:
        self.metrics.epoch.set(self.image.controller_epoch)
        self.metrics.offline.set(sum(1 for st in self.image.partitions.values() if st.leader == NO_LEADER))
        self.metrics.fenced.set(sum(1 for reg in self.image.brokers.values() if reg.fenced))
        self.metrics.live.set(sum(1 for reg in self.image.brokers.values() if not reg.fenced))

    def _propagate(self, plan: ops.Plan, old_topics: set[str],
                   old_partitions: dict[TopicPartition, Any]) -> None:
        """LeaderAndIsr to the replicas of changed partitions (unless the leader asked for the change);
        UpdateMetadata to every live broker."""
        if all(isinstance(rec, ProducerIdsRecord) for rec in plan.records):
            return  # nothing brokers hold: no UpdateMetadata for a producer-id block
        lai: dict[int, list[TopicPartition]] = {}
        new_tps: set[TopicPartition] = set()
        for c in plan.changes:
            if c.requested_by_leader:
                continue  # an ISR change the leader asked for: UpdateMetadata only (Kafka)
            if c.old is None:
                new_tps.add(c.tp)
            for r in c.new.replicas:
                lai.setdefault(r, []).append(c.tp)
        removed = [rec for rec in plan.records if isinstance(rec, RemoveTopicRecord) and rec.name in old_topics]
        deleted = [rec.name for rec in removed]
        stops: dict[int, dict[TopicPartition, int]] = {}
        for rec in removed:
            for b, parts in rec.pending.items():
                for p in parts:
                    stops.setdefault(int(b), {})[TopicPartition(rec.name, p)] = DELETE_EPOCH
        changed_tps = [c.tp for c in plan.changes]
        changed_topics = [r.name for r in plan.records if isinstance(r, TopicRecord)]
        for b in self.image.unfenced():
            # a broker in controlled shutdown gets no LeaderAndIsr: made a follower, it would start
            # fetching from the new leader just before exiting and look like an ISR candidate there
            mine = [] if b in self.shutting_down else lai.get(b, [])
            self.propagator.enqueue(b, partitions=[tp for tp in mine if tp not in new_tps], metadata=True,
                                    metadata_tps=changed_tps, metadata_topics=changed_topics,
                                    stop=stops.get(b), deleted_topics=deleted)
            fresh = [tp for tp in mine if tp in new_tps]
            if fresh:
                self.propagator.enqueue(b, partitions=fresh, new=True)

    # --- broker lifecycle ---

    async def register_broker(self, node_id: int, host: str, port: int, incarnation_id: str) -> tuple[ErrorCode, int]:
        """-> (NONE, the new broker epoch), or (DUPLICATE_BROKER_REGISTRATION, -1) while another incarnation
        of ``node_id`` holds a valid session (Kafka's ClusterControlManager.registerBroker): two processes
        configured with one node id would otherwise take the registration from each other in turn, and
        each, with its own log, would count as the other's replica. A restarted broker is answered so until
        its previous incarnation is fenced (session timeout, or a completed controlled shutdown); it
        retries meanwhile, as Kafka's broker does."""
        async with self._lock:
            if self._has_valid_session(node_id, incarnation_id):
                reg = self.image.brokers[node_id]
                log.warning("broker_registration_refused", broker_id=node_id, incarnation_id=incarnation_id,
                            registered_incarnation_id=reg.incarnation_id, broker_epoch=reg.broker_epoch,
                            host=host, port=port, registered_host=reg.host, registered_port=reg.port)
                return ErrorCode.DUPLICATE_BROKER_REGISTRATION, -1
            plan, epoch = ops.register_broker(self.image, node_id, host, port, incarnation_id, self.live(),
                                              unclean_default=self.unclean_default)
            await self._commit(plan)
            self.shutting_down.discard(node_id)
            self.last_heard[node_id] = self.clock.monotonic_ms()
        log.info("broker_registered", broker_id=node_id, broker_epoch=epoch, host=host, port=port,
                 incarnation_id=incarnation_id)
        self.propagator.full_sync(node_id)
        return ErrorCode.NONE, epoch

    @property
    def cluster_id(self) -> str:
        """The cluster's id, as the metadata journal holds it ("" before ``start``)."""
        return self.image.cluster_id or ""

    def check_cluster_id(self, node_id: int, cluster_id: str | None) -> ErrorCode:
        """Kafka's registration check: a broker that names another cluster (its data dir's meta.properties)
        is refused with INCONSISTENT_CLUSTER_ID; one that names none (a new data dir) takes this one."""
        if cluster_id is None or cluster_id == self.cluster_id:
            return ErrorCode.NONE
        log.warning("broker_registration_refused", broker_id=node_id, error="INCONSISTENT_CLUSTER_ID",
                    broker_cluster_id=cluster_id, cluster_id=self.cluster_id)
        return ErrorCode.INCONSISTENT_CLUSTER_ID

    def _has_valid_session(self, node_id: int, incarnation_id: str) -> bool:
        """Another incarnation of ``node_id`` is registered, unfenced and heard from within the session
        timeout (Kafka's BrokerHeartbeatManager.hasValidSession: a fenced broker has no session)."""
        reg = self.image.brokers.get(node_id)
        if reg is None or reg.fenced or reg.incarnation_id == incarnation_id:
            return False
        heard = self.last_heard.get(node_id)
        return heard is not None and self.clock.monotonic_ms() - heard <= self.session_timeout_ms

    def _registration_error(self, node_id: int, broker_epoch: int) -> ErrorCode:
        """BROKER_ID_NOT_REGISTERED / STALE_BROKER_EPOCH unless ``node_id`` is registered at ``broker_epoch``:
        what a broker's own requests (heartbeat, controlled shutdown, producer ids) are checked against."""
        reg = self.image.brokers.get(node_id)
        if reg is None:
            return ErrorCode.BROKER_ID_NOT_REGISTERED
        return ErrorCode.STALE_BROKER_EPOCH if reg.broker_epoch != broker_epoch else ErrorCode.NONE

    async def heartbeat(self, node_id: int, broker_epoch: int, want_shutdown: bool) -> dict[str, Any]:
        # The contact time of a tracked broker is taken before the lock, as KRaft's since KAFKA-17793: a long
        # operation holding the lock (an fsync, a snapshot) would otherwise hold the heartbeat back while a
        # liveness check queued before it fenced a broker that had answered in time.
        if node_id in self.last_heard and self._registration_error(node_id, broker_epoch) is ErrorCode.NONE:
            self.last_heard[node_id] = self.clock.monotonic_ms()
        async with self._lock:
            error = self._registration_error(node_id, broker_epoch)
            if error is not ErrorCode.NONE:
                reg = self.image.brokers.get(node_id)
                return self._hb(error, fenced=reg is None or reg.fenced, shutdown=False)
            reg = self.image.brokers[node_id]
            self.last_heard[node_id] = self.clock.monotonic_ms()
            if want_shutdown:
                return await self._shutdown_heartbeat(node_id)
            if reg.fenced and node_id not in self.shutting_down:
                plan = ops.unfence_broker(self.image, node_id, self.live(), unclean_default=self.unclean_default)
                await self._commit(plan)
                log.info("broker_unfenced", broker_id=node_id, broker_epoch=broker_epoch)
                self.propagator.full_sync(node_id)
            return self._hb(ErrorCode.NONE, fenced=self.image.brokers[node_id].fenced, shutdown=False)

    async def _shutdown_heartbeat(self, node_id: int) -> dict[str, Any]:
        remaining = await self._move_leaders_off(node_id)
        if remaining:
            return self._hb(ErrorCode.NONE, fenced=False, shutdown=False)
        # nothing left to lead: fence it now instead of waiting for the session timeout (KRaft)
        await self._fence(node_id, reason="controlled_shutdown")
        return self._hb(ErrorCode.NONE, fenced=True, shutdown=True)

    def _hb(self, error: ErrorCode, *, fenced: bool, shutdown: bool) -> dict[str, Any]:
        # no heartbeat interval: each broker keeps its own broker.heartbeat.interval.ms (KRaft's answer has none)
        return {"error": int(error), "is_fenced": fenced, "should_shutdown": shutdown}

    async def controlled_shutdown(self, node_id: int, broker_epoch: int) -> tuple[ErrorCode, list[TopicPartition]]:
        async with self._lock:
            error = self._registration_error(node_id, broker_epoch)
            if error is not ErrorCode.NONE:
                return error, []
            remaining = await self._move_leaders_off(node_id)
            if not remaining:
                # it leads nothing and is in no ISR it could leave: fence it now, as KRaft does on the
                # shutdown heartbeat, so metadata stops naming it while it exits
                await self._fence(node_id, reason="controlled_shutdown")
        return ErrorCode.NONE, remaining

    async def _move_leaders_off(self, node_id: int) -> list[TopicPartition]:
        if node_id not in self.shutting_down:
            log.info("broker_controlled_shutdown", broker_id=node_id)
        self.shutting_down.add(node_id)
        plan, remaining = ops.controlled_shutdown(self.image, node_id, self.live(),
                                                  unclean_default=self.unclean_default)
        await self._commit(plan)
        return remaining

    async def _fence(self, node_id: int, *, reason: str) -> None:
        reg = self.image.brokers.get(node_id)
        if reg is None or reg.fenced:
            return
        plan = ops.fence_broker(self.image, node_id, self.live() - {node_id}, unclean_default=self.unclean_default)
        await self._commit(plan)
        self.last_heard.pop(node_id, None)
        self.propagator.drop(node_id)
        # a controlled shutdown's fence is the orderly end of a stop (Kafka logs it at INFO); a lapsed session
        # is worth a warning
        level = log.info if reason == "controlled_shutdown" else log.warning
        level("broker_fenced", broker_id=node_id, broker_epoch=reg.broker_epoch, reason=reason,
              partitions_changed=len(plan.changes))

    async def check_liveness(self) -> list[int]:
        """Fence every broker silent past the session timeout; returns who was fenced."""
        async with self._lock:
            now = self.clock.monotonic_ms()
            fenced = []
            for b in expired_brokers(self.last_heard, now, self.session_timeout_ms):
                heard = self.last_heard.get(b)
                if heard is not None and self.clock.monotonic_ms() - heard <= self.session_timeout_ms:
                    continue  # heard from while an earlier one's fence was committed
                await self._fence(b, reason="session_timeout")
                fenced.append(b)
        return fenced

    def forgive_stall(self, stall_ms: int) -> None:
        """The controller itself was stalled (overloaded machine, long fsync): heartbeats could not be
        read meanwhile, so the silence is not the brokers'. Push every deadline back by the stall."""
        if stall_ms <= 0:
            return
        self.last_heard = {b: t + stall_ms for b, t in self.last_heard.items()}
        log.warning("controller_stalled", stall_ms=stall_ms, brokers=len(self.last_heard))

    async def _liveness_loop(self) -> None:
        tick_ms = max(20, min(1000, self.session_timeout_ms // 8))
        loop = asyncio.get_running_loop()
        previous = loop.time()
        while True:
            await asyncio.sleep(tick_ms / 1000)
            now = loop.time()
            # a tick that came much later than asked means this process was not running, not that the
            # brokers were silent (Kafka has no such guard; a stalled controller would fence everyone)
            late_ms = int((now - previous) * 1000) - tick_ms
            if self._stall_guard and late_ms > self.session_timeout_ms // 4:
                self.forgive_stall(late_ms)
            previous = now
            try:
                await self.check_liveness()
            except Exception:
                log.exception("liveness_check_failed")

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> tuple[ErrorCode, int, int]:
        """A block of producer ids, journaled (fsynced) before it is answered, so no id is ever handed out
        twice, across restarts too. Checked as ``heartbeat`` checks: a registered broker at its current
        epoch. -> (error, first id, block length)."""
        async with self._lock:
            error = self._registration_error(broker_id, broker_epoch)
            if error is not ErrorCode.NONE:
                return error, -1, 0
            plan, start = ops.allocate_producer_ids(self.image, broker_id, broker_epoch)
            await self._commit(plan)
        log.info("producer_ids_allocated", broker_id=broker_id, broker_epoch=broker_epoch,
                 producer_id_start=start, producer_id_len=ops.PRODUCER_ID_BLOCK_SIZE)
        return ErrorCode.NONE, start, ops.PRODUCER_ID_BLOCK_SIZE

    # --- preferred leaders ---

    async def rebalance(self) -> int:
        async with self._lock:
            threshold = self.config.get_int("leader.imbalance.per.broker.percentage")
            plan = ops.preferred_elections(self.image, self.live(), threshold)
            await self._commit(plan)
        return len(plan.changes)

    async def _rebalance_loop(self) -> None:
        if not self.config.get_bool("auto.leader.rebalance.enable"):
            return
        interval_s = self.config.get_int("leader.imbalance.check.interval.seconds")
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.rebalance()
            except Exception:
                log.exception("preferred_election_failed")

    # --- topics and ISR ---

    async def create_topics(self, topics: Sequence[ops.NewTopic]) -> list[ops.TopicResult]:
        async with self._lock:
            live = sorted(self.live())
            n = max(1, len(live))
            plan, results = ops.create_topics(
                self.image, topics, live,
                default_partitions=self.config.get_int("num.partitions"),
                default_rf=self.config.get_int("default.replication.factor"),
                start_index=self.rng.randrange(n), replica_shift=self.rng.randrange(n))
            await self._commit(plan)
        for r in results:
            if r.error is ErrorCode.NONE:
                log.info("topic_created", topic=r.name, partitions=len(self.image.topic_partitions(r.name)))
        return results

    async def delete_topics(self, names: Sequence[Any]) -> list[ops.TopicResult]:
        async with self._lock:
            plan, results = ops.delete_topics(self.image, names)
            await self._commit(plan)
        for r in results:
            if r.error is ErrorCode.NONE:
                log.info("topic_deleted", topic=r.name)
        return results

    async def alter_partition(self, broker_id: int, broker_epoch: int,
                              items: Sequence[ops.AlterItem]) -> tuple[ErrorCode, list[ops.AlterResult]]:
        async with self._lock:
            reg = self.image.brokers.get(broker_id)
            if reg is None or reg.broker_epoch != broker_epoch:
                return ErrorCode.STALE_BROKER_EPOCH, []
            plan, results = ops.alter_partition(self.image, broker_id, items, self.live())
            await self._commit(plan)
        for r in results:
            if r.error is not ErrorCode.NONE:
                log.info("alter_partition_refused", broker_id=broker_id, topic=r.tp.topic,
                         partition=r.tp.partition, error=r.error.name)
        return ErrorCode.NONE, results


META_FILE = "meta.properties"


def read_cluster_id(data_dir: Path) -> str | None:
    """The cluster id in ``data_dir``'s meta.properties, a copy of the one the metadata journal holds (made at
    the first start: a random UUID in Kafka's 22-character base64url form, kept for good). None when the file
    is missing; a file without a usable id is damage (JournalCorruptError)."""
    path = data_dir / META_FILE
    if not os.path.lexists(path):
        return None
    try:
        found = read_properties(path).get("cluster.id")
    except (OSError, UnicodeDecodeError) as exc:
        raise JournalCorruptError(f"cannot read {path}: {exc}") from None
    if found is None or not is_cluster_id(found):
        raise JournalCorruptError(f"{path} has no usable cluster.id ({'none' if found is None else repr(found[:80])}); "
                                  "the brokers of this cluster recorded it: restore the file, or remove it to have it "
                                  "written again from the metadata journal")
    return found


def write_cluster_id(data_dir: Path, cluster_id: str) -> None:
    path = data_dir / META_FILE
    try:
        write_atomic(path, f"version=1\ncluster.id={cluster_id}\n")
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from None


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
