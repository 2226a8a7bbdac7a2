"""The replica manager: hosted partitions, leader/follower transitions, produce, fetch, offsets.

Kafka's ``ReplicaManager`` cut down to what minibroker needs. The partition
state math lives in ``broker.partition_state`` (pure); this module does the
I/O around it: the log, the fetcher manager, delayed operations, AlterPartition
requests and the HW checkpoint. Everything here runs on the event loop; state
changes that must be atomic (check, append, update) contain no ``await``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from broker import partition_state as ps
from broker.delayed import DelayedFetch, DelayedProduce, LeaderView, ProduceWait
from broker.metadata_cache import MetadataCache
from broker.metrics import BrokerMetrics
from broker.partition import Partition
from broker.producer_ids import ProducerIdManager
from broker.purgatory import DelayedOperation, Purgatory
from broker.requests import (
    ControlHeader,
    FetchPartitionRequest,
    FetchRequest,
    LeaderAndIsrRequest,
    ListOffsetsPartition,
    PartitionStateMsg,
    ProduceRequest,
    StopReplicaPartition,
    UpdateMetadataRequest,
)
from common.clock import Clock
from common.config import Config, ConfigError
from common.errors import ErrorCode, MinibrokerError
from common.logging import get_logger
from common.wire import TopicPartition
from fetcher.api import BrokerEndpoint, InitialFetchState
from storage.producer_state import ProducerStateError
from storage.record_batch import BatchHeader, InvalidBatchError, check_frame, set_timestamp_type

if TYPE_CHECKING:
    from storage.log import Log
    from storage.log_manager import LogManager

log = get_logger("broker")

EARLIEST_TIMESTAMP = -2
ISR_RETRY_BACKOFF_MS = 200
# an AlterPartition asked again without a definite answer waits twice as long each time, up to this (as a Kafka
# client's retry.backoff.max.ms): a change the controller keeps answering NOT_LEADER_OR_FOLLOWER or
# UNKNOWN_TOPIC_OR_PARTITION was asked five times a second, a warning each, until a LeaderAndIsr came
ISR_RETRY_MAX_BACKOFF_MS = 1_000
LATEST_TIMESTAMP = -1


@dataclass(frozen=True, slots=True)
class AlterResult:
    error: ErrorCode
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()
    partition_epoch: int = -1


class AlterPartitionSender(Protocol):
    async def alter_partition(self, tp: TopicPartition, leader_epoch: int, partition_epoch: int,
                              new_isr: tuple[int, ...], broker_epochs: dict[int, int]) -> AlterResult: ...


class FetcherManagerLike(Protocol):
    def add_partitions(self, states: dict[TopicPartition, InitialFetchState]) -> None: ...
    def remove_partitions(self, tps: Iterable[TopicPartition]) -> None: ...
    async def shutdown_idle_fetchers(self) -> None: ...
    async def shutdown(self) -> None: ...


class ReplicaManager:
    def __init__(self, broker_id: int, config: Config, clock: Clock, log_manager: LogManager,
                 metadata: MetadataCache, metrics: BrokerMetrics) -> None:
        self.broker_id = broker_id
        self.config = config
        self.clock = clock
        self.log_manager = log_manager
        self.metadata = metadata
        self.metrics = metrics
        self.controller_epoch = -1
        self._broker_epoch = -1
        self.partitions: dict[TopicPartition, Partition] = {}
        self.produce_purgatory = Purgatory("produce", clock)
        self.fetch_purgatory = Purgatory("fetch", clock)
        self.fetcher: FetcherManagerLike | None = None
        self.alter_sender: AlterPartitionSender | None = None
        self.producer_ids: ProducerIdManager | None = None  # init_producer_id; set by the broker process
        self._state_lock = asyncio.Lock()
        self._restored_hws: dict[TopicPartition, int] = {}
        self._hws_loaded = False  # start() read the HW checkpoint: only then may it be rewritten
        self.shutting_down = False  # the broker is stopping (from its controlled shutdown on): /v1/status says so
        self._isr_backoff_until: dict[TopicPartition, int] = {}
        self._fetching: set[TopicPartition] = set()  # partitions handed to the fetcher manager
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._closing = False

    # ---- FollowerPartitions (fetcher.api) -------------------------------------------------
    @property
    def broker_epoch(self) -> int:
        return self._broker_epoch

    @broker_epoch.setter
    def broker_epoch(self, value: int) -> None:
        self._broker_epoch = value

    def follower_log(self, tp: TopicPartition, leader_epoch: int) -> Log | None:
        p = self.partitions.get(tp)
        if p is None or p.state.role is not ps.Role.FOLLOWER or p.state.leader_epoch != leader_epoch:
            return None
        return p.log

    def on_follower_appended(self, tp: TopicPartition, leader_high_watermark: int,
                             leader_log_start_offset: int) -> None:
        p = self.partitions.get(tp)
        if p is None or p.state.role is not ps.Role.FOLLOWER:
            return
        if leader_log_start_offset > p.log_start_offset:
            p.log.maybe_increment_log_start_offset(min(leader_log_start_offset, p.log_end_offset))
        hw = ps.follower_high_watermark(log_start_offset=p.log_start_offset, log_end_offset=p.log_end_offset,
                                        leader_high_watermark=leader_high_watermark)
        if hw != p.state.high_watermark:
            p.state = p.state.with_high_watermark(hw)
        self.fetch_purgatory.check_and_complete(tp)

    def truncations_done(self) -> None:
        # Kafka's LogManager.truncateTo writes the recovery-point checkpoint at once: one still above the
        # truncation point would let a restart after a power loss trust (skip the CRC checks of) batches
        # appended since, which were never fsynced. The fetcher calls this once per round of truncations,
        # before it appends or awaits: Kafka writes once per truncated partition, which with each write
        # covering every log is quadratic in the partitions a leader change moves (2,000 at once held this
        # event loop for 7 s, past the session timeout).
        self.log_manager.checkpoint_recovery_points_and_log_starts()

    def on_follower_truncated(self, tp: TopicPartition, offset: int, reason: str) -> None:
        p = self.partitions.get(tp)
        if p is None:
            return
        # Never above the LEO, never below the log start: a full truncation (the leader's log start above our
        # end) restarts the log there, and Kafka's truncateFullyAndStartAt moves the HW with it.
        hw = max(p.log_start_offset, min(p.state.high_watermark, p.log_end_offset))
        p.state = p.state._replace(high_watermark=hw)
        log.info("log_truncated", broker_id=self.broker_id, topic=tp.topic, partition=tp.partition,
                 leader_epoch=p.state.leader_epoch, offset=offset, log_end_offset=p.log_end_offset,
                 high_watermark=hw, reason=reason)

    def follower_high_watermark(self, tp: TopicPartition) -> int | None:
        p = self.partitions.get(tp)
        return None if p is None else p.state.high_watermark

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._restored_hws = self.log_manager.read_high_watermarks()
        self._hws_loaded = True
        lag_ms = self.config.get_int("replica.lag.time.max.ms")
        self._loops.append(asyncio.create_task(self._every(max(1, lag_ms // 2), self.maybe_shrink_isr)))
        ckpt_ms = self.config.get_int("replica.high.watermark.checkpoint.interval.ms")
        self._loops.append(asyncio.create_task(self._every(ckpt_ms, self.checkpoint_high_watermarks)))

    async def _every(self, interval_ms: int, step: Callable[[], Awaitable[None] | None]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                result = step()
                if result is not None:
                    await result
            except MinibrokerError as exc:  # StorageError: the data dir's failure, reported (and halting) already
                log.warning("periodic_task_failed", broker_id=self.broker_id, error=str(exc))
            except Exception:
                log.exception("periodic_task_failed", broker_id=self.broker_id)

    def stop_waiting(self) -> None:
        """Shutdown step 1: answer every waiting request now (produce: a retriable error) and wait no more."""
        self._closing = True
        self.produce_purgatory.complete_all(
            lambda op: op.result_with(ErrorCode.NOT_LEADER_OR_FOLLOWER) if isinstance(op, DelayedProduce) else {})
        self.fetch_purgatory.complete_all(lambda op: False)

    async def shutdown(self) -> None:
        """Fail delayed operations with a retriable error, stop fetchers, checkpoint, close logs."""
        self.stop_waiting()
        for t in self._loops:
            t.cancel()
        for t in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.fetcher is not None:
            await self.fetcher.shutdown()
        for t in list(self._tasks):
            t.cancel()
        # Each step goes on past a failure of the one before: a HW checkpoint that cannot be written (a full
        # disk) must not leave the logs unflushed and unclosed. A storage failure is the data dir's, already
        # reported (the broker exits non-zero once the logs are closed: BrokerProcess.stop).
        try:
            await self.checkpoint_high_watermarks()
        except Exception as exc:
            log.warning("hw_checkpoint_not_written", broker_id=self.broker_id, error=str(exc))
        try:
            await self.log_manager.close()
        except Exception as exc:
            log.exception("log_manager_close_failed", broker_id=self.broker_id, error=str(exc))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- HW checkpoint ---------------------------------------------------------------------------
    def high_watermarks(self) -> dict[TopicPartition, int]:
        hws = {tp: hw for tp, hw in self._restored_hws.items() if self.log_manager.get_log(tp) is not None}
        hws.update({tp: p.state.high_watermark for tp, p in self.partitions.items()})
        return hws

    async def checkpoint_high_watermarks(self) -> None:
        """Write the HW checkpoint; never before ``start`` read it (a start that failed earlier would replace
        the HWs it never loaded with none: Kafka writes HWs only for partitions it has online), nor once the
        data dir has failed (a broken leader's HW is no longer one its followers agreed on)."""
        if not self._hws_loaded or self.log_manager.failure is not None:
            return
        hws = self.high_watermarks()
        await asyncio.to_thread(self.log_manager.checkpoint_high_watermarks, hws)

    # ---- control requests ----------------------------------------------------------------------
    def _check_control(self, header: ControlHeader) -> ErrorCode:
        if header.controller_epoch < self.controller_epoch:
            return ErrorCode.STALE_CONTROLLER_EPOCH
        if header.broker_epoch >= 0 and header.broker_epoch < self._broker_epoch:
            return ErrorCode.STALE_BROKER_EPOCH
        if header.broker_epoch >= 0 and self._broker_epoch < 0:
            # Not registered yet: the epoch may be the previous incarnation's, whose orders this process must
            # not obey. The controller retries once our registration is known on both sides.
            return ErrorCode.STALE_BROKER_EPOCH
        return ErrorCode.NONE

    async def leader_and_isr(self, req: LeaderAndIsrRequest) -> dict[str, Any]:
        async with self._state_lock:
            error = self._check_control(req.header)
            if error is not ErrorCode.NONE:
                log.warning("stale_control_request", broker_id=self.broker_id, api="leader_and_isr",
                            controller_epoch=req.header.controller_epoch, current=self.controller_epoch,
                            error=error.name)
                return {"error": int(error), "partitions": []}
            self.controller_epoch = req.header.controller_epoch
            self.metadata.add_brokers(req.live_leaders)
            results = []
            applied = []
            for msg in req.partition_states:
                try:
                    code = await self._apply_partition_state(msg, req.topic_configs.get(msg.tp.topic, {}))
                except MinibrokerError as exc:  # StorageError (the epoch checkpoint): reported as the dir's failure
                    log.warning("leader_and_isr_partition_failed", broker_id=self.broker_id, topic=msg.tp.topic,
                                partition=msg.tp.partition, error=str(exc), code=exc.code.name)
                    code = exc.code
                except Exception as exc:  # one partition's failure must not leave the rest of the request unapplied
                    log.exception("leader_and_isr_partition_failed", broker_id=self.broker_id, topic=msg.tp.topic,
                                  partition=msg.tp.partition, error=str(exc))
                    code = ErrorCode.UNKNOWN_SERVER_ERROR
                if code is ErrorCode.NONE:
                    applied.append(msg)
                results.append({"topic": msg.tp.topic, "partition": msg.tp.partition, "error": int(code)})
            # Only what was applied reaches the metadata clients see: a state refused as stale would name an
            # old leader until the partition changes again (Kafka's LeaderAndIsr leaves the cache alone).
            self.metadata.update(req.header.controller_id, None, applied, req.topic_configs, [])
        if self.fetcher is not None:
            await self.fetcher.shutdown_idle_fetchers()
        return {"error": 0, "partitions": results}

    async def _apply_partition_state(self, msg: PartitionStateMsg, topic_config: dict[str, Any]) -> ErrorCode:
        tp = msg.tp
        if self.broker_id not in msg.replicas:
            log.warning("leader_and_isr_not_a_replica", broker_id=self.broker_id, topic=tp.topic,
                        partition=tp.partition, replicas=list(msg.replicas))
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        p = self.partitions.get(tp)
        if p is not None and not _is_newer(msg, p.state):
            log.info("leader_and_isr_stale_partition", broker_id=self.broker_id, topic=tp.topic,
                     partition=tp.partition, leader_epoch=msg.leader_epoch, current_leader_epoch=p.state.leader_epoch)
            return ErrorCode.STALE_CONTROLLER_EPOCH
        try:
            cfg = self.config.with_topic_overrides(topic_config)
        except ConfigError as exc:
            log.warning("bad_topic_config", topic=tp.topic, error=str(exc))
            cfg = self.config
        if p is None:
            try:
                p = await self._create_partition(tp, cfg)
            except Exception as exc:
                log.exception("partition_create_failed", broker_id=self.broker_id, topic=tp.topic,
                              partition=tp.partition, error=str(exc))
                return ErrorCode.KAFKA_STORAGE_ERROR
            if self.partitions.get(tp) is not None and not _is_newer(msg, self.partitions[tp].state):
                return ErrorCode.STALE_CONTROLLER_EPOCH
        elif topic_config:
            p.config = cfg
            self._update_log_config(p)
        if msg.leader == self.broker_id:
            self._make_leader(p, msg)
        else:
            self._make_follower(p, msg)
        return ErrorCode.NONE

    async def _create_partition(self, tp: TopicPartition, cfg: Config) -> Partition:
        from storage.log import LogConfig
        the_log = await self.log_manager.get_or_create_log(tp, LogConfig.from_config(cfg))
        hw = self._restored_hws.pop(tp, 0)
        hw = max(the_log.log_start_offset, min(hw, the_log.log_end_offset))
        p = Partition(tp, the_log, ps.PartitionState(broker_id=self.broker_id, high_watermark=hw), cfg)
        self.partitions[tp] = p
        return p

    def _update_log_config(self, p: Partition) -> None:
        from storage.log import LogConfig
        p.log.update_config(LogConfig.from_config(p.config))

    def _make_leader(self, p: Partition, msg: PartitionStateMsg) -> None:
        """Kafka ``makeLeader``: stop fetching, record (epoch, LEO) in the epoch cache, then lead."""
        tp = p.tp
        self._stop_fetching([tp])
        was_leader_same_epoch = p.is_leader and p.state.leader_epoch == msg.leader_epoch
        self._isr_backoff_until.pop(tp, None)
        leo = p.log_end_offset
        if not was_leader_same_epoch:
            _assign_epoch(p.log, msg.leader_epoch, leo)
        old_isr = p.state.isr
        p.state = ps.become_leader(p.state, leader_epoch=msg.leader_epoch, partition_epoch=msg.partition_epoch,
                                   isr=msg.isr, replicas=msg.replicas, leader_end_offset=leo,
                                   high_watermark=p.state.high_watermark, now_ms=self.clock.monotonic_ms())
        if not was_leader_same_epoch:
            log.info("became_leader", broker_id=self.broker_id, topic=tp.topic, partition=tp.partition,
                     leader_epoch=msg.leader_epoch, partition_epoch=msg.partition_epoch, isr=list(msg.isr),
                     replicas=list(msg.replicas), log_end_offset=leo, high_watermark=p.state.high_watermark)
        self._maybe_advance_hw(p)
        if was_leader_same_epoch:
            self._log_isr_updated(p, old_isr, source="controller")
        self.produce_purgatory.check_and_complete(tp)
        self.fetch_purgatory.check_and_complete(tp)

    def _make_follower(self, p: Partition, msg: PartitionStateMsg) -> None:
        """Kafka ``makeFollower``: stop fetching first, then fetch from the new leader (the fetcher
        truncates by leader epoch; never blindly to the HW)."""
        tp = p.tp
        same_leader = (p.state.role is ps.Role.FOLLOWER and p.state.leader == msg.leader
                       and p.state.leader_epoch == msg.leader_epoch)
        old_isr = p.state.isr
        if same_leader and tp in self._fetching:
            # An ISR-only update (newer partition epoch): keep the running fetch, as Kafka does.
            p.state = ps.become_follower(p.state, leader=msg.leader, leader_epoch=msg.leader_epoch,
                                         partition_epoch=msg.partition_epoch, isr=msg.isr, replicas=msg.replicas,
                                         log_end_offset=p.log_end_offset)
            self._log_isr_updated(p, old_isr, source="controller")
            return
        self._stop_fetching([tp])
        p.state = ps.become_follower(p.state, leader=msg.leader, leader_epoch=msg.leader_epoch,
                                     partition_epoch=msg.partition_epoch, isr=msg.isr, replicas=msg.replicas,
                                     log_end_offset=p.log_end_offset)
        if not same_leader:
            log.info("became_follower", broker_id=self.broker_id, topic=tp.topic, partition=tp.partition,
                     leader=msg.leader, leader_epoch=msg.leader_epoch, partition_epoch=msg.partition_epoch,
                     isr=list(msg.isr), replicas=list(msg.replicas), log_end_offset=p.log_end_offset,
                     high_watermark=p.state.high_watermark)
        else:
            self._log_isr_updated(p, old_isr, source="controller")
        self.produce_purgatory.check_and_complete(tp)
        self.fetch_purgatory.check_and_complete(tp)
        leader = self.metadata.brokers.get(msg.leader)
        if self.fetcher is None or msg.leader < 0:
            return
        if leader is None:
            log.warning("leader_endpoint_unknown", broker_id=self.broker_id, topic=tp.topic,
                        partition=tp.partition, leader=msg.leader)
            return
        endpoint = BrokerEndpoint(leader.node_id, leader.host, leader.port)
        self.fetcher.add_partitions({tp: InitialFetchState(endpoint, msg.leader_epoch, p.log_end_offset)})
        self._fetching.add(tp)

    def _stop_fetching(self, tps: list[TopicPartition]) -> None:
        if self.fetcher is not None:
            self.fetcher.remove_partitions(tps)
        self._fetching.difference_update(tps)

    async def stop_replica(self, header: ControlHeader, parts: list[StopReplicaPartition]) -> dict[str, Any]:
        async with self._state_lock:
            error = self._check_control(header)
            if error is not ErrorCode.NONE:
                return {"error": int(error), "partitions": []}
            self.controller_epoch = header.controller_epoch
            fenced = {sp.tp for sp in parts if self._stop_is_fenced(sp)}
            # Kafka's stopReplicas: only the partitions whose epoch check passed stop fetching.
            self._stop_fetching([sp.tp for sp in parts if sp.tp not in fenced])
            results = []
            for sp in parts:
                code = ErrorCode.FENCED_LEADER_EPOCH if sp.tp in fenced else await self._stop_partition(sp)
                results.append({"topic": sp.tp.topic, "partition": sp.tp.partition, "error": int(code)})
        if self.fetcher is not None:
            await self.fetcher.shutdown_idle_fetchers()
        return {"error": 0, "partitions": results}

    def _stop_is_fenced(self, sp: StopReplicaPartition) -> bool:
        """Kafka: -2 (EpochDuringDelete) and -1 (no epoch) always apply; otherwise the request's epoch must be
        newer than the partition's (an equal one is refused too)."""
        p = self.partitions.get(sp.tp)
        return p is not None and sp.leader_epoch >= 0 and sp.leader_epoch <= p.state.leader_epoch

    async def _stop_partition(self, sp: StopReplicaPartition) -> ErrorCode:
        p = self.partitions.get(sp.tp)
        if p is not None:
            self._restored_hws[sp.tp] = p.state.high_watermark
            del self.partitions[sp.tp]
            self._isr_backoff_until.pop(sp.tp, None)  # one entry per partition ever refused, deleted topics too
            log.info("replica_stopped", broker_id=self.broker_id, topic=sp.tp.topic, partition=sp.tp.partition,
                     leader_epoch=p.state.leader_epoch, delete=sp.delete, high_watermark=p.state.high_watermark)
        self.produce_purgatory.check_and_complete(sp.tp)
        self.fetch_purgatory.check_and_complete(sp.tp)
        if sp.delete and self.log_manager.get_log(sp.tp) is not None:
            self._restored_hws.pop(sp.tp, None)
            try:
                await self.log_manager.delete_log(sp.tp)
            except Exception as exc:
                log.exception("log_delete_failed", topic=sp.tp.topic, partition=sp.tp.partition, error=str(exc))
                return ErrorCode.KAFKA_STORAGE_ERROR
        return ErrorCode.NONE

    async def update_metadata(self, req: UpdateMetadataRequest) -> dict[str, Any]:
        # Under the lock of LeaderAndIsr and StopReplica, as Kafka's maybeUpdateMetadataCache takes the
        # replicaStateChangeLock: a LeaderAndIsr waiting on a log's creation would otherwise write its older
        # partition states into the metadata after a newer UpdateMetadata had.
        async with self._state_lock:
            return self._update_metadata(req)

    def _update_metadata(self, req: UpdateMetadataRequest) -> dict[str, Any]:
        error = self._check_control(req.header)
        if error is not ErrorCode.NONE:
            return {"error": int(error)}
        self.controller_epoch = req.header.controller_epoch
        self.metadata.update(req.header.controller_id, req.brokers, req.partition_states, req.topic_configs,
                             req.deleted_topics, full=req.full)
        # The cluster changed (a broker fenced and unfenced again, in one UpdateMetadata or learnt first from a
        # LeaderAndIsr's live leaders, leaves the live set as it was): a replica refused as ineligible may be
        # eligible now. Kafka remembers no refusal; this keeps one until the next UpdateMetadata, so a
        # follower the controller keeps refusing is not asked for on every fetch.
        for p in self.partitions.values():
            if p.state.ineligible:
                p.state = p.state._replace(ineligible=frozenset())
        for topic, cfg in req.topic_configs.items():
            for tp, p in self.partitions.items():
                if tp.topic == topic:
                    with contextlib.suppress(ConfigError):
                        p.config = self.config.with_topic_overrides(cfg)
                        self._update_log_config(p)
        return {"error": 0}

    # ---- HW and ISR --------------------------------------------------------------------------------
    def _maybe_advance_hw(self, p: Partition) -> bool:
        if not p.is_leader:
            return False
        old = p.state.high_watermark
        p.state = ps.advance_high_watermark(p.state, p.log_end_offset)
        if p.state.high_watermark == old:
            return False
        self.produce_purgatory.check_and_complete(p.tp)
        self.fetch_purgatory.check_and_complete(p.tp)
        return True

    def maybe_shrink_isr(self) -> None:
        for p in list(self.partitions.values()):
            self._maybe_request_isr_change(p)

    def _maybe_request_isr_change(self, p: Partition) -> None:
        # A leader whose data dir failed must not shrink the ISR to itself (its followers cannot catch up on
        # a log it cannot read): it stops asking; the broker halts and the controller fences it.
        if self.alter_sender is None or self._closing or self.log_manager.failure is not None:
            return
        now = self.clock.monotonic_ms()
        if self._isr_backoff_until.get(p.tp, 0) > now:
            return
        change = ps.next_isr_change(p.state, now_ms=now, leader_end_offset=p.log_end_offset,
                                    replica_lag_time_max_ms=self.config.get_int("replica.lag.time.max.ms"),
                                    alive=self.metadata.brokers if self.metadata.live_brokers_known else None)
        if change is None:
            return
        p.state = p.state._replace(pending=change)
        log.info("isr_change_requested", broker_id=self.broker_id, topic=p.tp.topic, partition=p.tp.partition,
                 leader_epoch=p.state.leader_epoch, partition_epoch=p.state.partition_epoch,
                 isr=list(p.state.isr), new_isr=list(change.new_isr), expand=change.is_expand,
                 high_watermark=p.state.high_watermark, log_end_offset=p.log_end_offset)
        epochs = {r.broker_id: r.broker_epoch for r in p.state.followers if r.broker_id in change.new_isr}
        epochs[self.broker_id] = self._broker_epoch
        # the epochs go with the change as decided now (Kafka builds the AlterPartition from the state the change
        # was prepared on): read when the task first runs, a LeaderAndIsr handled in between would label this
        # change with its newer partition epoch, and the controller would apply an ISR computed from older state
        self._spawn(self._send_isr_change(p, change, epochs, p.state))

    async def _send_isr_change(self, p: Partition, change: ps.PendingIsrChange, epochs: dict[int, int],
                               sent: ps.PartitionState) -> None:
        """Send the pending ISR change until the controller gives a definite answer.

        As Kafka's ``Partition.handleAlterPartitionError``: the pending change (and so the maximal ISR the HW
        counts) is dropped only when the controller certainly did not apply it (INELIGIBLE_REPLICA,
        INVALID_REQUEST, checked against the very state the leader holds). A timeout or a lost answer may
        hide a change the controller did apply: dropping the pending addition then would let the HW pass a
        replica the controller counts in the ISR and may elect, so acknowledged writes could be lost. Such
        changes are asked again (the controller answers a change it already applied with its committed
        state), and INVALID_UPDATE_VERSION carries the controller's state, which the leader takes as a
        LeaderAndIsr at its own leader epoch would be taken (KRaft's leader learns it from the metadata log).
        """
        assert self.alter_sender is not None
        backoff_ms = ISR_RETRY_BACKOFF_MS
        while True:
            try:
                result = await self.alter_sender.alter_partition(p.tp, sent.leader_epoch, sent.partition_epoch,
                                                                 change.new_isr, epochs)
            except Exception as exc:
                log.exception("alter_partition_failed", topic=p.tp.topic, partition=p.tp.partition, error=str(exc))
                result = AlterResult(ErrorCode.UNKNOWN_SERVER_ERROR)
            # ``is``, not ``==``: a later change of the same ISR (after a LeaderAndIsr cleared this one, at a newer
            # partition epoch) is equal by value, and this older answer must not settle it (Kafka's callback
            # checks the pending state it was sent for, partition epoch included)
            if (self.partitions.get(p.tp) is not p or p.state.pending is not change
                    or p.state.leader_epoch != sent.leader_epoch):
                return  # the partition moved meanwhile; LeaderAndIsr carries the truth
            if result.error is ErrorCode.NONE:
                self._isr_change_done(p, result, change)
                return
            log.warning("isr_change_rejected", broker_id=self.broker_id, topic=p.tp.topic, partition=p.tp.partition,
                        leader_epoch=sent.leader_epoch, partition_epoch=sent.partition_epoch,
                        new_isr=list(change.new_isr), error=result.error.name)
            if (result.error is ErrorCode.INVALID_UPDATE_VERSION and result.leader_epoch == sent.leader_epoch
                    and result.isr):
                self._isr_change_done(p, result, change)  # the controller's committed ISR, at our leader epoch
                return
            if result.error in (ErrorCode.INELIGIBLE_REPLICA, ErrorCode.INVALID_REQUEST):
                p.state = ps.isr_change_refused(p.state, ineligible=result.error is ErrorCode.INELIGIBLE_REPLICA)
                # do not ask again on every follower fetch meanwhile
                self._isr_backoff_until[p.tp] = self.clock.monotonic_ms() + ISR_RETRY_BACKOFF_MS
                # A dropped addition no longer holds the HW back: nothing else may wake the waiting produces
                # (caught-up followers are parked in long polls), so re-evaluate now.
                self._maybe_advance_hw(p)
                return
            # Outcome unknown (a timeout), or the controller moved on (a new leader epoch, this broker
            # re-registering): keep the pending change and ask again until an answer or a LeaderAndIsr.
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms = min(2 * backoff_ms, ISR_RETRY_MAX_BACKOFF_MS)
            if self._closing or self.partitions.get(p.tp) is not p or p.state.pending is not change:
                return  # no longer ours to ask: one AlterPartition in flight per partition

    def _isr_change_done(self, p: Partition, result: AlterResult, change: ps.PendingIsrChange) -> None:
        """Take the controller's committed ISR for ``p`` (its answer to our AlterPartition ``change``).

        As Kafka's ``Partition.handleAlterPartitionUpdate``, an expansion or shrink is counted by the kind of
        the change asked for, when the controller committed it: answered NONE, or INVALID_UPDATE_VERSION
        carrying that very ISR (a resend of a change applied whose answer was lost). An ISR adopted from an
        INVALID_UPDATE_VERSION that is not ours counts as neither, whatever its size; so does an answer
        not taken (another leader epoch, an older partition epoch).
        """
        self._isr_backoff_until.pop(p.tp, None)
        before = p.state.isr
        applies = result.leader_epoch == p.state.leader_epoch and result.partition_epoch >= p.state.partition_epoch
        ours = result.error is ErrorCode.NONE or (
            len(result.isr) == len(change.new_isr) and set(result.isr) == set(change.new_isr))
        p.state = ps.isr_change_committed(p.state, leader_epoch=result.leader_epoch, isr=result.isr,
                                          partition_epoch=result.partition_epoch)
        if applies and ours:
            (self.metrics.isr_expands if change.is_expand else self.metrics.isr_shrinks).inc()
        self._maybe_advance_hw(p)
        self._log_isr_updated(p, before, source="alter_partition")
        self.produce_purgatory.check_and_complete(p.tp)

    def _log_isr_updated(self, p: Partition, old_isr: tuple[int, ...], *, source: str) -> None:
        """``isr_updated`` when the ISR changed, after the HW has moved with it (a newer partition epoch that
        leaves the ISR as it was is no ISR update)."""
        if tuple(p.state.isr) == tuple(old_isr):
            return
        log.info("isr_updated", broker_id=self.broker_id, topic=p.tp.topic, partition=p.tp.partition,
                 leader_epoch=p.state.leader_epoch, partition_epoch=p.state.partition_epoch,
                 isr=list(p.state.isr), old_isr=list(old_isr), high_watermark=p.state.high_watermark,
                 source=source)

    # ---- produce ------------------------------------------------------------------------------------
    async def produce(self, req: ProduceRequest) -> dict[TopicPartition, dict[str, Any]]:
        results: dict[TopicPartition, dict[str, Any]] = {}
        waits: dict[TopicPartition, ProduceWait] = {}
        if req.acks not in (-1, 0, 1):
            return {tp: _produce_result(tp, ErrorCode.INVALID_REQUIRED_ACKS, "acks must be -1, 0 or 1")
                    for tp in req.partitions}
        for tp, records in req.partitions.items():
            results[tp] = self._append(tp, records, req.acks, waits)
        if req.acks != -1 or not waits:
            return results
        answers = await self._wait_produce(waits, req.timeout_ms)
        for tp, code in answers.items():
            if code is not ErrorCode.NONE:
                results[tp]["error"] = int(code)
        return results

    def _append(self, tp: TopicPartition, records: bytes, acks: int,
                waits: dict[TopicPartition, ProduceWait]) -> dict[str, Any]:
        p = self.partitions.get(tp)
        if p is None:
            return _produce_result(tp, self._unknown_or_not_leader(tp))
        if not p.is_leader:
            return _produce_result(tp, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        try:
            headers = check_batches(records, max_batch_size=p.max_message_bytes)
        except InvalidBatchError as exc:
            return _produce_result(tp, exc.code, str(exc))
        if not headers:
            return _produce_result(tp, ErrorCode.INVALID_RECORD, "no record batch in records")
        append_time = -1
        data: bytes | bytearray = records  # a stamped copy when a batch's timestamp type is set here
        if p.log_append_time:  # Kafka's LogValidator: the leader's time replaces the producer's, unchecked
            append_time = self.clock.now_ms()
            data = set_timestamp_type(records, headers, append_time)
        else:
            stale = check_timestamps(headers, self.clock.now_ms(), *p.timestamp_bounds_ms)
            if stale is not None:
                return _produce_result(tp, ErrorCode.INVALID_TIMESTAMP, stale)
            for h in headers:
                if h.attributes:  # the LogAppendTime bit (check_batches refused any other): CreateTime here
                    data = set_timestamp_type(records, headers, None)
                    break
        if acks == -1 and len(p.state.isr) < p.min_insync_replicas:
            return _produce_result(tp, ErrorCode.NOT_ENOUGH_REPLICAS,
                                   f"ISR {list(p.state.isr)} < min.insync.replicas {p.min_insync_replicas}")
        try:
            info = p.log.append_as_leader(data, p.state.leader_epoch)
        except InvalidBatchError as exc:
            return _produce_result(tp, exc.code, str(exc))
        except ProducerStateError as exc:  # out of order, fenced producer epoch: the client's business
            log.info("produce_refused", broker_id=self.broker_id, topic=tp.topic, partition=tp.partition,
                     code=exc.code.name, error=str(exc))
            return _produce_result(tp, exc.code, str(exc))
        except MinibrokerError as exc:  # StorageError, StaleLeaderEpochError
            log.warning("append_failed", broker_id=self.broker_id, topic=tp.topic, partition=tp.partition,
                        error=str(exc), code=exc.code.name)
            return _produce_result(tp, exc.code, str(exc))
        except Exception as exc:
            log.exception("append_failed", broker_id=self.broker_id, topic=tp.topic, partition=tp.partition,
                          error=str(exc))
            return _produce_result(tp, ErrorCode.KAFKA_STORAGE_ERROR, str(exc))
        if info.duplicate:
            # Kafka answers a duplicate with the original batch's offsets and, for acks=all, still only once
            # the HW has passed the original batch: it may not be committed yet (appended by this leader a
            # moment ago, or by its predecessor).
            if acks == -1:
                waits[tp] = ProduceWait(p.state.leader_epoch, info.last_offset + 1)
            return {"partition": tp.partition, "error": 0, "base_offset": info.first_offset,
                    # Kafka answers the original batch's time (its producer state keeps a timestamp per batch;
                    # ours does not): the client then reports the record's own timestamp
                    "log_start_offset": p.log_start_offset, "log_append_time_ms": -1}
        metrics = self.metrics
        metrics.bytes_in += len(records)
        metrics.messages_in += info.num_records
        if acks == -1:
            waits[tp] = ProduceWait(p.state.leader_epoch, info.last_offset + 1)
        if not self._maybe_advance_hw(p):  # (a moved HW has woken the delayed fetches already)
            self.fetch_purgatory.check_and_complete(tp)  # followers long-polling for new data
        return {"partition": tp.partition, "error": 0, "base_offset": info.first_offset,
                "log_start_offset": p.log_start_offset, "log_append_time_ms": append_time}

    def _unknown_or_not_leader(self, tp: TopicPartition) -> ErrorCode:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER if tp in self.metadata.partitions \
            else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def _leader_view(self, tp: TopicPartition) -> LeaderView | None:
        p = self.partitions.get(tp)
        if p is None:
            return None
        return LeaderView(p.is_leader, p.state.leader_epoch, p.state.high_watermark, len(p.state.isr),
                          p.min_insync_replicas)

    async def _wait_produce(self, waits: dict[TopicPartition, ProduceWait],
                            timeout_ms: int) -> dict[TopicPartition, ErrorCode]:
        fut: asyncio.Future[dict[TopicPartition, ErrorCode]] = asyncio.get_running_loop().create_future()
        deadline = self.clock.monotonic_ms() + timeout_ms
        op = DelayedProduce(deadline, waits, self._leader_view, lambda r: _resolve(fut, r))
        if self._closing:  # as stop_waiting answers: what is committed already stays NONE
            op.check()
            op.force_complete(op.result_with(ErrorCode.NOT_LEADER_OR_FOLLOWER))
        elif not self.produce_purgatory.try_complete_else_watch(op, waits):
            await self._await_op(op, fut, timeout_ms, self.produce_purgatory)
        assert op.result is not None
        return op.result

    async def _await_op(self, op: DelayedOperation[Any], fut: asyncio.Future[Any], timeout_ms: int,
                        purgatory: Purgatory) -> None:
        """Wait for ``op`` (watched in ``purgatory``) to complete; expire it after ``timeout_ms``.

        One timer handle per operation, cancelled when it completes: cheaper than ``wait_for(shield(...))``
        (a timer, a waiter future, a shield future and their callbacks per delayed produce and fetch).
        """
        timer = asyncio.get_running_loop().call_later(timeout_ms / 1000, purgatory.expire, op)
        try:
            await fut
        except asyncio.CancelledError:
            purgatory.expire(op)  # the client went away
            raise
        finally:
            timer.cancel()

    # ---- fetch ---------------------------------------------------------------------------------------
    async def fetch(self, req: FetchRequest) -> dict[str, Any]:
        if req.is_follower and self._stale_follower_epoch(req):
            return {"error": int(ErrorCode.STALE_BROKER_EPOCH), "topics": []}
        results, total, errored = self._read_all(req, first=True)
        if req.max_wait_ms == 0 or total >= req.min_bytes or errored or not req.partitions or self._closing:
            self._count_bytes_out(req, total)
            return _fetch_response(results)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        deadline = self.clock.monotonic_ms() + req.max_wait_ms
        op = DelayedFetch(deadline, lambda: self._fetch_ready(req), lambda r: _resolve(fut, r))
        if not self.fetch_purgatory.try_complete_else_watch(op, req.partitions):
            await self._await_op(op, fut, req.max_wait_ms, self.fetch_purgatory)
        results, total, _ = self._read_all(req, first=False)
        self._count_bytes_out(req, total)
        return _fetch_response(results)

    def _count_bytes_out(self, req: FetchRequest, total: int) -> None:
        """Kafka's BytesOutPerSec counts what consumers get; followers' fetches are ReplicationBytesOutPerSec."""
        if req.is_follower:
            self.metrics.replication_bytes_out += total
        else:
            self.metrics.bytes_out += total

    def _stale_follower_epoch(self, req: FetchRequest) -> bool:
        """A fetch from an older incarnation of a follower than one already seen."""
        if req.broker_epoch < 0:
            return False
        for tp in req.partitions:
            p = self.partitions.get(tp)
            r = p.state.follower(req.replica_id) if p is not None else None
            if r is not None and r.broker_epoch > req.broker_epoch:
                return True
        return False

    def _read_all(self, req: FetchRequest, *, first: bool
                  ) -> tuple[dict[TopicPartition, dict[str, Any]], int, bool]:
        results: dict[TopicPartition, dict[str, Any]] = {}
        total = 0
        errored = False
        for tp, fp in req.partitions.items():
            budget = req.max_bytes - total
            res = self._read_partition(req, tp, fp, budget if budget > 0 else 0, min_one=(total == 0),
                                       update_follower=first)
            results[tp] = res
            total += len(res["records"])
            if res["error"] or res.get("diverging_epoch"):
                errored = True  # a follower told to truncate is answered at once (Kafka's hasDivergingEpoch)
        return results, total, errored

    def _read_partition(self, req: FetchRequest, tp: TopicPartition, fp: FetchPartitionRequest, budget: int,
                        *, min_one: bool, update_follower: bool) -> dict[str, Any]:
        p = self.partitions.get(tp)
        if p is None:
            return _fetch_answer(tp, self._unknown_or_not_leader(tp))
        code = self._check_fetch_partition(req, p, fp)
        if code is not ErrorCode.NONE:
            return _fetch_answer(tp, code, p)
        the_log = p.log
        diverging = self._diverging_epoch(p, fp)
        if isinstance(diverging, ErrorCode):
            return _fetch_answer(tp, diverging, p)
        if diverging is not None:
            out = _fetch_answer(tp, ErrorCode.NONE, p)
            out["diverging_epoch"] = diverging
            return out
        leo = the_log.log_end_offset
        offset = fp.fetch_offset
        if offset > leo or offset < the_log.log_start_offset:
            return _fetch_answer(tp, ErrorCode.OFFSET_OUT_OF_RANGE, p)
        max_offset = None if req.is_follower else p.state.high_watermark
        records: bytes = b""
        limit = budget if budget < fp.partition_max_bytes else fp.partition_max_bytes
        if (max_offset is None or offset < max_offset) and offset < leo and (limit > 0 or min_one):
            try:
                # The segment's own buffer (bytes from pread): no copy before the response encoder.
                records = the_log.read(offset, limit, max_offset, min_one).records
            except MinibrokerError as exc:  # OffsetOutOfRangeError, StorageError
                return _fetch_answer(tp, exc.code, p)
        if update_follower and req.is_follower:
            self._update_follower(p, req, fp)
        return _fetch_answer(tp, ErrorCode.NONE, p, records)

    def _check_fetch_partition(self, req: FetchRequest, p: Partition, fp: FetchPartitionRequest) -> ErrorCode:
        # Kafka checks the leader epoch before leadership (localLogOrException): a fetcher ahead of us
        # learns UNKNOWN_LEADER_EPOCH (retry), one behind FENCED_LEADER_EPOCH (wait for metadata).
        cle = fp.current_leader_epoch
        if cle >= 0 and cle < p.state.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if cle > p.state.leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
        if not p.is_leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if req.is_follower and req.replica_id == self.broker_id:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if req.is_follower and req.replica_id not in p.state.replicas:
            # Kafka's followerReplicaOrThrow: with a current leader epoch (which matched) the follower may be a
            # replica this leader has not heard of yet (a reassignment): UNKNOWN_LEADER_EPOCH, retried
            return ErrorCode.UNKNOWN_LEADER_EPOCH if cle >= 0 else ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    def _diverging_epoch(self, p: Partition, fp: FetchPartitionRequest) -> dict[str, int] | ErrorCode | None:
        """KIP-320: the fetcher's last epoch ends earlier here than its fetch offset -> tell it where.

        As Kafka's Partition.readRecords: when the end of the fetcher's last epoch cannot be determined here
        (an epoch this log has no entry at or below), or the fetch offset is below the log start (whether or
        not the epochs diverge), the answer is OFFSET_OUT_OF_RANGE. It used to be a diverging epoch of
        (-1, -1), on which a fetcher falls back to truncating at its HW, the blind truncation KIP-101 ended."""
        if fp.last_fetched_epoch < 0:
            return None
        epoch, end = p.log.end_offset_for_epoch(fp.last_fetched_epoch)
        if epoch < 0 or end < 0 or fp.fetch_offset < p.log.log_start_offset:
            return ErrorCode.OFFSET_OUT_OF_RANGE
        if end < fp.fetch_offset or epoch < fp.last_fetched_epoch:
            return {"epoch": epoch, "end_offset": end}
        return None

    def _update_follower(self, p: Partition, req: FetchRequest, fp: FetchPartitionRequest) -> None:
        before = p.state.follower(req.replica_id)
        p.state = ps.update_follower(p.state, broker_id=req.replica_id, fetch_offset=fp.fetch_offset,
                                     log_start_offset=fp.log_start_offset, now_ms=self.clock.monotonic_ms(),
                                     leader_end_offset=p.log_end_offset, broker_epoch=req.broker_epoch)
        # Kafka's fetch path only tries to expand the ISR with the fetching follower (maybeExpandIsr); shrinks
        # are periodic (maybe_shrink_isr). A follower already in the ISR cannot be added, so skip the check.
        if req.replica_id not in p.state.isr:
            self._maybe_request_isr_change(p)
        # The HW moves with the ISR's LEOs: a follower fetching at the same offset again cannot move it (an
        # append, an ISR change and a refused ISR change each re-evaluate it themselves).
        if before is None or before.log_end_offset != fp.fetch_offset:
            self._maybe_advance_hw(p)

    def _fetch_ready(self, req: FetchRequest) -> bool:
        """Enough new data (or an error) for a waiting fetch (Kafka ``DelayedFetch.tryComplete``)."""
        if self._closing:
            return True
        total = 0
        for tp, fp in req.partitions.items():
            p = self.partitions.get(tp)
            if p is None or self._check_fetch_partition(req, p, fp) is not ErrorCode.NONE:
                return True
            if fp.fetch_offset > p.log_end_offset or fp.fetch_offset < p.log_start_offset:
                return True  # out of range now: answer with the error
            # a consumer between the HW and the LEO (a new leader's HW may lag) waits like one at the HW
            end = p.log_end_offset if req.is_follower else p.state.high_watermark
            if end > fp.fetch_offset:
                if req.min_bytes <= 1:
                    return True
                try:
                    data = p.log.read(fp.fetch_offset, fp.partition_max_bytes, None if req.is_follower else end,
                                      True)
                except MinibrokerError:
                    # Kafka's DelayedFetch.tryComplete: a partition's error completes the fetch (answered with
                    # it); it must not escape into the append or follower fetch whose check got here.
                    return True
                total += len(data.records)
                if total >= req.min_bytes:
                    return True
        return False

    # ---- offsets ---------------------------------------------------------------------------------------
    def _leader_for(self, tp: TopicPartition, current_leader_epoch: int) -> tuple[Partition | None, ErrorCode]:
        p = self.partitions.get(tp)
        if p is None:
            return None, self._unknown_or_not_leader(tp)
        if 0 <= current_leader_epoch < p.state.leader_epoch:
            return None, ErrorCode.FENCED_LEADER_EPOCH
        if current_leader_epoch > p.state.leader_epoch:
            return None, ErrorCode.UNKNOWN_LEADER_EPOCH
        if not p.is_leader:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        return p, ErrorCode.NONE

    def list_offsets(self, replica_id: int, parts: dict[TopicPartition, ListOffsetsPartition]
                     ) -> dict[TopicPartition, dict[str, Any]]:
        out = {}
        for tp, lp in parts.items():
            base: dict[str, Any] = {"partition": tp.partition, "timestamp": -1, "offset": -1, "leader_epoch": -1}
            p, code = self._leader_for(tp, lp.current_leader_epoch)
            if p is None:
                out[tp] = {**base, "error": int(code)}
                continue
            try:
                out[tp] = {**base, **self._list_offset(p, replica_id, lp.timestamp)}
            except MinibrokerError as exc:  # StorageError: this partition's answer, not the request's
                out[tp] = {**base, "error": int(exc.code)}
        return out

    @staticmethod
    def _list_offset(p: Partition, replica_id: int, timestamp: int) -> dict[str, Any]:
        """Kafka's ``Partition.fetchOffsetForTimestamp``: consumers see up to the HW, a follower
        (replica_id >= 0) up to the LEO. A new leader whose HW has not yet reached the start of its epoch
        does not know what is committed: LATEST, and a timestamp found at or above the HW, are then
        OFFSET_NOT_AVAILABLE (retriable) for consumers rather than a stale HW or "no such record"."""
        follower = replica_id >= 0
        limit = p.log_end_offset if follower else p.state.high_watermark
        lagging = not follower and p.state.leader_epoch_start_offset > p.state.high_watermark
        if timestamp == EARLIEST_TIMESTAMP:
            found = p.log.fetch_offset_by_timestamp(EARLIEST_TIMESTAMP)  # the log start and its epoch
            assert found is not None
            return {"error": 0, "offset": found.offset, "leader_epoch": found.leader_epoch}
        if timestamp == LATEST_TIMESTAMP:
            if lagging:
                return {"error": int(ErrorCode.OFFSET_NOT_AVAILABLE)}
            return {"error": 0, "offset": limit, "leader_epoch": p.state.leader_epoch}
        found = p.log.fetch_offset_by_timestamp(timestamp)
        if found is not None and found.offset < limit:
            return {"error": 0, "timestamp": found.timestamp, "offset": found.offset,
                    "leader_epoch": found.leader_epoch}
        return {"error": int(ErrorCode.OFFSET_NOT_AVAILABLE) if lagging else 0}

    def offsets_for_leader_epoch(self, parts: dict[TopicPartition, tuple[int, int]]
                                 ) -> dict[TopicPartition, dict[str, Any]]:
        out = {}
        for tp, (current, epoch) in parts.items():
            p, code = self._leader_for(tp, current)
            if p is None:
                out[tp] = {"partition": tp.partition, "error": int(code), "leader_epoch": -1, "end_offset": -1}
                continue
            found_epoch, end = p.log.end_offset_for_epoch(epoch)
            out[tp] = {"partition": tp.partition, "error": 0, "leader_epoch": found_epoch, "end_offset": end}
        return out

    # ---- status ----------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        now = self.clock.monotonic_ms()
        return {
            "node_id": self.broker_id, "role": "broker", "broker_epoch": self._broker_epoch,
            "controller_epoch": self.controller_epoch, "shutting_down": self.shutting_down,
            "partitions": [p.status(now) for _, p in sorted(self.partitions.items())],
        }

    def under_replicated_count(self) -> int:
        return sum(1 for p in self.partitions.values()
                   if p.is_leader and len(p.state.isr) < len(p.state.replicas))

    def offline_count(self) -> int:
        return sum(1 for s in self.metadata.partitions.values() if s.leader < 0)


def _is_newer(msg: PartitionStateMsg, state: ps.PartitionState) -> bool:
    """Apply a newer leader epoch; with the same leader epoch, a newer partition epoch is an ISR update
    (KRaft's rule: the controller may change the ISR without a new leader epoch)."""
    if msg.leader_epoch > state.leader_epoch:
        return True
    return msg.leader_epoch == state.leader_epoch and msg.partition_epoch > state.partition_epoch


def _assign_epoch(the_log: Log, epoch: int, start_offset: int) -> None:
    """Record (leader epoch, LEO) in the epoch cache (persisted) before accepting writes."""
    the_log.maybe_assign_epoch_start_offset(epoch, start_offset)


def check_batches(records: bytes, *, max_batch_size: int) -> list[BatchHeader]:
    """Length, magic, CRC, size and count of every batch; no record decoding (DESIGN.md: the CRC covers
    the records, and brokers never decode them on the produce path)."""
    headers = []
    pos = 0
    while pos < len(records):
        header = check_frame(records, pos, max_size=max_batch_size)
        headers.append(header)
        pos += header.size
    return headers


def check_timestamps(headers: list[BatchHeader], now_ms: int, before_ms: int, after_ms: int) -> str | None:
    """Why the batches' timestamps are out of bounds (KIP-937: ``message.timestamp.before.max.ms`` /
    ``after.max.ms`` around the broker's time), or None. From the headers only, as the rest of the produce
    path: a batch's first and largest timestamps (-1, no timestamp, is let through, as Kafka does). Kafka
    checks every record's; a record between the two that lies below them is not caught here."""
    for i, h in enumerate(headers):
        for ts in (h.first_timestamp, h.max_timestamp):
            if ts == -1:
                continue
            if ts - now_ms > after_ms:
                return (f"batch {i}: timestamp {ts} is {ts - now_ms} ms ahead of the broker's time "
                        f"(message.timestamp.after.max.ms={after_ms}; the producer's clock may be wrong)")
            if now_ms - ts > before_ms:
                return (f"batch {i}: timestamp {ts} is {now_ms - ts} ms behind the broker's time "
                        f"(message.timestamp.before.max.ms={before_ms})")
    return None


def _resolve(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _produce_result(tp: TopicPartition, code: ErrorCode, message: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"partition": tp.partition, "error": int(code), "base_offset": -1, "log_start_offset": -1,
                           "log_append_time_ms": -1}
    if message:
        out["error_message"] = message
    return out


def _fetch_answer(tp: TopicPartition, code: ErrorCode, p: Partition | None = None, records: bytes = b"",
                 ) -> dict[str, Any]:
    """One partition's fetch answer: an error, or (``ErrorCode.NONE``) the records read."""
    return {
        "partition": tp.partition, "error": int(code),
        "high_watermark": p.state.high_watermark if p is not None else -1,
        "log_start_offset": p.log_start_offset if p is not None else -1,
        "log_end_offset": p.log_end_offset if p is not None else -1,
        "diverging_epoch": None, "records": records,
    }


def _fetch_response(results: dict[TopicPartition, dict[str, Any]]) -> dict[str, Any]:
    return {"error": 0, "topics": nest(results)}


def nest(results: dict[TopicPartition, dict[str, Any]]) -> list[dict[str, Any]]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for tp, res in results.items():
        topics.setdefault(tp.topic, []).append(res)
    return [{"topic": t, "partitions": parts} for t, parts in topics.items()]
