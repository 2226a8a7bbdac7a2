"""One replica fetcher: an asyncio task replicating many partitions from one leader broker.

Kafka's ``AbstractFetcherThread``. ``do_work()`` is one step:

1. truncate: one OffsetsForLeaderEpoch for every partition in TRUNCATING state,
   then cut each local log per KIP-279 (``fetcher.state.decide_truncation``);
2. fetch: one Fetch carrying every fetchable partition, in round-robin order;
3. process each partition of the answer: append the leader's bytes as follower,
   or truncate on a diverging epoch, or recover from OFFSET_OUT_OF_RANGE, or park.

``run()`` repeats it until the task is stopped. Safety against a partition that
moved while a request was in flight: after every await the partition's state
must be unchanged (same fetch offset, same leader epoch, same status) and
``FollowerPartitions.follower_log(tp, leader_epoch)`` must still return the log;
the check and the append/truncation run without an await in between.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from broker.requests import FetchPartitionRequest
from common.clock import Clock
from common.config import Config
from common.errors import ErrorCode, MinibrokerError
from common.logging import get_logger
from common.wire import TopicPartition
from fetcher.api import FollowerPartitions, InitialFetchState
from fetcher.endpoint import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    EpochRequest,
    FetchPartitionData,
    FetchRequest,
    FetchResponse,
    LeaderEndpoint,
    LeaderUnavailableError,
)
from fetcher.metrics import FetcherStats, TaskMetrics
from fetcher.state import (
    PARKED_UNTIL_READDED,
    UNDEFINED_EPOCH,
    EpochEndOffset,
    FetchStatus,
    OutOfRangeAction,
    PartitionFetchState,
    PartitionStates,
    decide_out_of_range_by_end,
    decide_out_of_range_by_start,
    decide_truncation,
    fetch_lag,
)
from storage.log import OffsetMismatchError
from storage.record_batch import InvalidBatchError, check_frame

log = get_logger("fetcher")


def _drop_epochs_without_data(local: Any) -> None:
    """Kafka's ``truncateTo`` at or past the LEO still trims the epoch cache from the LEO.

    A broker that became leader recorded (its epoch, its LEO) before writing anything; deposed
    before any write, it keeps an epoch entry with no data. As a follower that entry would be its
    "last fetched epoch" forever: the leader answers a diverging epoch that truncates nothing, again
    and again. (``Log.truncate_to`` is a no-op at the LEO, so the fetcher trims the cache itself.)
    """
    local.epoch_cache.truncate_from_end(local.log_end_offset)


def check_batches(records: bytes) -> None:
    """Frame and CRC of every batch (no record decoding); raises ``InvalidBatchError``."""
    pos, end = 0, len(records)
    while pos < end:
        pos += check_frame(records, pos).size


@dataclass(frozen=True, slots=True)
class FetcherConfig:
    wait_max_ms: int = 500
    min_bytes: int = 1
    partition_max_bytes: int = 1024 * 1024
    response_max_bytes: int = 10 * 1024 * 1024
    backoff_ms: int = 1_000
    socket_timeout_ms: int = 30_000
    num_fetchers: int = 1
    # KIP-320 truncation on fetch: a re-added partition whose log has an epoch starts FETCHING with
    # last_fetched_epoch and relies on the leader's diverging_epoch answer (one round trip fewer on a
    # leader change). Off by default: OffsetsForLeaderEpoch first is safe even against a leader
    # that does not compute diverging_epoch.
    truncate_on_fetch: bool = False

    @classmethod
    def from_config(cls, config: Config) -> FetcherConfig:
        return cls(
            wait_max_ms=config.get_int("replica.fetch.wait.max.ms"),
            min_bytes=config.get_int("replica.fetch.min.bytes"),
            partition_max_bytes=config.get_int("replica.fetch.max.bytes"),
            response_max_bytes=config.get_int("replica.fetch.response.max.bytes"),
            backoff_ms=config.get_int("replica.fetch.backoff.ms"),
            socket_timeout_ms=config.get_int("replica.socket.timeout.ms"),
            num_fetchers=config.get_int("num.replica.fetchers"),
        )


@dataclass(frozen=True, slots=True)
class WorkResult:
    """What one ``do_work`` did (tests look at it; ``run`` idles when nothing was sent)."""

    truncation_requests: int = 0
    fetch_requests: int = 0
    backed_off: bool = False

    @property
    def sent(self) -> bool:
        return self.truncation_requests + self.fetch_requests > 0


class FetcherTask:
    def __init__(self, fetcher_id: int, leader: LeaderEndpoint, partitions: FollowerPartitions,
                 config: FetcherConfig, clock: Clock, *, registry: CollectorRegistry | None = None) -> None:
        self.fetcher_id = fetcher_id
        self.leader = leader
        self._partitions = partitions
        self._config = config
        self._clock = clock
        self._states = PartitionStates()
        self._known_hw: dict[TopicPartition, int] = {}
        # (leader HW, leader log start, local LEO) last passed to on_follower_appended, per partition
        self._reported: dict[TopicPartition, tuple[int, int, int]] = {}
        self._added_ms: dict[TopicPartition, int] = {}  # until the first append after (re)adding
        self._unsaved_truncations = 0  # truncations the broker has not yet checkpointed (truncations_done)
        self._backoff_until_ms = 0
        self._wakeup = asyncio.Event()
        self._inflight: asyncio.Future[FetchResponse] | None = None  # the fetch being awaited
        self._interrupted = False  # add_partitions cancelled it
        self._task: asyncio.Task[None] | None = None
        self.stats = FetcherStats()
        self._metrics = TaskMetrics(partitions.broker_id, leader.broker.broker_id, fetcher_id, registry)
        self._log = log.bind(broker_id=partitions.broker_id, leader=leader.broker.broker_id, fetcher_id=fetcher_id)

    # --- partitions -------------------------------------------------------------------------

    def add_partitions(self, states: Mapping[TopicPartition, InitialFetchState]) -> None:
        """Start (or restart) fetching; an unchanged leader epoch keeps the current state (Kafka)."""
        for tp, initial in states.items():
            current = self._states.get(tp)
            if current is not None and current.current_leader_epoch == initial.leader_epoch:
                continue
            self._states.set(tp, self._initial_state(tp, initial))
            self._reported.pop(tp, None)
            self._added_ms[tp] = self._clock.monotonic_ms()
            self._log.info("fetcher_partition_added", topic=tp.topic, partition=tp.partition,
                           leader_epoch=initial.leader_epoch, offset=initial.fetch_offset)
            self._interrupt_fetch()
        self._wakeup.set()

    def _interrupt_fetch(self) -> None:
        """A partition was (re)added: abandon a long-polling fetch so the next step includes it."""
        fetch = self._inflight
        if fetch is not None and not fetch.done():
            self._interrupted = True
            fetch.cancel()

    def _initial_state(self, tp: TopicPartition, initial: InitialFetchState) -> PartitionFetchState:
        state = PartitionFetchState.initial(initial.fetch_offset, initial.leader_epoch, None)
        if not self._config.truncate_on_fetch:
            return state
        local = self._partitions.follower_log(tp, initial.leader_epoch)
        epoch = local.latest_epoch() if local is not None else None
        if local is None or epoch is None or local.log_end_offset != initial.fetch_offset:
            return state
        return state.truncated(initial.fetch_offset, epoch, True)

    def remove_partitions(self, tps: set[TopicPartition] | list[TopicPartition]) -> None:
        for tp in tps:
            if self._states.remove(tp) is not None:
                self._known_hw.pop(tp, None)
                self._reported.pop(tp, None)
                self._added_ms.pop(tp, None)
                self._metrics.forget(tp)
                self._log.info("fetcher_partition_removed", topic=tp.topic, partition=tp.partition)

    def partitions(self) -> list[TopicPartition]:
        return self._states.tps()

    def fetch_state(self, tp: TopicPartition) -> PartitionFetchState | None:
        return self._states.get(tp)

    @property
    def partition_count(self) -> int:
        return len(self._states)

    # --- one step ---------------------------------------------------------------------------

    async def do_work(self) -> WorkResult:
        if self._clock.monotonic_ms() < self._backoff_until_ms:
            return WorkResult(backed_off=True)
        truncations = fetches = 0
        try:
            truncations = await self._maybe_truncate()
            fetches = await self._maybe_fetch()
        except LeaderUnavailableError as exc:
            self._back_off(str(exc))
            return WorkResult(truncations, fetches, backed_off=True)
        finally:
            self._truncations_done()
        return WorkResult(truncations, fetches)

    def _truncations_done(self) -> None:
        """Tell the broker once about the truncations made since the last call (it checkpoints them): before
        every await and at the end of a step, so nothing is appended to a cut log before that."""
        if not self._unsaved_truncations:
            return
        self._unsaved_truncations = 0
        try:
            self._partitions.truncations_done()
        except Exception:  # a failed checkpoint write fails the log dir, which stops the broker
            self._log.exception("fetcher_truncation_checkpoint_failed")

    def _back_off(self, why: str) -> None:
        self._backoff_until_ms = self._clock.monotonic_ms() + self._config.backoff_ms
        self.stats.backoffs += 1
        self._metrics.backoffs.inc()
        self._log.warning("fetcher_backoff", reason=why, backoff_ms=self._config.backoff_ms)

    def _still(self, tp: TopicPartition, sent: PartitionFetchState) -> Any | None:
        """The follower log if ``tp`` is still exactly in state ``sent`` here and at the broker."""
        if self._states.get(tp) != sent:
            return None
        return self._partitions.follower_log(tp, sent.current_leader_epoch)

    def _park(self, tp: TopicPartition, state: PartitionFetchState, error: str, detail: str = "") -> None:
        if error == ErrorCode.FENCED_LEADER_EPOCH.name:
            # The leader is in a newer epoch than ours: asking again cannot help, only the LeaderAndIsr we
            # missed can. As Kafka's onPartitionFenced (markPartitionFailed), the partition waits for it: it is
            # parked until add_partitions gives it a new epoch (a fresh state); ``state`` is always the one
            # the fenced request was sent with (callers check it is still current).
            until_ms, backoff_ms = PARKED_UNTIL_READDED, None
        else:
            until_ms, backoff_ms = self._clock.monotonic_ms() + self._config.backoff_ms, self._config.backoff_ms
        self._states.update_and_move_to_end(tp, state.parked(until_ms))
        self.stats.partition_errors += 1
        self._metrics.error(error)
        self._log.warning("fetcher_partition_parked", topic=tp.topic, partition=tp.partition,
                          leader_epoch=state.current_leader_epoch, offset=state.fetch_offset, error=error,
                          detail=detail or None, backoff_ms=backoff_ms)

    def _high_watermark(self, tp: TopicPartition) -> int | None:
        getter = getattr(self._partitions, "follower_high_watermark", None)
        if getter is not None:
            hw = getter(tp)
            if isinstance(hw, int) and hw >= 0:
                return hw
        return self._known_hw.get(tp)

    # --- truncation -------------------------------------------------------------------------

    async def _maybe_truncate(self) -> int:
        now = self._clock.monotonic_ms()
        requests: dict[TopicPartition, EpochRequest] = {}
        sent: dict[TopicPartition, PartitionFetchState] = {}
        for tp, state in self._states.items():
            if not state.is_truncating(now):
                continue
            local = self._partitions.follower_log(tp, state.current_leader_epoch)
            if local is None:
                self._park(tp, state, "not_following")
                continue
            epoch = state.last_fetched_epoch if state.last_fetched_epoch is not None else local.latest_epoch()
            if epoch is None:
                self._guarded(tp, state, self._truncate_without_epoch, local)
                continue
            requests[tp] = EpochRequest(state.current_leader_epoch, epoch)
            sent[tp] = state
        self._truncations_done()  # those without an epoch, before the await
        if not requests:
            return 0
        self.stats.epoch_requests += 1
        answers = await self.leader.offsets_for_leader_epoch(self._partitions.broker_id, requests)
        for tp, state in sent.items():
            local = self._still(tp, state)
            if local is None:
                continue  # moved meanwhile: never truncate on a stale answer
            answer = answers.get(tp)
            if answer is None or answer.error is not ErrorCode.NONE:
                self._park(tp, state, answer.error.name if answer else "missing_in_answer")
                continue
            self._guarded(tp, state, self._apply_truncation, local, answer.epoch_end, "offsets_for_leader_epoch")
        self._truncations_done()
        return 1

    def _guarded(self, tp: TopicPartition, state: PartitionFetchState, truncation: Callable[..., None],
                 *args: Any) -> None:
        """A truncation whose failure (a log gone unusable) parks its own partition, still truncating, and
        not the task: the fetch step after it serves every other partition of this leader. (Kafka marks
        such a partition failed, ``AbstractFetcherThread.truncateToEpochEndOffsets``.)"""
        try:
            truncation(tp, state, *args)
        except Exception as exc:
            self._log.exception("fetcher_truncation_failed", topic=tp.topic, partition=tp.partition,
                                leader_epoch=state.current_leader_epoch)
            current = self._states.get(tp)
            if current is not None:
                self._park(tp, current.must_truncate(), exc.__class__.__name__, str(exc))

    def _truncate_without_epoch(self, tp: TopicPartition, state: PartitionFetchState, local: Any) -> None:
        """No local epoch: an empty log needs nothing; otherwise Kafka's truncate-to-HW fallback.

        Every batch carries its leader epoch and the log's epoch cache follows them, so a log with
        data and no epoch only comes from a lost leader-epoch-checkpoint. There is no epoch to ask
        the leader about; like Kafka (``partitionsWithoutEpochs``) we fall back to the HW.
        """
        leo = local.log_end_offset
        hw = self._high_watermark(tp)
        target = leo if hw is None else min(hw, leo)
        if target < leo:
            self._truncate(tp, state, local, target, "no_local_epoch_high_watermark")
        self._states.set(tp, state.truncated(local.log_end_offset, local.latest_epoch(), True))

    def _apply_truncation(self, tp: TopicPartition, state: PartitionFetchState, local: Any,
                          leader: EpochEndOffset, source: str) -> None:
        leo = local.log_end_offset
        follower = EpochEndOffset(UNDEFINED_EPOCH, -1)
        if not leader.undefined and leader.leader_epoch != UNDEFINED_EPOCH:
            follower = EpochEndOffset(*local.end_offset_for_epoch(leader.leader_epoch))
        decision = decide_truncation(leader, follower, leo, self._high_watermark(tp))
        if decision.offset < leo:
            self._truncate(tp, state, local, decision.offset, f"{source}:{decision.reason}",
                           leader_epoch_answer=leader.leader_epoch, leader_end_offset=leader.end_offset)
        else:
            _drop_epochs_without_data(local)
        next_epoch = decision.next_epoch if not decision.completed else local.latest_epoch()
        self._states.set(tp, state.truncated(local.log_end_offset, next_epoch, decision.completed))

    def _truncate(self, tp: TopicPartition, state: PartitionFetchState, local: Any, offset: int, reason: str,
                  *, fully: bool = False, **fields: Any) -> None:
        leo = local.log_end_offset
        hw = self._high_watermark(tp)
        self._reported.pop(tp, None)
        if fully:
            local.truncate_fully_and_start_at(offset)
        else:
            local.truncate_to(offset)
        self._partitions.on_follower_truncated(tp, offset, reason)
        self._unsaved_truncations += 1
        self.stats.truncations += 1
        self._metrics.truncation(tp, reason.split(":")[-1])
        below_hw = hw is not None and offset < hw and not fully
        emit = self._log.warning if below_hw else self._log.info
        emit("follower_truncated", topic=tp.topic, partition=tp.partition, leader_epoch=state.current_leader_epoch,
             from_offset=leo, to_offset=offset, reason=reason, fully=fully, high_watermark=hw,
             below_high_watermark=below_hw, **fields)

    # --- fetch ------------------------------------------------------------------------------

    async def _maybe_fetch(self) -> int:
        request, sent = self._build_fetch()
        if request is None:
            return 0
        self.stats.fetch_requests += 1
        self._metrics.requests.inc()
        response = await self._fetch_unless_added(request)
        if response is None:
            return 1  # interrupted: the next step truncates the new partition and fetches them all
        if response.error is not ErrorCode.NONE:
            # e.g. STALE_BROKER_EPOCH: nothing per partition can be trusted; back off the task.
            raise LeaderUnavailableError(f"fetch answered {response.error.name}")
        for tp, state in sent.items():
            data = response.partitions.get(tp)
            if data is None or self._states.get(tp) != state:
                continue  # left out by the leader, or moved meanwhile: ignore
            try:
                await self._process_partition(tp, state, data)
            except LeaderUnavailableError:
                raise
            except Exception as exc:  # a storage or broker-side failure parks this partition only
                if isinstance(exc, (MinibrokerError, InvalidBatchError)):
                    # the logs disagree, or the leader's data is bad (e.g. damaged on its disk): a warning that
                    # says so, once per retry; a traceback of it was logged every second
                    self._log.warning("fetcher_partition_failed", topic=tp.topic, partition=tp.partition,
                                      leader_epoch=state.current_leader_epoch, offset=state.fetch_offset,
                                      error=f"{type(exc).__name__}: {exc}")
                else:
                    self._log.exception("fetcher_partition_failed", topic=tp.topic, partition=tp.partition,
                                        leader_epoch=state.current_leader_epoch, offset=state.fetch_offset)
                current = self._states.get(tp)
                if current is not None:
                    if isinstance(exc, OffsetMismatchError):
                        current = current.must_truncate()  # the logs disagree on batch bounds: re-check epochs
                    self._park(tp, current, exc.__class__.__name__, str(exc))
        return 1

    async def _fetch_unless_added(self, request: FetchRequest) -> FetchResponse | None:
        """The fetch, or None if a partition was added while it long-polled.

        Kafka lets a new partition wait for the fetch in flight (up to replica.fetch.wait.max.ms);
        we abandon that fetch instead: its answer was not applied, so nothing is lost, and the new
        partition (a broker that just became follower) starts replicating one round trip later.
        ``add_partitions`` cancels the fetch's task; a cancellation of this task itself (``stop``) is
        told apart by ``cancelling()`` and never swallowed.
        """
        fetch = asyncio.ensure_future(self.leader.fetch(request))
        self._inflight = fetch
        try:
            return await fetch
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if self._interrupted and fetch.cancelled() and (me is None or me.cancelling() == 0):
                self.stats.fetches_interrupted += 1
                return None
            raise
        finally:
            self._inflight = None
            self._interrupted = False

    def _build_fetch(self) -> tuple[FetchRequest | None, dict[TopicPartition, PartitionFetchState]]:
        now = self._clock.monotonic_ms()
        parts: dict[TopicPartition, FetchPartitionRequest] = {}
        sent: dict[TopicPartition, PartitionFetchState] = {}
        for tp, state in self._states.items():
            if not state.is_fetchable(now):
                continue
            local = self._partitions.follower_log(tp, state.current_leader_epoch)
            if local is None:
                self._park(tp, state, "not_following")
                continue
            last_epoch = state.last_fetched_epoch if state.last_fetched_epoch is not None else UNDEFINED_EPOCH
            parts[tp] = FetchPartitionRequest(state.fetch_offset, state.current_leader_epoch, last_epoch,
                                       local.log_start_offset, self._config.partition_max_bytes)
            sent[tp] = state
        if not parts:
            return None, sent
        request = FetchRequest(self._partitions.broker_id, self._partitions.broker_epoch, self._config.wait_max_ms,
                               self._config.min_bytes, self._config.response_max_bytes, parts)
        return request, sent

    async def _process_partition(self, tp: TopicPartition, state: PartitionFetchState,
                                 data: FetchPartitionData) -> None:
        if data.error is ErrorCode.OFFSET_OUT_OF_RANGE:
            await self._handle_out_of_range(tp, state)
            return
        if data.error is not ErrorCode.NONE:
            self._park(tp, state, data.error.name)
            return
        local = self._still(tp, state)
        if local is None:
            return
        if data.diverging_epoch is not None:
            self._apply_truncation(tp, state, local, data.diverging_epoch, "diverging_epoch")
            after = self._states.get(tp)
            if after is not None and (after.fetch_offset, after.last_fetched_epoch, after.status) == (
                    state.fetch_offset, state.last_fetched_epoch, state.status):
                # The same fetch would get the same answer: do not spin on a leader that insists.
                self._park(tp, after, "diverging_epoch_no_progress", f"leader said {data.diverging_epoch}")
            return
        self._append(tp, state, local, data)

    def _append(self, tp: TopicPartition, state: PartitionFetchState, local: Any, data: FetchPartitionData) -> None:
        if local.log_end_offset != state.fetch_offset:
            # Someone else changed the log: never append at a wrong offset; re-check by epoch.
            self._log.error("fetcher_offset_mismatch", topic=tp.topic, partition=tp.partition,
                            leader_epoch=state.current_leader_epoch, offset=state.fetch_offset,
                            log_end_offset=local.log_end_offset)
            self._park(tp, state.must_truncate(), "offset_mismatch")
            return
        if data.records:
            try:
                check_batches(data.records)
            except InvalidBatchError as exc:
                # Kafka's follower checks each batch's CRC too: never append bytes that are not the leader's.
                self._park(tp, state, exc.code.name, str(exc))
                return
            local.append_as_follower(data.records)
            self.stats.appends += 1
            self.stats.bytes_appended += len(data.records)
            self._metrics.bytes.inc(len(data.records))
            added_ms = self._added_ms.pop(tp, None)
            if added_ms is not None:
                # logged only: a list of these grew with every leadership change for the task's lifetime
                self._log.info("follower_first_append", topic=tp.topic, partition=tp.partition,
                               leader_epoch=state.current_leader_epoch, offset=state.fetch_offset,
                               since_added_ms=self._clock.monotonic_ms() - added_ms)
        new_offset = local.log_end_offset
        lag = fetch_lag(data.high_watermark, new_offset)
        report = (data.high_watermark, data.log_start_offset, new_offset)
        latest_epoch = local.latest_epoch()
        if (not data.records and self._reported.get(tp) == report and state.lag == lag
                and state.parked_until_ms is None and state.last_fetched_epoch == latest_epoch):
            return  # nothing new for this partition (most of them, when a fetcher follows many): no bookkeeping
        if data.high_watermark >= 0:
            self._known_hw[tp] = min(new_offset, data.high_watermark)
        self._partitions.on_follower_appended(tp, data.high_watermark, data.log_start_offset)
        self._reported[tp] = report
        self._metrics.lag(tp, lag)
        new_state = state.fetched(new_offset, latest_epoch, lag)
        if data.records:  # Kafka: only partitions that got data go to the back of the line (KIP-74)
            self._states.update_and_move_to_end(tp, new_state)
        else:
            self._states.set(tp, new_state)

    async def _handle_out_of_range(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        """Kafka's fetchOffsetAndTruncate (seed 000): compare with the leader's end, then its start."""
        self._truncations_done()  # the other partitions' of this response so far, before the await
        broker_id = self._partitions.broker_id
        latest = await self.leader.list_offset(broker_id, tp, state.current_leader_epoch, LATEST_TIMESTAMP)
        local = self._still(tp, state)
        if local is None:
            return
        if latest.error is not ErrorCode.NONE:
            self._park(tp, state, f"list_offsets_{latest.error.name}")
            return
        by_end = decide_out_of_range_by_end(local.log_end_offset, latest.offset)
        if by_end is not None:
            # Only an unclean election makes a leader shorter than an in-sync follower. Older Kafka halted
            # the process here when unclean election was disabled; current Kafka
            # (AbstractFetcherThread.fetchOffsetAndTruncate) warns and truncates, and so do we, loudly.
            self._log.error("follower_truncated_to_shorter_leader", topic=tp.topic, partition=tp.partition,
                            leader_epoch=state.current_leader_epoch, log_end_offset=local.log_end_offset,
                            leader_end_offset=latest.offset)
            self._truncate(tp, state, local, by_end.offset, "out_of_range:leader_end_below_local_end")
            self._states.update_and_move_to_end(
                tp, state.truncated(local.log_end_offset, local.latest_epoch(), True))
            return
        earliest = await self.leader.list_offset(broker_id, tp, state.current_leader_epoch, EARLIEST_TIMESTAMP)
        local = self._still(tp, state)
        if local is None:
            return
        if earliest.error is not ErrorCode.NONE:
            self._park(tp, state, f"list_offsets_{earliest.error.name}")
            return
        decision = decide_out_of_range_by_start(local.log_end_offset, earliest.offset)
        if decision.action is OutOfRangeAction.TRUNCATE_FULLY:
            self._truncate(tp, state, local, decision.offset, "out_of_range:leader_start_above_local_end",
                           fully=True)
            self._states.update_and_move_to_end(
                tp, state.truncated(local.log_end_offset, local.latest_epoch(), True))
            return
        # The leader grew past us meanwhile (seed 000, second case): retry after a backoff so a leader
        # that keeps answering out of range cannot make this task spin.
        self._park(tp, state, "offset_out_of_range_retry")

    # --- run loop ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"fetcher-{self.fetcher_id}")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def run(self) -> None:
        self._log.info("fetcher_started", address=self.leader.broker.address)
        try:
            while True:
                self._wakeup.clear()
                try:
                    result = await self.do_work()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # nothing but removal ends the task
                    self._log.exception("fetcher_step_failed")
                    self._back_off(f"unexpected {exc.__class__.__name__}")
                    result = WorkResult(backed_off=True)
                if not result.sent:
                    await self._idle()
        finally:
            self._log.info("fetcher_stopped")

    async def _idle(self) -> None:
        """Sleep until a partition is added, a parked one wakes, or the task backoff ends."""
        now = self._clock.monotonic_ms()
        wake = [now + self._config.backoff_ms, self._backoff_until_ms if self._backoff_until_ms > now else None,
                self._states.next_wakeup_ms(now)]
        until = min(w for w in wake if w is not None)
        timeout_s = max(1, until - now) / 1000
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._metrics.close()  # this task's series, unless a live task with the same labels took them over
        await self.leader.close()


__all__ = ["FetchStatus", "FetcherConfig", "FetcherTask", "WorkResult"]
