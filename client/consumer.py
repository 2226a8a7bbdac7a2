"""An asyncio consumer with manual assignment (Kafka's KafkaConsumer with ``assign``).

    consumer = Consumer("127.0.0.1:9091", auto_offset_reset="earliest")
    await consumer.start()
    consumer.assign([TopicPartition("events", 0)])
    for record in await consumer.poll(timeout_ms=1000):
        print(record.offset, record.value)
    await consumer.close()

Fetches go to each partition's leader, one request per leader carrying all its
partitions, with ``replica_id`` -1 and long polling (``fetch.min.bytes``,
``fetch.max.wait.ms``). Requests stay in flight across ``poll`` calls, so one
slow leader does not hold back data from another. A response is discarded for
a partition whose position moved while it was in flight (aiokafka does the
same). Errors: a leader change refreshes metadata and retries from the same
position; OFFSET_OUT_OF_RANGE resets by ``auto.offset.reset`` only when the
position is really outside the leader's log (below its log start or past its
log end). When it lies between the leader's HW and LEO (a new leader whose HW
lags) the position is kept and the fetch retried. No consumer groups.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from client.errors import CorruptRecordError, NoBrokersAvailableError
from client.fetch_state import ConsumerRecord, OffsetReset, Positions
from client.metadata import MetadataCache, check_int, check_topic, parse_bootstrap
from common.clock import Clock, SystemClock
from common.errors import ErrorCode, MinibrokerError, error_for
from common.http import RpcBadRequest, RpcClient, RpcError, fetch_response_limit
from common.logging import get_logger
from common.wire import MAX_FETCH_WAIT_MS, MAX_INT64, TopicPartition
from storage.record_batch import (
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    TIMESTAMP_TYPE_BIT,
    InvalidBatchError,
    compute_crc,
    decode_records,
    iter_batches,
    peek_size,
)

log = get_logger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3  # KIP-734: the first record carrying the largest timestamp


class OffsetAndTimestamp(NamedTuple):
    """Kafka's ``OffsetAndTimestamp``: what a lookup by time found (``offsets_for_times``). ``leader_epoch`` is
    the epoch of the record's batch, -1 when the broker did not say."""

    offset: int
    timestamp: int
    leader_epoch: int = -1

_REFRESH_ON = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                         ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
                         ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR,
                         ErrorCode.REPLICA_NOT_AVAILABLE, ErrorCode.NETWORK_EXCEPTION})


_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


def as_topic_partition(item: object) -> TopicPartition:
    """A ``TopicPartition`` from a TopicPartition or ``(topic, partition)``; TypeError / ValueError for a
    non-str or empty topic, a non-int (bool, float) or negative partition."""
    topic: object
    partition: object
    try:
        topic, partition = item  # type: ignore[misc]
    except (TypeError, ValueError):
        raise TypeError(f"a partition must be a TopicPartition or (topic, partition), got {item!r}") from None
    return TopicPartition(check_topic(topic), check_int("partition", partition, 0, _INT32_MAX))


def _partition_list(tps: object, what: str) -> list[TopicPartition]:
    if isinstance(tps, (str, bytes, TopicPartition)) or not isinstance(tps, Iterable):
        raise TypeError(f"{what} takes a list of TopicPartition, got {type(tps).__name__} {tps!r}")
    return [as_topic_partition(tp) for tp in tps]


# setting -> (lowest, highest) allowed value: Kafka's INT and LONG settings, and no fetch wait a broker refuses
# (each was accepted, and the first poll failed with INVALID_REQUEST)
_CONFIG_RANGES: dict[str, tuple[int, int]] = {
    "fetch_min_bytes": (1, _INT32_MAX), "fetch_max_wait_ms": (0, MAX_FETCH_WAIT_MS),
    "fetch_max_bytes": (1, _INT32_MAX), "max_partition_fetch_bytes": (1, _INT32_MAX),
    "max_poll_records": (1, _INT32_MAX), "request_timeout_ms": (1, _INT32_MAX), "retry_backoff_ms": (0, MAX_INT64),
}


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    auto_offset_reset: OffsetReset = OffsetReset.LATEST
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 50 * 1024 * 1024
    max_partition_fetch_bytes: int = 1024 * 1024
    max_poll_records: int = 500
    check_crcs: bool = True  # Kafka's check.crcs: each fetched batch's CRC-32C is checked before its records
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100

    def __post_init__(self) -> None:
        reset = self.auto_offset_reset
        if isinstance(reset, str):
            try:
                object.__setattr__(self, "auto_offset_reset", OffsetReset(reset))
            except ValueError:
                raise ValueError("auto.offset.reset must be one of "
                                 f"{', '.join(r.value for r in OffsetReset)}, got {reset!r}") from None
        elif not isinstance(reset, OffsetReset):
            raise TypeError(f"auto.offset.reset must be an OffsetReset or one of "
                            f"{', '.join(r.value for r in OffsetReset)}, got {type(reset).__name__} {reset!r}")
        for name, (lo, hi) in _CONFIG_RANGES.items():
            check_int(name.replace("_", "."), getattr(self, name), lo, hi)
        if not isinstance(self.check_crcs, bool):  # a string such as "false" would be true
            raise TypeError(f"check.crcs must be a bool, got {type(self.check_crcs).__name__} {self.check_crcs!r}")


@dataclass(frozen=True, slots=True)
class _FetchResult:
    address: str
    offsets: dict[TopicPartition, int]  # fetch offset per partition sent
    response: dict[str, Any] | None
    error: str | None = None
    fatal: BaseException | None = None  # raised from poll after bookkeeping
    failed: dict[TopicPartition, str] = field(default_factory=dict)  # a reset's partitions without an offset


def decode_fetched(tp: TopicPartition, data: bytes, high_watermark: int, *, check_crcs: bool = True,
                   ) -> tuple[list[tuple[int, ConsumerRecord]], int, CorruptRecordError | None]:
    """Records of whole batches in ``data`` below the HW, with their batch's leader epoch; the
    offset after the last whole batch (-1 if none); and, if a batch fails its CRC (``check_crcs``, Kafka's
    ``check.crcs``), is not magic 2 or its records do not decode, the error for it (the records of the
    batches before it are returned, as Kafka's consumer hands out what precedes a corrupt record and fails
    only when the position reaches it). So is a batch whose length field is impossible, where a consumer
    used to stop there without a word."""
    out: list[tuple[int, ConsumerRecord]] = []
    next_offset = -1
    topic, partition = tp
    limit = high_watermark if high_watermark >= 0 else 2**63
    end = 0
    for pos, header in iter_batches(data):
        base, epoch, first_ts = header.base_offset, header.partition_leader_epoch, header.first_timestamp
        end = pos + header.size
        # record_timestamp's rule, inlined (per record): LogAppendTime -> the batch's max timestamp for all
        append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_BIT else None
        try:
            if header.magic != MAGIC:
                raise InvalidBatchError(f"magic {header.magic}, expected {MAGIC}")
            if check_crcs and compute_crc(data, pos, header.size) != header.crc:
                # Kafka's consumer checks it by default (CompletedFetch.maybeEnsureValid): a byte gone bad on a
                # leader's disk below its recovery point is served as it is, by Kafka's broker and by ours
                raise InvalidBatchError(f"its CRC-32C is not the {header.crc:#010x} stored in it")
            records = decode_records(data, pos)
        except InvalidBatchError as exc:
            return out, next_offset, CorruptRecordError(
                f"{topic}-{partition}: the batch at offset {base} is corrupt ({exc}); seek past offset "
                f"{base + header.last_offset_delta} to go on consuming")
        next_offset = base + header.last_offset_delta + 1
        for r in records:
            offset = base + r.offset_delta
            if offset >= limit:
                break  # never hand out what is not committed (invariant 4), even if a broker sent it
            timestamp = first_ts + r.timestamp_delta if append_time is None else append_time
            out.append((epoch, ConsumerRecord(topic, partition, offset, timestamp, r.key, r.value,
                                              tuple(r.headers) if r.headers else ())))
    if end < len(data):
        # Bytes after the whole batches: the start of a batch max_bytes cut short, unless its length field is one
        # no batch can have (Kafka's FileLogInputStream refuses it with a CorruptRecordException), or they are
        # all there is (a broker sends the first batch whole, however large). A consumer used to stop there
        # without a word, fetching the same bytes again and again.
        length = peek_size(data, end) - LOG_OVERHEAD if len(data) - end >= LOG_OVERHEAD else -1
        if end == 0 or length < MIN_BATCH_LENGTH:
            where = f"after offset {next_offset - 1}" if next_offset >= 0 else "at the fetch offset"
            return out, next_offset, CorruptRecordError(
                f"{topic}-{partition}: the data {where} is not a whole record batch (length field {length}, "
                f"{len(data) - end} bytes)")
    return out, next_offset, None


class Consumer:
    def __init__(self, bootstrap: str | Sequence[str], config: ConsumerConfig | None = None, *,
                 clock: Clock | None = None, **settings: Any) -> None:
        if config is None:
            config = ConsumerConfig(**settings)
        elif not isinstance(config, ConsumerConfig):
            raise TypeError(f"config must be a ConsumerConfig, got {type(config).__name__} {config!r}")
        elif settings:
            raise TypeError("pass either config or keyword settings, not both")
        addresses = parse_bootstrap(bootstrap)  # TypeError/ValueError now, not on first use (as the producer)
        self.config = config
        self._clock = clock or SystemClock()
        self._rpc = RpcClient(limit_per_host=4, timeout_s=config.request_timeout_ms / 1000)
        self.metadata = MetadataCache(self._rpc, addresses, clock=self._clock,
                                      retry_backoff_ms=config.retry_backoff_ms,
                                      request_timeout_ms=config.request_timeout_ms)
        self._positions = Positions()
        self._buffer: deque[ConsumerRecord] = deque()
        # fetched records of paused partitions, kept out of _buffer (which poll and every fetch round read)
        # until resume, in order: a paused partition with a large backlog cost each poll a pass over it
        self._held: dict[TopicPartition, deque[ConsumerRecord]] = {}
        self._in_flight: dict[str, asyncio.Task[_FetchResult]] = {}
        self._fetching: set[TopicPartition] = set()
        self._backoff_until: dict[TopicPartition, int] = {}
        self._reported_unknown: set[TopicPartition] = set()
        self._fetch_errors: dict[TopicPartition, str] = {}  # see fetch_errors
        self._reset_wanted: dict[TopicPartition, int] = {}  # the poll's reset in flight: seeks seen per partition
        self._seeks: Counter[TopicPartition] = Counter()  # seeks asked for per partition (see _still_awaits)
        self._closed = False

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Nothing to do until the first poll; here for symmetry with the producer."""

    async def close(self) -> None:
        self._closed = True
        for task in self._in_flight.values():
            task.cancel()
        if self._in_flight:
            await asyncio.gather(*self._in_flight.values(), return_exceptions=True)
        self._in_flight.clear()
        await self._rpc.close()

    # -- assignment and positions ----------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        self._check_open()
        tps = _partition_list(partitions, "assign")
        before = set(self._positions.assigned())
        # a partition leaving or joining the assignment starts anew: no lookup made before applies to it
        self._seeks.update(before.symmetric_difference(tps))
        self._positions.assign(tps)
        self.metadata.add_topics({tp.topic for tp in tps})
        self._buffer = deque(r for r in self._buffer if TopicPartition(r.topic, r.partition) in set(tps))
        self._held = {tp: held for tp, held in self._held.items() if tp in set(tps)}

    def assignment(self) -> list[TopicPartition]:
        self._check_open()
        return self._positions.assigned()

    async def assign_topic(self, topic: str, timeout_ms: int = 30_000, *,
                           unknown_after_ms: int | None = None) -> list[TopicPartition]:
        """Assign every partition of ``topic`` (waits up to ``timeout_ms`` for the topic and its leaders;
        ``unknown_after_ms``: see ``MetadataCache.wait_for_topic``)."""
        self._check_open()
        parts = await self.metadata.wait_for_topic(topic, timeout_ms, unknown_after_ms=unknown_after_ms)
        tps = [TopicPartition(topic, p) for p in parts]
        self.assign([*self.assignment(), *tps])
        return tps

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._check_open()
        tp = as_topic_partition(tp)
        check_int("offset", offset)
        self._positions.seek(tp, offset)
        self._seeks[tp] += 1
        self._drop_buffered(tp)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self._seek_to(self._assigned(tps) or self.assignment(), OffsetReset.EARLIEST)

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        await self._seek_to(self._assigned(tps) or self.assignment(), OffsetReset.LATEST)

    async def _seek_to(self, tps: Sequence[TopicPartition], strategy: OffsetReset) -> None:
        """Kafka's seekToBeginning/seekToEnd: from the call on, the partitions await a reset by ``strategy``
        (a poll meanwhile fetches nothing from their old positions and, if it looks them up itself, looks
        them up the same way); the lookup is then made here, so the positions are known on return."""
        self._check_open()
        for tp in tps:
            self._positions.request_reset(tp, strategy)
            self._seeks[tp] += 1
            self._drop_buffered(tp)
        await self._reset(tps)

    def _assigned(self, tps: Iterable[object]) -> list[TopicPartition]:
        """``tps`` checked to be assigned, before any request is sent (NotAssignedError otherwise)."""
        out = [as_topic_partition(tp) for tp in tps]
        for tp in out:
            self._positions.get(tp)
        return out

    async def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``poll`` returns for ``tp``."""
        tp = self._assigned([tp])[0]
        while True:  # until it has one, as Kafka's position() (a seek_to_* meanwhile: its reset, not ours)
            self._check_open()
            held = self._held.get(tp)
            if held:
                return held[0].offset
            for r in self._buffer:
                if r.topic == tp.topic and r.partition == tp.partition:
                    return r.offset
            offset = self._positions.get(tp).offset
            if offset is not None:
                return offset
            await self._reset([tp])

    def high_watermark(self, tp: TopicPartition) -> int:
        """The HW seen in the last fetch of ``tp`` (-1 before any)."""
        self._check_open()
        return self._positions.get(as_topic_partition(tp)).high_watermark

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return await self.list_offsets(tps, LATEST_TIMESTAMP)

    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return await self.list_offsets(tps, EARLIEST_TIMESTAMP)

    def fetch_errors(self) -> dict[TopicPartition, str]:
        """Assigned partitions whose last fetch (or offset lookup) from their leader failed, with that error
        (the leader did not answer, or answered an error code): their records could not be read since. A
        partition leaves this map when a fetch from its leader succeeds. Partitions that have no leader in
        the metadata are never fetched from, so they are not here: see ``metadata.current.leader_address``."""
        self._check_open()
        assigned = set(self._positions.assigned())
        return {tp: error for tp, error in self._fetch_errors.items() if tp in assigned}

    def pause(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Kafka's ``pause``: no fetches for these assigned partitions, and ``poll`` hands out none of their
        records (those already fetched wait, in order) until ``resume``. Their positions stay; seeks and
        offset lookups work as before. NotAssignedError for a partition not assigned."""
        self._check_open()
        tps = set(self._assigned(_partition_list(partitions, "pause"))) - self._positions.paused
        if not tps:
            return
        self._positions.paused.update(tps)
        kept: deque[ConsumerRecord] = deque()
        for r in self._buffer:
            tp = TopicPartition(r.topic, r.partition)
            if tp in tps:
                self._held.setdefault(tp, deque()).append(r)
            else:
                kept.append(r)
        self._buffer = kept

    def resume(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Kafka's ``resume``: fetch these partitions again and hand out their records (a partition not paused
        is left as it is). NotAssignedError for a partition not assigned."""
        self._check_open()
        tps = self._assigned(_partition_list(partitions, "resume"))
        self._positions.paused.difference_update(tps)
        for tp in tps:
            self._buffer.extend(self._held.pop(tp, ()))

    def paused(self) -> set[TopicPartition]:
        """The partitions paused (Kafka's ``paused``)."""
        self._check_open()
        return set(self._positions.paused)

    def _drop_buffered(self, tp: TopicPartition) -> None:
        self._buffer = deque(r for r in self._buffer if (r.topic, r.partition) != tp)
        self._held.pop(tp, None)

    # -- poll ------------------------------------------------------------------------------------

    async def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """Up to ``max_records`` records, waiting up to ``timeout_ms`` for some to arrive. RuntimeError once the
        consumer is closed, also for a poll waiting when close() is called (from another task)."""
        self._check_open()
        check_int("timeout_ms", timeout_ms, 0)
        limit = self.config.max_poll_records if max_records is None else check_int("max_records", max_records, 1)
        deadline = self._clock.monotonic_ms() + timeout_ms
        while not self._buffer:
            # fetches and resets that finished since the last poll first: poll(0) (Kafka's poll(Duration.ZERO))
            # returns what has arrived; it used to give up before looking at them, and a loop of it got nothing
            self._collect([t for t in self._in_flight.values() if t.done()])
            if self._buffer:
                break
            needs = self._positions.needs_reset()
            if needs:
                self._spawn_reset(needs)
            self._start_fetches(deadline)
            remaining_ms = deadline - self._clock.monotonic_ms()
            if remaining_ms <= 0:
                break
            if not self._in_flight:
                await asyncio.sleep(min(remaining_ms, max(self.config.retry_backoff_ms, 1)) / 1000)
                self._check_open()
                continue
            done, _ = await asyncio.wait(list(self._in_flight.values()), timeout=remaining_ms / 1000,
                                         return_when=asyncio.FIRST_COMPLETED)
            self._check_open()  # before the results: close() cancelled the fetches
            self._collect(done)
        out: list[ConsumerRecord] = []
        while self._buffer and len(out) < limit:
            out.append(self._buffer.popleft())
        return out

    def _check_open(self) -> None:
        """Every public method but close, as Kafka's acquireAndEnsureOpen: once closed, a call raised nothing and
        opened connections nobody closed. Also a poll (or a lookup) close() ended while it waited: a poll raised
        the CancelledError of the fetches close cancelled, as if it had been cancelled itself, and went on
        fetching if called again."""
        if self._closed:
            raise RuntimeError("consumer is closed")

    def _collect(self, done: Iterable[asyncio.Task[_FetchResult]]) -> None:
        for task in done:
            # out of _in_flight before its result is read: a task that failed is raised once, never again
            # by every later poll, and its work (a fetch, a reset) can be started anew
            for key in [k for k, t in self._in_flight.items() if t is task]:
                del self._in_flight[key]
            self._handle(task.result())

    def _start_fetches(self, deadline_ms: int) -> None:
        now = self._clock.monotonic_ms()
        md = self.metadata.current
        by_leader: dict[str, list[tuple[TopicPartition, int]]] = {}
        epochs: dict[TopicPartition, int] = {}  # of the last record returned, per partition fetched
        need_refresh = False
        for tp in self._positions.fetchable():
            if tp in self._fetching or self._backoff_until.get(tp, 0) > now:
                continue
            if any(r.topic == tp.topic and r.partition == tp.partition for r in self._buffer):
                continue
            leader = md.leader_address(tp)
            if leader is None:
                self._report_unknown(tp)
                need_refresh = True
                continue
            position = self._positions.get(tp)
            assert position.offset is not None
            by_leader.setdefault(leader[1], []).append((tp, position.offset))
            epochs[tp] = position.leader_epoch
        if need_refresh:
            self._spawn_refresh()
        max_wait_ms = max(0, min(self.config.fetch_max_wait_ms, deadline_ms - now))
        for address, items in by_leader.items():
            if address in self._in_flight:
                continue
            offsets = dict(items)
            self._fetching.update(offsets)
            self._in_flight[address] = asyncio.create_task(self._fetch(address, offsets, epochs, max_wait_ms))

    def _report_unknown(self, tp: TopicPartition) -> None:
        """Log once when metadata says ``tp`` does not exist: it yields nothing (as in Kafka, where an
        assigned partition that does not exist is retried with a warning) and does not hold up the others.
        Raise when the name is one no topic can have (INVALID_TOPIC_EXCEPTION), as Kafka's poll."""
        md = self.metadata.current
        if md.topic_errors.get(tp.topic) == ErrorCode.INVALID_TOPIC_EXCEPTION and tp not in md.partitions:
            # as Kafka's poll (Metadata.maybeThrowExceptionForTopic): no topic can ever have that name
            raise error_for(ErrorCode.INVALID_TOPIC_EXCEPTION,
                            f"INVALID_TOPIC_EXCEPTION: topic {tp.topic!r} (assigned {tp})")
        if tp in self._reported_unknown or tp.topic not in md.topic_errors or tp in md.partitions:
            return
        self._reported_unknown.add(tp)
        log.warning("consumer_unknown_topic_or_partition", topic=tp.topic, partition=tp.partition,
                    error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.name)

    def _spawn_reset(self, tps: Sequence[TopicPartition]) -> None:
        """Find positions for ``tps`` (each by the reset asked for it, else ``auto.offset.reset``) in a task like
        a fetch's, so poll keeps
        to its timeout and partitions with no leader (or that do not exist) do not hold up the others."""
        timestamps = self._reset_timestamps(tps)
        if "__reset__" in self._in_flight:
            return
        now = self._clock.monotonic_ms()
        md = self.metadata.current
        ready = [tp for tp in tps if self._backoff_until.get(tp, 0) <= now]
        known = [tp for tp in ready if md.leader_address(tp) is not None]
        if len(known) < len(ready):
            for tp in ready:
                if tp not in known:
                    self._report_unknown(tp)
            self._spawn_refresh()
        if not known:
            return

        async def reset() -> _FetchResult:
            by_leader: dict[str, dict[TopicPartition, int]] = {}  # the partitions' timestamps by leader
            for tp in known:
                leader = md.leader_address(tp)
                assert leader is not None
                by_leader.setdefault(leader[1], {})[tp] = timestamps[tp]
            found: dict[TopicPartition, int] = {}
            failed: dict[TopicPartition, str] = {}
            try:
                answers = await asyncio.gather(*(self._list_offsets_at(a, ps) for a, ps in by_leader.items()))
            except MinibrokerError as exc:
                return _FetchResult("__reset__", {}, None, str(exc), exc)
            except Exception as exc:  # a bug, not the brokers' answer: fail this reset, retried after a backoff
                log.exception("consumer_offset_reset_failed", partitions=[str(tp) for tp in known])
                error = f"offset reset failed: {exc!r}"
                return _FetchResult("__reset__", {}, None, error, failed=dict.fromkeys(known, error))
            for (address, ps), (part, err) in zip(by_leader.items(), answers, strict=True):
                found.update((tp, o.offset) for tp, o in part.items() if o.offset >= 0)  # -1: none, no position
                failed.update((tp, err or f"list_offsets to {address}: no offset") for tp in ps if tp not in found)
            missing = [tp for tp in known if tp not in found]
            return _FetchResult("__reset__", found, None, f"no offset for {missing}" if missing else None,
                                failed=failed)

        self._reset_wanted = {tp: self._seeks[tp] for tp in known}
        self._in_flight["__reset__"] = asyncio.create_task(reset())

    def _apply_reset(self, result: _FetchResult) -> None:
        self._fetch_errors.update(result.failed)
        for tp, offset in result.offsets.items():
            self._fetch_errors.pop(tp, None)
            if self._still_awaits(tp, self._reset_wanted.get(tp, -1)):
                self._positions.seek(tp, offset)
                self._drop_buffered(tp)
        missing = [tp for tp in self._reset_wanted if tp not in result.offsets]
        if missing:
            self._backoff(missing)
            self._spawn_refresh()

    def _spawn_refresh(self) -> None:
        if "__metadata__" in self._in_flight:
            return

        async def refresh() -> _FetchResult:
            try:
                await self.metadata.refresh()
            except NoBrokersAvailableError as exc:
                return _FetchResult("__metadata__", {}, None, str(exc))
            return _FetchResult("__metadata__", {}, None)

        self._in_flight["__metadata__"] = asyncio.create_task(refresh())

    def _leader_epoch(self, tp: TopicPartition) -> int:
        """The leader epoch from metadata, sent with fetches and offset lookups (KIP-320): a broker that still
        thinks it leads an older epoch answers FENCED/UNKNOWN_LEADER_EPOCH (refresh, retry) instead of
        OFFSET_OUT_OF_RANGE or an offset from its shorter log, which would move the position back."""
        info = self.metadata.current.partitions.get(tp)
        return info.leader_epoch if info is not None else -1

    async def _fetch(self, address: str, offsets: dict[TopicPartition, int], epochs: dict[TopicPartition, int],
                     max_wait_ms: int) -> _FetchResult:
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, offset in offsets.items():
            topics.setdefault(tp.topic, []).append({
                "partition": tp.partition, "fetch_offset": offset, "current_leader_epoch": self._leader_epoch(tp),
                # the epoch of the last record returned: a leader whose log diverged from it there (an unclean
                # election cut what this consumer read) answers where that epoch ends (KIP-320)
                "last_fetched_epoch": epochs.get(tp, -1), "log_start_offset": -1,
                "partition_max_bytes": self.config.max_partition_fetch_bytes})
        body = {"replica_id": -1, "broker_epoch": -1, "max_wait_ms": max_wait_ms,
                "min_bytes": self.config.fetch_min_bytes, "max_bytes": self.config.fetch_max_bytes,
                "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}
        try:
            resp = await self._rpc.call(address, "fetch", body,
                                        timeout_s=(max_wait_ms + self.config.request_timeout_ms) / 1000,
                                        max_response_bytes=fetch_response_limit(self.config.fetch_max_bytes))
        except RpcBadRequest as exc:
            return _FetchResult(address, offsets, None, str(exc), error_for(ErrorCode.INVALID_REQUEST, str(exc)))
        except RpcError as exc:
            return _FetchResult(address, offsets, None, str(exc))
        return _FetchResult(address, offsets, resp)

    def _handle(self, result: _FetchResult) -> None:
        if result.address == "__reset__":
            if result.fatal is not None:
                raise result.fatal
            self._apply_reset(result)
            return
        self._fetching.difference_update(result.offsets)
        if result.fatal is not None:
            raise result.fatal
        if result.address == "__metadata__":
            return
        if result.response is None:
            log.info("consumer_fetch_failed", broker=result.address, error=result.error)
            error = result.error or f"fetch to {result.address} failed"
            self._fetch_errors.update(dict.fromkeys(result.offsets, error))
            self._backoff(result.offsets)
            self._spawn_refresh()
            return
        top = ErrorCode.of(int(result.response.get("error", 0)))
        if top is not ErrorCode.NONE:
            self._fetch_errors.update(dict.fromkeys(result.offsets, f"fetch to {result.address}: {top.name}"))
            self._backoff(result.offsets)
            self._spawn_refresh()
            return
        for t in result.response.get("topics") or []:
            for p in t.get("partitions") or []:
                tp = TopicPartition(str(t.get("topic")), int(p.get("partition", -1)))
                # a partition assign() dropped while the fetch was in flight: its data and errors are no longer
                # this consumer's business (Kafka's FetchCollector ignores them)
                if tp in result.offsets and self._positions.is_assigned(tp):
                    self._handle_partition(tp, result.offsets[tp], p)

    def _handle_partition(self, tp: TopicPartition, fetch_offset: int, p: dict[str, Any]) -> None:
        code = ErrorCode.of(int(p.get("error", 0)))
        diverging = p.get("diverging_epoch")
        if code is ErrorCode.NONE and isinstance(diverging, dict):
            self._fetch_errors.pop(tp, None)
            self._truncation_detected(tp, fetch_offset, int(diverging.get("epoch", -1)),
                                      int(diverging.get("end_offset", -1)))
            return
        if code is ErrorCode.NONE:
            self._fetch_errors.pop(tp, None)
            hw = int(p.get("high_watermark", -1))
            self._positions.set_high_watermark(tp, hw)
            records, next_offset, corrupt = decode_fetched(tp, p.get("records") or b"", hw,
                                                           check_crcs=self.config.check_crcs)
            accepted = self._positions.accept(tp, fetch_offset, records)
            if accepted:
                self._positions.move_to_end(tp)
            elif next_offset > fetch_offset and (hw < 0 or next_offset <= hw):
                self._positions.advance_to(tp, fetch_offset, next_offset)
            if tp in self._positions.paused:  # paused while its fetch was out
                self._held.setdefault(tp, deque()).extend(accepted)
            else:
                self._buffer.extend(accepted)
            if corrupt is not None and not accepted and self._positions.get(tp).offset == fetch_offset:
                self._backoff([tp])
                raise corrupt  # the position is at the batch that does not decode
            return
        if code is ErrorCode.OFFSET_OUT_OF_RANGE:
            self._out_of_range(tp, fetch_offset, int(p.get("log_start_offset", -1)),
                               int(p.get("log_end_offset", -1)))
            return
        log.info("consumer_fetch_partition_error", topic=tp.topic, partition=tp.partition, error=code.name,
                 offset=fetch_offset)
        self._fetch_errors[tp] = code.name
        self._backoff([tp])
        if code in _REFRESH_ON or code.retriable:
            self._spawn_refresh()
            return
        raise error_for(code, f"{code.name}: fetching {tp} at offset {fetch_offset}")

    def _truncation_detected(self, tp: TopicPartition, offset: int, epoch: int, end_offset: int) -> None:
        """The leader's log diverges from what this consumer read: the epoch of the last record it returned
        ends at ``end_offset`` there (Kafka's consumer learns the same from OffsetsForLeaderEpoch when it
        validates its position after a leader change, SubscriptionState.maybeCompleteValidation). Below
        the position, the records from ``end_offset`` on were replaced (an unclean election): the position
        goes back to the first offset known to diverge, so the new records there are read, not skipped
        (the position inside the new log) nor read again from the start (the position past its end, which
        used to reset by auto.offset.reset). With auto.offset.reset=none that is an error, as Kafka's
        LogTruncationException."""
        if end_offset < 0 or epoch < 0 or self._positions.get(tp).offset != offset:
            return  # not an answer to act on (or the position moved meanwhile): the next fetch asks again
        if end_offset >= offset:  # our last epoch ends at or past the position there: only learn its epoch
            self._positions.validated(tp, offset, offset, epoch)
            return
        log.warning("consumer_truncation_detected", topic=tp.topic, partition=tp.partition, offset=offset,
                    diverging_epoch=epoch, diverging_offset=end_offset)
        if self.config.auto_offset_reset is OffsetReset.NONE:
            self._backoff([tp])
            raise error_for(ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"log truncation detected for {tp} at offset {offset}: the records from offset "
                            f"{end_offset} on were replaced by the leader (an unclean election); seek to "
                            f"{end_offset} to read the new ones")
        if self._positions.validated(tp, offset, end_offset, epoch):
            self._buffer = deque(r for r in self._buffer
                                 if (r.topic, r.partition) != tp or r.offset < end_offset)
            if tp in self._held:
                self._held[tp] = deque(r for r in self._held[tp] if r.offset < end_offset)

    def _out_of_range(self, tp: TopicPartition, offset: int, log_start: int, log_end: int) -> None:
        state = self._positions.get(tp)
        if state.offset != offset:
            return
        really_outside = (log_start >= 0 and offset < log_start) or (log_end >= 0 and offset > log_end)
        log.info("consumer_offset_out_of_range", topic=tp.topic, partition=tp.partition, offset=offset,
                 log_start_offset=log_start, log_end_offset=log_end, reset=really_outside)
        if not really_outside:
            if state.leader_epoch >= 0:
                # a leader that cannot place our last epoch (older than every epoch it keeps, after
                # retention) answers OFFSET_OUT_OF_RANGE to a position inside its log: fetch on without the
                # check, as Kafka's consumer completes validation when the leader has no end for the epoch
                self._positions.validated(tp, offset, offset, -1)
            self._backoff([tp])  # a lagging HW on a new leader: keep the position, retry
            return
        if self.config.auto_offset_reset is OffsetReset.NONE:
            raise error_for(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} of {tp} is out of range")
        self._positions.seek(tp, None)

    def _backoff(self, tps: Iterable[TopicPartition]) -> None:
        until = self._clock.monotonic_ms() + self.config.retry_backoff_ms
        for tp in tps:
            self._backoff_until[tp] = until

    # -- offsets ---------------------------------------------------------------------------------

    def _reset_timestamps(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The ListOffsets timestamp of each partition's reset (see ``Positions.reset_strategy``); Kafka's
        NoOffsetForPartitionException, OFFSET_OUT_OF_RANGE here, if one has none (auto.offset.reset=none)."""
        out: dict[TopicPartition, int] = {}
        for tp in tps:
            strategy = self._positions.reset_strategy(tp, self.config.auto_offset_reset)
            if strategy is OffsetReset.NONE:
                raise error_for(ErrorCode.OFFSET_OUT_OF_RANGE, f"no position for {tp} and auto.offset.reset=none")
            out[tp] = EARLIEST_TIMESTAMP if strategy is OffsetReset.EARLIEST else LATEST_TIMESTAMP
        return out

    def _still_awaits(self, tp: TopicPartition, seeks: int) -> bool:
        """A reset looked up when ``tp`` had seen ``seeks`` seeks applies only while ``tp`` still awaits that
        reset (Kafka's rule): no seek or seek_to_* since, and no position found meanwhile (a poll's own reset).
        Applied regardless, a position() beside a poll read again what that poll had returned (earliest) or
        skipped what it had not (latest), and an older lookup overwrote a later seek."""
        return (self._positions.is_assigned(tp) and self._seeks[tp] == seeks
                and self._positions.get(tp).offset is None)

    async def _reset(self, tps: Sequence[TopicPartition]) -> None:
        """Look up the positions of ``tps``, each by its reset strategy, and seek there (``_still_awaits``)."""
        mine = {tp: self._seeks[tp] for tp in tps}
        by_ts: dict[int, list[TopicPartition]] = {}
        for tp, ts in self._reset_timestamps(tps).items():
            by_ts.setdefault(ts, []).append(tp)
        for ts, group in by_ts.items():
            offsets = await self.list_offsets(group, ts)
            for tp, offset in offsets.items():
                if self._still_awaits(tp, mine[tp]):
                    self._positions.seek(tp, offset)
                    self._drop_buffered(tp)

    async def list_offsets(self, tps: Sequence[TopicPartition], timestamp: int, *,
                           timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        """ListOffsets on each leader, retrying leader changes until ``timeout_ms``: each partition's offset
        for ``timestamp`` (-1 latest, -2 earliest, -3 the record with the largest timestamp, or a time in ms:
        the first record at or after it), -1 where there is no such record."""
        self._check_open()
        wanted = _partition_list(tps, "list_offsets")
        # -3 MAX, -2 EARLIEST and -1 LATEST are the only negative timestamps; 2**63 - 1 the most a request carries
        check_int("timestamp", timestamp, MAX_TIMESTAMP, _INT64_MAX)
        found = await self._lookup(dict.fromkeys(wanted, timestamp), timeout_ms)
        return {tp: o.offset for tp, o in found.items()}

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int], *,
                                timeout_ms: int | None = None) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Kafka's ``offsetsForTimes``: per partition, the first record whose timestamp is at or after the one
        given (ms), with its timestamp; None where there is none below the high watermark. Timestamps must
        not be negative (``list_offsets`` takes the special ones). Retries leader changes until
        ``timeout_ms`` (default request.timeout.ms)."""
        self._check_open()
        if not isinstance(timestamps, Mapping):
            raise TypeError(f"offsets_for_times takes a mapping of partition to timestamp, "
                            f"got {type(timestamps).__name__}")
        wanted: dict[TopicPartition, int] = {}
        for item, ts in timestamps.items():
            tp = as_topic_partition(item)
            check_int(f"timestamp of {tp}", ts, 0, _INT64_MAX)
            wanted[tp] = ts
        found = await self._lookup(wanted, timeout_ms)
        return {tp: (o if o.offset >= 0 else None) for tp, o in found.items()}

    async def _lookup(self, wanted: dict[TopicPartition, int], timeout_ms: int | None
                      ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """ListOffsets for each partition's timestamp on its leader, asked again (after a metadata refresh) for
        the partitions without an answer until ``timeout_ms``."""
        if timeout_ms is not None:
            check_int("timeout_ms", timeout_ms, 0)
        budget_ms = timeout_ms if timeout_ms is not None else self.config.request_timeout_ms
        deadline = self._clock.monotonic_ms() + budget_ms
        self.metadata.add_topics({tp.topic for tp in wanted})
        found: dict[TopicPartition, OffsetAndTimestamp] = {}
        last_error = "no leader"
        while True:
            self._check_open()  # close() from another task ends the lookup: it went on, reopening connections
            missing = [tp for tp in wanted if tp not in found]
            if not missing:
                return found
            md = self.metadata.current
            by_leader: dict[str, dict[TopicPartition, int]] = {}
            for tp in missing:
                leader = md.leader_address(tp)
                if leader is not None:
                    by_leader.setdefault(leader[1], {})[tp] = wanted[tp]
            results = await asyncio.gather(*(self._list_offsets_at(a, ps) for a, ps in by_leader.items()))
            for part, err in results:
                found.update(part)
                last_error = err or last_error
            if all(tp in found for tp in wanted):
                return found
            if self._clock.monotonic_ms() >= deadline:
                unknown = [tp for tp in wanted if tp not in found and tp not in md.partitions
                           and tp.topic in md.topic_errors]
                if unknown:
                    raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"UNKNOWN_TOPIC_OR_PARTITION: list_offsets: {', '.join(map(str, unknown))} "
                                    "does not exist")
                raise error_for(ErrorCode.LEADER_NOT_AVAILABLE, f"list_offsets: {last_error}")
            with contextlib.suppress(NoBrokersAvailableError):
                await self.metadata.refresh()

    async def _list_offsets_at(self, address: str, wanted: Mapping[TopicPartition, int],
                               ) -> tuple[dict[TopicPartition, OffsetAndTimestamp], str | None]:
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, timestamp in wanted.items():
            topics.setdefault(tp.topic, []).append({"partition": tp.partition, "timestamp": timestamp,
                                                    "current_leader_epoch": self._leader_epoch(tp)})
        body = {"replica_id": -1, "isolation_level": 0,
                "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}
        try:
            resp = await self._rpc.call(address, "list_offsets", body)
        except RpcBadRequest as exc:  # the request itself is wrong: retrying cannot help
            raise error_for(ErrorCode.INVALID_REQUEST, str(exc)) from None
        except RpcError as exc:
            return {}, str(exc)
        out: dict[TopicPartition, OffsetAndTimestamp] = {}
        error: str | None = None
        try:
            for t in resp.get("topics") or []:
                for p in t.get("partitions") or []:
                    tp = TopicPartition(str(t.get("topic")), int(p.get("partition", -1)))
                    code = ErrorCode.of(int(p.get("error", 0)))
                    if code is ErrorCode.NONE and tp in wanted:
                        fields = [p.get(name, -1) for name in ("offset", "timestamp", "leader_epoch")]
                        if any(type(v) is not int for v in fields):
                            raise TypeError(f"offset, timestamp or leader_epoch {fields!r} of {tp}")
                        out[tp] = OffsetAndTimestamp(*fields)
                    else:
                        error = f"{tp}: {code.name}"
                        if not code.retriable:
                            raise error_for(code, f"list_offsets {tp}: {code.name}")
        except (AttributeError, TypeError, ValueError) as exc:  # a malformed answer: the rest is asked again
            return out, f"list_offsets to {address}: malformed answer ({exc})"
        return out, error
