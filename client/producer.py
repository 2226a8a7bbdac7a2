"""An asyncio producer (Kafka's KafkaProducer, simplified).

    producer = Producer("127.0.0.1:9091", acks="all")
    await producer.start()
    fut = await producer.send("events", b"hello", key=b"k")   # queued; returns a DeliveryFuture
    meta = await fut                                         # RecordMetadata(topic, partition, offset)
    await producer.close()                                   # flushes first

``send`` only waits for metadata (``max.block.ms``) or for room in
``buffer.memory``; a background sender task drains ready batches (see
``client.accumulator``) into one produce request per leader broker, at most
``max.in.flight.requests.per.connection`` requests per broker at once.
Retriable errors (leader moved, not enough replicas, timeouts, broken
connections) refresh metadata and retry after ``retry.backoff.ms`` until
``delivery.timeout.ms``; other errors fail the records with a typed error, but
a batch refused as too large (MESSAGE_TOO_LARGE: the topic's
``max.message.bytes`` is below ``batch.size``) is split and sent again, as
Kafka's Sender does (``_split_too_large``). A batch whose request is still
unanswered at its ``delivery.timeout.ms`` fails then, as maybe written
(Kafka's Sender.getExpiredInflightBatches); its answer, when it comes, is
ignored. ``delivery.timeout.ms`` must be at least ``linger.ms +
request.timeout.ms`` (Kafka's ConfigException). With ``acks=0`` a record
resolves with offset -1 once its request was answered (Kafka resolves once the
request is written, which the HTTP client does not report: the broker answers
acks=0 right after its local append). Unlike Kafka's producer, which never reads
an acks=0 answer (its broker closes the connection on an error, so the
producer at most refreshes its metadata), this one handles the answer's errors
as with acks=1: a record the leader refused is retried, split or failed, never
reported delivered; nothing the answer says was written is sent again.
``flush`` waits for the records sent before it; ``close`` refuses new sends at
once, then flushes and waits for the requests in flight.

Idempotence (``enable.idempotence``, KIP-98 without transactions; on by
default with acks=all, see ``ProducerConfig``): before its first batch the
producer asks any broker for a producer id (``init_producer_id``), and each
batch gets (producer id, epoch, base sequence) when it is first drained into a
request, sequences counting records per partition from 0. A retry resends
exactly the batches of the first attempt with the same stamps, so a leader
that already appended them answers with their original offset instead of
writing them again (DESIGN.md invariant 6). At most 5 batches of a partition
go in one request (a leader remembers a producer's last 5 batches) and one
request per partition is in flight, as without idempotence. A retried request
that a new leader holds only in part is refused as out of order (a leader
deduplicates a request's batches as one unit); its batches are then retried
one by one. A stamped batch
that fails for good leaves a gap in its partition's sequences: the producer
then takes a new producer id for the batches drained after it (Kafka's
KIP-360 bumps the epoch of the same id instead; a new id needs no fencing of
the batches still in flight with the old one, which keep their stamps).
A broker that does not know ``init_producer_id`` (HTTP 404, a broker from
before idempotence) turns idempotence off with a warning when it was only on
by default, and fails the records when ``enable.idempotence=true`` was asked
for (Kafka's UnsupportedVersionException).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from client.accumulator import RECORD_OVERHEAD_BYTES, ProducerBatch, RecordAccumulator
from client.errors import (
    NOT_APPENDED,
    BufferExhaustedError,
    DeliveryTimeoutError,
    NoBrokersAvailableError,
    ProducerClosedError,
    ProducerIdUnavailableError,
    UnsupportedVersionError,
)
from client.metadata import MetadataCache, check_topic, parse_bootstrap
from client.partitioner import StickyPartitioner
from common.clock import Clock, SystemClock
from common.config import ConfigError
from common.config import parse_bool as parse_config_bool
from common.errors import ErrorCode, MinibrokerError, error_for
from common.http import RpcBadRequest, RpcClient, RpcConnectionError, RpcError
from common.logging import get_logger
from common.wire import TopicPartition
from storage.record_batch import build_batch

log = get_logger(__name__)

_new_object = object.__new__
_time_ns = time.time_ns

ACKS = {"all": -1, "-1": -1, "1": 1, "0": 0}

_DEFAULT_DELIVERY_TIMEOUT_MS = 120_000

MAX_TIMESTAMP_MS = 2**63 - 1  # a record batch stores timestamps as signed 64-bit
_MAX_INT = 2**31 - 1  # Kafka's INT settings
_MAX_LONG = 2**63 - 1  # Kafka's LONG settings
# the broker refuses a produce timeout_ms over 5 minutes (broker.requests.MAX_TIMEOUT_MS) and the producer
# sends request.timeout.ms as that timeout: a larger one would fail every produce request
_MAX_REQUEST_TIMEOUT_MS = 5 * 60 * 1000
# setting -> (lowest, highest) allowed value
_CONFIG_RANGES: dict[str, tuple[int, int]] = {
    "batch_size": (1, _MAX_INT), "linger_ms": (0, _MAX_INT), "buffer_memory": (1, _MAX_LONG),
    "max_request_size": (1, _MAX_INT), "max_in_flight_requests_per_connection": (1, _MAX_INT),
    "retries": (0, _MAX_INT), "retry_backoff_ms": (0, _MAX_INT),
    "request_timeout_ms": (1, _MAX_REQUEST_TIMEOUT_MS), "delivery_timeout_ms": (1, _MAX_INT),
    "max_block_ms": (0, _MAX_LONG),
}

# Kafka's MAX_NUM_INFLIGHT_BATCHES_PER_PARTITION: a leader keeps the last 5 batches of each producer to spot a
# retried one, so one request (our unit of retry) carries at most 5 batches of a partition
MAX_BATCHES_PER_PARTITION = 5
_SEQUENCE_MASK = 2**31 - 1  # sequences are int32 and wrap from 2**31-1 to 0 (DefaultRecordBatch.incrementSequence)

_REFRESH_ON = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                         ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
                         ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.NETWORK_EXCEPTION,
                         ErrorCode.KAFKA_STORAGE_ERROR})


def parse_bool(name: str, value: object) -> bool:
    """``true``/``false`` (any case) or a bool, as Kafka's boolean settings; ConfigError (a ValueError) naming
    ``name`` otherwise. The same parser as topic and broker configs (``common.config.parse_bool``)."""
    return parse_config_bool(name, value)


def parse_acks(value: str | int) -> int:
    acks = ACKS.get(str(value).strip().lower())
    if acks is None:
        raise ValueError(f"acks must be all, -1, 0 or 1, got {value!r}")
    return acks


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Kafka's producer settings (same names with dots as underscores, same defaults where sensible)."""

    acks: int = -1
    batch_size: int = 16_384
    linger_ms: int = 5  # Kafka 3.x defaults to 0; 5 ms batches better in Python and costs little latency
    buffer_memory: int = 32 * 1024 * 1024
    max_request_size: int = 1024 * 1024
    max_in_flight_requests_per_connection: int = 5
    retries: int = 2**31 - 1
    retry_backoff_ms: int = 100
    request_timeout_ms: int = 30_000
    delivery_timeout_ms: int = _DEFAULT_DELIVERY_TIMEOUT_MS
    max_block_ms: int = 60_000
    # None (not set): on when acks is all and retries > 0, else off (Kafka 3.2+). True with acks 0/1 or
    # retries 0 is a ConfigError, as Kafka's. Kafka also ties it to max.in.flight.requests.per.connection <= 5;
    # not here: that setting bounds requests per broker, and a partition never has more than one in flight.
    enable_idempotence: bool | None = None

    @property
    def idempotence(self) -> bool:
        """Whether the producer is idempotent (``enable.idempotence``, or its default for these settings)."""
        if self.enable_idempotence is not None:
            return self.enable_idempotence
        return self.acks == -1 and self.retries > 0

    def __post_init__(self) -> None:
        if type(self.acks) is not int or self.acks not in (-1, 0, 1):  # not True, 1.0 or "1"
            raise (TypeError if type(self.acks) is not int else ValueError)(
                f"acks must be the int -1, 0 or 1, got {self.acks!r}")
        for name, (lo, hi) in _CONFIG_RANGES.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name.replace('_', '.')} must be an int in [{lo}, {hi}], "
                                f"got {type(value).__name__} {value!r}")
            if not lo <= value <= hi:
                raise ValueError(f"{name.replace('_', '.')} must be an int in [{lo}, {hi}], got {value}")
        if self.enable_idempotence is not None and type(self.enable_idempotence) is not bool:
            raise TypeError(f"enable.idempotence must be True, False or None (the default), got "
                            f"{type(self.enable_idempotence).__name__} {self.enable_idempotence!r}")
        # Kafka's configureDeliveryTimeout: a record must be allowed to linger and then wait for one full
        # request. Kafka raises only for a delivery.timeout.ms the user set, and else raises the timeout to
        # the sum; a dataclass cannot tell an explicit 120000 from the default, so the default value is taken
        # as not set.
        least = self.linger_ms + self.request_timeout_ms
        if self.delivery_timeout_ms < least:
            if self.delivery_timeout_ms != _DEFAULT_DELIVERY_TIMEOUT_MS:
                raise ConfigError(f"delivery.timeout.ms should be equal to or larger than linger.ms + "
                                  f"request.timeout.ms ({self.linger_ms} + {self.request_timeout_ms}), got "
                                  f"{self.delivery_timeout_ms}")
            log.warning("producer_delivery_timeout_raised", delivery_timeout_ms=least,
                        detail="delivery.timeout.ms not set: raised to linger.ms + request.timeout.ms")
            object.__setattr__(self, "delivery_timeout_ms", least)
        if self.enable_idempotence:
            conflicts = ([f"acks={self.acks}"] if self.acks != -1 else []) + (
                ["retries=0"] if self.retries == 0 else [])
            if conflicts:
                raise ConfigError(f"enable.idempotence=true needs acks=all and retries > 0, got "
                                  f"{' and '.join(conflicts)}: set acks=all (and retries > 0), or "
                                  "enable.idempotence=false")


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int  # -1 with acks=0
    timestamp: int


class DeliveryFuture:
    """The outcome of one ``send``: await it for ``RecordMetadata`` or a typed error.

    A view of one record of a batch: the batch holds the only asyncio future, and the record's offset
    (base offset + ``index``) is derived when asked, so a send costs no future of its own (Kafka's
    FutureRecordMetadata over a ProduceRequestResult per batch)."""

    __slots__ = ("_batch", "index")

    def __init__(self, batch: ProducerBatch, index: int) -> None:
        self._batch = batch
        self.index = index  # position of the record in its batch; 0 for the record that opened a batch

    @property
    def topic_partition(self) -> TopicPartition:
        return self._batch.tp

    def _carrier(self) -> tuple[ProducerBatch, int]:
        """The batch that carries this record now, and its index there: a batch split on MESSAGE_TOO_LARGE
        hands its records on to its pieces (Kafka re-chains the record's future to the new batch). A split
        batch completes only once its pieces have, so waiting on the carrier found at any moment is enough."""
        batch, index = self._batch, self.index
        while batch.pieces is not None:
            for piece in batch.pieces:
                if index < len(piece.records):
                    batch = piece
                    break
                index -= len(piece.records)
        return batch, index

    def done(self) -> bool:
        return bool(self._carrier()[0].completion.done())

    def exception(self) -> BaseException | None:
        exc: BaseException | None = self._carrier()[0].completion.exception()
        return exc

    def result(self) -> RecordMetadata:
        batch, index = (self._batch, self.index) if self._batch.pieces is None else self._carrier()
        base: int = batch.completion.result()
        offset = -1 if base < 0 else base + index
        tp = batch.tp
        # Kafka's RecordMetadata: the leader's log append time on a LogAppendTime topic, else the record's own
        timestamp = batch.log_append_time_ms if batch.log_append_time_ms >= 0 else batch.records[index][2]
        return RecordMetadata(tp.topic, tp.partition, offset, timestamp)

    def add_done_callback(self, fn: Callable[[DeliveryFuture], Any]) -> None:
        self._carrier()[0].completion.add_done_callback(lambda _f: fn(self))

    def add_batch_callback(self, fn: Callable[[int, BaseException | None], Any]) -> None:
        """Call ``fn(record_count, error)`` once when this record's whole batch is done (cheap per-batch
        accounting for benchmarks: register it on the future whose ``index`` is 0)."""
        batch = self._batch

        def done(_f: asyncio.Future[int]) -> None:
            for part in _pieces_of(batch):  # a batch split on MESSAGE_TOO_LARGE: each piece its own outcome
                fn(len(part), part.completion.exception())
        batch.completion.add_done_callback(done)

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        try:
            yield from asyncio.shield(self._carrier()[0].completion).__await__()
        except asyncio.CancelledError:
            raise
        except Exception:
            # The batch awaited may have been split since: it completes after its pieces, with the first failed
            # piece's error. ``result`` gives this record's own outcome (raising its own error, if any).
            pass
        return self.result()


class Producer:
    def __init__(self, bootstrap: str | Sequence[str], config: ProducerConfig | None = None, *,
                 clock: Clock | None = None, **settings: Any) -> None:
        if config is None:
            if "acks" in settings:
                settings["acks"] = parse_acks(settings["acks"])
            if settings.get("enable_idempotence") is not None:
                settings["enable_idempotence"] = parse_bool("enable.idempotence", settings["enable_idempotence"])
            config = ProducerConfig(**settings)
        elif settings:
            raise TypeError("pass either config or keyword settings, not both")
        elif not isinstance(config, ProducerConfig):
            raise TypeError(f"config must be a ProducerConfig, got {type(config).__name__}")
        addresses = parse_bootstrap(bootstrap)  # TypeError/ValueError now, not on first use
        self.config = config
        self._clock = clock or SystemClock()
        self._rpc = RpcClient(limit_per_host=config.max_in_flight_requests_per_connection,
                              timeout_s=config.request_timeout_ms / 1000)
        self.metadata = MetadataCache(self._rpc, addresses, clock=self._clock,
                                      retry_backoff_ms=config.retry_backoff_ms,
                                      request_timeout_ms=config.request_timeout_ms)
        self._acc = RecordAccumulator(batch_size=config.batch_size, linger_ms=config.linger_ms,
                                      delivery_timeout_ms=config.delivery_timeout_ms)
        self._partitioner = StickyPartitioner()
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        # partitions with a request in flight, and the batches it carries (a partition has one at a time)
        self._muted: dict[TopicPartition, list[ProducerBatch]] = {}
        self._in_flight: dict[str, int] = {}
        self._drain_start: dict[str, int] = {}  # per leader: where the next request's drain starts
        self._tasks: set[asyncio.Task[None]] = set()
        self._requests: set[asyncio.Task[None]] = set()  # the produce requests in flight (among _tasks)
        self._pending: set[asyncio.Future[int]] = set()
        self._sender: asyncio.Task[None] | None = None
        self._closing = False  # close() was called: send refuses records from then on
        self._close_called = asyncio.Event()  # the same, for sends waiting for a topic's metadata
        self._closed = False  # close() has flushed (or given up): no more retries, the sender stops
        self._need_refresh = False
        self._tps: dict[str, list[TopicPartition]] = {}  # cached TopicPartition values per topic
        self._max_request_size = config.max_request_size
        self._buffer_memory = config.buffer_memory
        # a record larger than either can never be sent (Kafka's ensureValidRecordSize: RecordTooLargeException)
        self._max_record_size = min(config.max_request_size, config.buffer_memory)
        self._now_ms = self._clock.now_ms
        self._monotonic_ms = self._clock.monotonic_ms
        self._system_clock = type(self._clock) is SystemClock
        self._sticky = self._partitioner.current
        # idempotence (see the module docstring); the producer id is -1 until init_producer_id answers
        self._idempotent = config.idempotence
        self._max_batches: int | None = MAX_BATCHES_PER_PARTITION if self._idempotent else None
        self.producer_id = -1
        self.producer_epoch = -1
        self._sequences: dict[TopicPartition, int] = {}  # next base sequence per partition, for producer_id
        self._pid_task: asyncio.Task[None] | None = None
        self._pid_fatal = ""  # why idempotence cannot work here (explicitly asked for, refused by the broker)

    @property
    def idempotent(self) -> bool:
        """Whether batches drained from now on are stamped with a producer id (``config.idempotence``, unless
        it was only on by default and the brokers turned out not to support it)."""
        return self._idempotent

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._sender is None:
            self._sender = asyncio.create_task(self._run(), name="producer-sender")

    # -- the user side ---------------------------------------------------------------------------

    def send_nowait(self, topic: str, value: bytes | None, *, key: bytes | None = None,
                    partition: int | None = None, timestamp_ms: int | None = None) -> DeliveryFuture | None:
        """Queue one record without waiting; None when that would block (topic metadata not known yet,
        or ``buffer.memory`` full): then use ``send``. Raises for a partition the topic does not have."""
        if self._closing:
            raise ProducerClosedError("producer is closed")
        # the hot path: one call per record, so checks are inlined and lookups cached
        if (value is not None and type(value) is not bytes and not isinstance(value, bytes)) or (
                key is not None and type(key) is not bytes and not isinstance(key, bytes)):
            raise TypeError(f"key and value must be bytes or None, got {type(key).__name__} and "
                            f"{type(value).__name__}")
        # a bad partition or timestamp would otherwise fail the whole batch later, in the sender
        if partition is not None and type(partition) is not int:
            _check_partition(partition)
        if timestamp_ms is not None and (type(timestamp_ms) is not int or not 0 <= timestamp_ms <= MAX_TIMESTAMP_MS):
            _check_timestamp(timestamp_ms)
        size = RECORD_OVERHEAD_BYTES + (len(key) if key else 0) + (len(value) if value else 0)
        if size > self._max_record_size:
            raise self.record_too_large(size)
        try:
            num_partitions = self.metadata.current.partition_counts.get(topic)
        except TypeError:  # unhashable
            num_partitions = None
        if num_partitions is None:
            check_topic(topic)  # only names from metadata (always valid) are found above
            return None
        acc = self._acc
        if acc.buffered_bytes >= self._buffer_memory or self._sender is None:
            return None
        tps = self._tps.get(topic)
        if tps is None or len(tps) != num_partitions:
            tps = self._tps[topic] = [TopicPartition(topic, p) for p in range(num_partitions)]
        if timestamp_ms is not None:
            ts = timestamp_ms
        elif self._system_clock:
            ts = _time_ns() // 1_000_000  # SystemClock.now_ms inlined: 0.1 us less per record
        else:
            ts = self._now_ms()
        if partition is None and key is None:
            # sticky partition (KIP-480); a record that would open a new batch there moves the sticky
            # partition on first and goes to the next one (Kafka's abortOnNewBatch)
            partition = self._sticky.get(topic)
            if partition is None or partition >= num_partitions:
                partition = self._partitioner.partition(topic, None, num_partitions, self._leader_check(tps))
            batch = acc.try_append(tps[partition], None, value, ts, size)
            if batch is None:
                self._partitioner.on_new_batch(topic, num_partitions, self._leader_check(tps))
                partition = self._partitioner.partition(topic, None, num_partitions)
                batch = acc.append(tps[partition], None, value, ts, self._monotonic_ms, size)
        else:
            if partition is None:
                partition = self._partitioner.partition(topic, key, num_partitions)
            elif not 0 <= partition < num_partitions:
                raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"partition {partition} of {topic!r} does not exist ({num_partitions} partitions)")
            batch = acc.append(tps[partition], key, value, ts, self._monotonic_ms, size)
        index = len(batch.records) - 1
        if index == 0:
            batch.completion = asyncio.get_running_loop().create_future()
            self._pending.add(batch.completion)
            batch.completion.add_done_callback(self._pending.discard)
            self._wake.set()
        elif batch.closed:
            self._wake.set()
        # object.__new__ and two slot stores: about 50 ns cheaper per record than calling __init__
        fut: DeliveryFuture = _new_object(DeliveryFuture)
        fut._batch = batch
        fut.index = index
        return fut

    def record_too_large(self, size: int) -> MinibrokerError:
        """The MESSAGE_TOO_LARGE error ``send`` raises for a ``size``-byte record (key, value and the
        per-record overhead) larger than ``max.request.size`` or than the whole ``buffer.memory`` (Kafka's
        RecordTooLargeException)."""
        return error_for(ErrorCode.MESSAGE_TOO_LARGE, f"a {size}-byte record is larger than {self.record_limit}")

    @property
    def record_limit(self) -> str:
        """The setting that bounds a record's size, with its value: ``max.request.size=1048576``."""
        if self._max_request_size <= self._buffer_memory:
            return f"max.request.size={self._max_request_size}"
        return f"the whole buffer.memory={self._buffer_memory}"

    @property
    def max_record_size(self) -> int:
        """The largest record (key, value and ``RECORD_OVERHEAD_BYTES``) ``send`` accepts."""
        return self._max_record_size

    async def send(self, topic: str, value: bytes | None, *, key: bytes | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None) -> DeliveryFuture:
        """Queue one record; returns its DeliveryFuture. Waits up to ``max.block.ms`` for the topic's
        metadata and for room in ``buffer.memory``. Raises for an unknown topic or partition."""
        fut = self.send_nowait(topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms)
        while fut is None:
            await self.wait_for_room(topic)
            fut = self.send_nowait(topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms)
        if fut.index == 0:
            # a batch was opened (the previous one is full or sent): let the sender and answers run, as
            # Kafka's sender thread would meanwhile
            await asyncio.sleep(0)
        return fut

    async def wait_for_room(self, topic: str) -> None:
        """Wait until ``send_nowait`` can take a record for ``topic``: its metadata known and room in
        ``buffer.memory`` (each wait up to ``max.block.ms``, then the error ``send`` raises). Queues nothing,
        so it can be cancelled at any point without losing a record (``send`` cannot be: cancelled after it
        queued the record, it loses the record's future)."""
        if self._sender is None:
            await self.start()
        await self._num_partitions(topic)
        await self._wait_for_space()

    async def _wait_for_space(self) -> None:
        """Until ``buffer.memory`` has room; BufferExhaustedError after ``max.block.ms`` (as Kafka)."""
        deadline = self._clock.monotonic_ms() + self.config.max_block_ms
        while self._acc.buffered_bytes >= self.config.buffer_memory and not self._closing:
            self._space.clear()
            self._wake.set()
            remaining_ms = deadline - self._clock.monotonic_ms()
            try:
                await asyncio.wait_for(self._space.wait(), max(remaining_ms, 0) / 1000)
            except TimeoutError:
                raise BufferExhaustedError(
                    f"no room in buffer.memory={self.config.buffer_memory} within max.block.ms="
                    f"{self.config.max_block_ms}") from None

    async def send_and_wait(self, topic: str, value: bytes | None, **kw: Any) -> RecordMetadata:
        return await (await self.send(topic, value, **kw))

    def _leader_check(self, tps: list[TopicPartition]) -> Callable[[int], bool]:
        """Whether partition ``i`` of ``tps``'s topic has a leader now (for the sticky partitioner)."""
        md = self.metadata.current
        return lambda i: md.leader_address(tps[i]) is not None

    async def partitions_for(self, topic: str) -> list[int]:
        check_topic(topic)
        await self._num_partitions(topic)
        return self.metadata.current.partitions_for(topic)

    async def _num_partitions(self, topic: str) -> int:
        count = self.metadata.current.partition_counts.get(topic)
        if count:
            return count
        # Kafka's waitOnMetadata: max.block.ms covers knowing the topic, not its leaders; a record for a
        # partition without a leader waits in the accumulator, bounded by delivery.timeout.ms
        # close() ends the wait (Kafka's ProducerMetadata.close wakes awaitUpdate): it went on asking the brokers
        # for up to max.block.ms after close had returned, and then failed with an unrelated error
        waiting = asyncio.ensure_future(self.metadata.wait_for_topic(topic, self.config.max_block_ms, leaders=False))
        closing = asyncio.ensure_future(self._close_called.wait())
        try:
            await asyncio.wait([waiting, closing], return_when=asyncio.FIRST_COMPLETED)
        finally:  # not awaited: awaiting them here would swallow a cancellation of the caller's own
            closing.cancel()
            if not waiting.done():
                waiting.cancel()
        if not waiting.done():
            raise ProducerClosedError(f"producer closed while waiting for the metadata of topic {topic!r}")
        return len(waiting.result())

    async def flush(self) -> None:
        """Send everything queued now (ignoring linger) and wait until every record sent before the call is
        done; records sent meanwhile are not waited for (Kafka's flush), so other senders cannot keep it
        waiting."""
        pending = list(self._pending)
        self._acc.flushing += 1  # a count: concurrent flushes each keep batches ready until they end
        self._wake.set()
        try:
            if pending:
                await asyncio.wait(pending)
        finally:
            self._acc.flushing -= 1

    async def close(self, timeout_ms: float | None = None) -> None:
        """Refuse new records, flush, wait for the requests still in flight, then stop. With ``timeout_ms``
        (Kafka's ``close(Duration)``), wait at most that long (0: not at all); the records still unanswered then
        fail with ProducerClosedError, as maybe written when a request carrying them was sent
        (``client.errors.is_definite_failure``)."""
        if self._closed:
            return
        self._closing = True
        self._close_called.set()  # a send waiting for a topic's metadata gives up now
        self._space.set()  # a send waiting for buffer.memory gives up now
        try:
            if timeout_ms is None:
                await self._drain()
            elif timeout_ms > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._drain(), timeout_ms / 1000)
        finally:
            self._closed = True
            self._wake.set()
            if self._sender is not None:
                self._sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sender
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            self._fail(self._acc.fail_all(), ProducerClosedError("producer closed before delivery"))
            await self._rpc.close()

    async def _drain(self) -> None:
        """Flush, then wait for the requests still in flight, whose records failed at delivery.timeout.ms
        already (Kafka's close waits for every request in flight: cancelled, it would be cut off mid-write)."""
        await self.flush()
        if self._requests:
            await asyncio.wait(list(self._requests))

    # -- the sender ------------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._closed:
            self._wake.clear()
            if self._need_refresh:
                self._need_refresh = False
                self._spawn(self._refresh_metadata())
            timeout_ms = self._send_ready()
            if self._wake.is_set():
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), None if timeout_ms is None else timeout_ms / 1000)

    async def _refresh_metadata(self) -> None:
        try:
            await self.metadata.refresh()
        except NoBrokersAvailableError as exc:
            log.warning("producer_metadata_refresh_failed", error=str(exc))
        self._wake.set()

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the producer id (Kafka's TransactionManager, idempotent-only) -----------------------------

    def _want_producer_id(self) -> None:
        """Start asking for a producer id unless that is under way; when idempotence cannot work (asked for
        explicitly, refused by the broker), fail the batches waiting for one."""
        if self._pid_fatal:
            self._fail(self._acc.take_unstamped(), UnsupportedVersionError(self._pid_fatal))
        elif self._pid_task is None or self._pid_task.done():
            self._pid_task = self._spawn(self._init_producer_id())

    async def _init_producer_id(self) -> None:
        """Ask the known brokers in turn for a producer id, retrying COORDINATOR_LOAD_IN_PROGRESS (the broker
        has no block of ids from the controller yet), other errors and unreachable brokers every
        ``retry.backoff.ms`` for up to ``max.block.ms``; then the batches waiting for an id fail
        (ProducerIdUnavailableError: never sent), and the next batch starts another round."""
        deadline = self._clock.monotonic_ms() + self.config.max_block_ms
        body = {"transactional_id": None, "transaction_timeout_ms": self.config.delivery_timeout_ms,
                "producer_id": -1, "producer_epoch": -1}
        errors: list[str] = []
        while not self._closed:
            for address in self.metadata.candidates():
                try:
                    resp = await self._rpc.call(address, "init_producer_id", body,
                                                timeout_s=self.config.request_timeout_ms / 1000)
                except RpcBadRequest as exc:
                    self._producer_id_refused(address, exc)
                    return
                except RpcError as exc:
                    errors.append(str(exc))
                    continue
                raw = resp.get("error")
                code = ErrorCode.of(raw) if type(raw) is int else ErrorCode.UNKNOWN_SERVER_ERROR
                pid, epoch = resp.get("producer_id"), resp.get("producer_epoch")
                if code is ErrorCode.NONE and type(pid) is int and 0 <= pid <= _MAX_LONG and type(
                        epoch) is int and 0 <= epoch < 2**15:
                    self.producer_id, self.producer_epoch = pid, epoch
                    self._sequences.clear()
                    log.info("producer_id_assigned", producer_id=pid, producer_epoch=epoch, broker=address)
                    self._wake.set()
                    return
                errors.append(f"init_producer_id to {address}: {code.name}"
                              + ("" if code is not ErrorCode.NONE else f" with producer id {pid!r}, epoch {epoch!r}"))
            if self._clock.monotonic_ms() >= deadline:
                break
            await asyncio.sleep(self.config.retry_backoff_ms / 1000)
        if self._closed:
            return
        log.warning("producer_id_unavailable", max_block_ms=self.config.max_block_ms, last_error=errors[-1:])
        self._fail(self._acc.take_unstamped(), ProducerIdUnavailableError(
            f"no producer id for the idempotent producer within max.block.ms={self.config.max_block_ms} "
            f"(last error: {errors[-1] if errors else 'no broker known'})"))
        self._wake.set()

    def _producer_id_refused(self, address: str, exc: RpcBadRequest) -> None:
        """HTTP 404: the broker predates init_producer_id. Without an explicit enable.idempotence, go on
        without idempotence (a compatibility path, like Kafka 3.x's idempotence default meeting an old
        broker); with it, every record fails with UnsupportedVersionError. Any other 4xx is a client bug."""
        unknown_api = " HTTP 404" in str(exc)
        if unknown_api and self.config.enable_idempotence is None:
            log.warning("producer_idempotence_unsupported", broker=address,
                        detail="the broker does not know init_producer_id; sending without idempotence "
                               "(set enable.idempotence=true to make this an error)")
            self._idempotent = False
            self._max_batches = None
        elif unknown_api:
            self._pid_fatal = (f"enable.idempotence=true, but the broker at {address} does not support "
                               "init_producer_id (HTTP 404: a broker without the idempotent producer); "
                               "set enable.idempotence=false to produce without it")
        else:
            self._pid_fatal = f"init_producer_id refused: {exc}"
        if self._pid_fatal:
            self._fail(self._acc.take_unstamped(), UnsupportedVersionError(self._pid_fatal))
        self._wake.set()

    def _new_producer_id_after(self, batches: Sequence[ProducerBatch]) -> None:
        """A batch stamped with the current producer id failed for good: its sequences are a gap the leader
        would answer OUT_OF_ORDER_SEQUENCE_NUMBER to, so batches drained from now on get a new producer id
        (sequences from 0). Batches stamped already keep their stamps (SPEC; Kafka's KIP-360 instead waits for
        them and bumps the epoch). A batch that failed before it was ever drained holds no sequence."""
        if self.producer_id < 0 or not any(b.producer_id == self.producer_id for b in batches):
            return
        head = batches[0]
        log.info("producer_id_reset", producer_id=self.producer_id, topic=head.tp.topic,
                 partition=head.tp.partition, base_sequence=head.base_sequence)
        self.producer_id = -1
        self.producer_epoch = -1
        self._sequences.clear()
        self._wake.set()

    def _send_ready(self) -> int | None:
        """Send every ready batch whose leader has room; returns ms until the next batch is ready."""
        now = self._clock.monotonic_ms()
        md = self.metadata.current
        for batch in self._acc.expire(now):
            why = batch.last_error or ("LEADER_NOT_AVAILABLE" if md.leader_address(batch.tp) is None else "") or (
                "waiting for a producer id" if self._idempotent and batch.group is None else "")
            self._fail([batch], self._delivery_timeout(f"last error {why}" if why else ""))
        for batches in self._muted.values():
            # in flight past the deadline (Kafka's getExpiredInflightBatches): fails now, as maybe written; the
            # request goes on and keeps the partition muted, and its answer finds these batches done
            if batches[0].deadline_ms <= now and not batches[0].completion.done():
                self._fail(batches, self._delivery_timeout("its request is still unanswered"))
        # an idempotent producer drains a batch for the first time only with a producer id to stamp it with;
        # retried batches (stamped already) go on meanwhile
        waiting_for_id = self._idempotent and self.producer_id < 0
        need_id = False
        by_leader: dict[str, list[TopicPartition]] = {}
        next_ms: int | None = None
        for tp in self._acc.partitions():
            if tp in self._muted:
                continue
            head = self._acc.head(tp)
            assert head is not None
            if waiting_for_id and head.group is None:
                need_id = True  # asked for below; woken when it arrives
                continue
            if not self._acc.is_ready(head, now):
                wait = max(1, self._acc.next_ready_ms(head) - now)
                next_ms = wait if next_ms is None else min(next_ms, wait)
                continue
            leader = md.leader_address(tp)
            if leader is None:
                self._need_refresh = True
                next_ms = self.config.retry_backoff_ms if next_ms is None else min(next_ms,
                                                                                   self.config.retry_backoff_ms)
                continue
            by_leader.setdefault(leader[1], []).append(tp)
        if need_id:
            self._want_producer_id()
        for address, tps in by_leader.items():
            if self._in_flight.get(address, 0) >= self.config.max_in_flight_requests_per_connection:
                continue
            self._send_to(address, tps, now)
        heads = [b for tp in self._acc.partitions() if (b := self._acc.head(tp)) is not None]
        heads += [bs[0] for bs in self._muted.values() if not bs[0].completion.done()]
        soonest_deadline = min((b.deadline_ms for b in heads), default=None)
        if soonest_deadline is not None:
            wait = max(1, soonest_deadline - now)
            next_ms = wait if next_ms is None else min(next_ms, wait)
        return next_ms

    def _send_to(self, address: str, tps: list[TopicPartition], now: int) -> None:
        # batch sizes are estimates; keep 10% for batch headers and framing so the body stays under
        # max.request.size (servers such as aiohttp refuse bodies over 1 MiB by default)
        budget = self.config.max_request_size * 9 // 10
        drained: dict[TopicPartition, list[ProducerBatch]] = {}
        # As Kafka's drain index (RecordAccumulator.drainBatchesForOneNode), a request to a leader starts with the
        # partition after the last one the request before drained from. Always starting at the first ready
        # partition, one with a backlog filled every request, and with max.in.flight 1 a partition listed after
        # it waited until the backlog was gone (its records timed out meanwhile).
        start = self._drain_start.get(address, 0) % len(tps)
        last = -1
        for i, tp in enumerate(tps[start:] + tps[:start]):
            batches = self._acc.drain(tp, budget, now, max_batches=self._max_batches, at_least_one=not drained)
            if not batches:
                continue
            if self._idempotent and batches[0].attempts == 0:  # drained for the first time: stamp it
                self._stamp(tp, batches)
            drained[tp] = batches
            last = i
            budget -= sum(b.size_bytes for b in batches)
            if budget <= 0:
                break
        self._drain_start[address] = (start + last + 1) % len(tps)
        if not drained:
            return
        # In flight from here, not from when the task first runs: a sender pass run before it (woken by a
        # failure in this one) fails expired batches, and took these for never sent (a definite failure)
        # though the task then sent them. Kafka's Sender marks them on its own thread in the same pass.
        for batches in drained.values():
            for b in batches:
                b.attempts += 1
                b.in_flight = True
        self._muted.update(drained)
        self._in_flight[address] = self._in_flight.get(address, 0) + 1
        request = self._spawn(self._produce(address, drained))
        self._requests.add(request)
        request.add_done_callback(self._requests.discard)

    def _stamp(self, tp: TopicPartition, batches: list[ProducerBatch]) -> None:
        """Give fresh batches the producer id and their partition's next sequences (Kafka assigns them at
        drain too, RecordAccumulator.drainBatchesForOneNode): kept for every retry of these batches."""
        assert self.producer_id >= 0
        seq = self._sequences.get(tp, 0)
        for b in batches:
            b.producer_id = self.producer_id
            b.producer_epoch = self.producer_epoch
            b.base_sequence = seq
            seq = (seq + len(b.records)) & _SEQUENCE_MASK
        self._sequences[tp] = seq

    def _request(self, drained: dict[TopicPartition, list[ProducerBatch]]) -> dict[str, Any]:
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, batches in drained.items():
            # rebuilt on each attempt from the records and the stamp: the same bytes every time
            data = b"".join(build_batch(b.records, timestamp_ms=b.records[0][2], producer_id=b.producer_id,
                                        producer_epoch=b.producer_epoch, base_sequence=b.base_sequence)
                            for b in batches)
            topics.setdefault(tp.topic, []).append({"partition": tp.partition, "records": data})
        return {"acks": self.config.acks, "timeout_ms": self.config.request_timeout_ms,
                "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}

    async def _produce(self, address: str, drained: dict[TopicPartition, list[ProducerBatch]]) -> None:
        try:
            body = self._request(drained)
            try:
                try:
                    # request.timeout.ms, as Kafka's NetworkClient expires a request (it was 5 s more: a request
                    # stuck on a paused leader was retried that much later, past a short delivery.timeout.ms)
                    resp = await self._rpc.call(address, "produce", body,
                                                timeout_s=self.config.request_timeout_ms / 1000)
                finally:
                    _mark_answered(drained)
            except RpcBadRequest as exc:
                for batches in drained.values():
                    self._fail(batches, error_for(ErrorCode.INVALID_REQUEST, str(exc)))
                return
            except RpcError as exc:
                for batches in drained.values():
                    self._retry_or_fail(batches, ErrorCode.NETWORK_EXCEPTION, str(exc))
                return
            self._handle_response(resp, drained)
        except asyncio.CancelledError:  # close() gave up waiting: the request may have been appended
            for batches in drained.values():
                self._fail(batches, ProducerClosedError("producer closed before the answer came"), definite=False)
            raise
        except Exception as exc:  # never let a sender task die with batches unresolved
            log.exception("producer_send_failed", broker=address)
            for batches in drained.values():
                self._fail(batches, exc if isinstance(exc, MinibrokerError)
                           else error_for(ErrorCode.UNKNOWN_SERVER_ERROR, repr(exc)), definite=False)
        finally:
            _mark_answered(drained)
            self._in_flight[address] -= 1
            for tp in drained:
                del self._muted[tp]
            self._wake.set()

    def _handle_response(self, resp: dict[str, Any], drained: dict[TopicPartition, list[ProducerBatch]]) -> None:
        answered: set[TopicPartition] = set()
        for t in resp.get("topics") or []:
            for p in t.get("partitions") or []:
                tp = TopicPartition(str(t.get("topic")), int(p.get("partition", -1)))
                batches = drained.get(tp)
                if batches is None or tp in answered:
                    continue
                answered.add(tp)
                code = ErrorCode.of(int(p.get("error", 0)))
                base_offset = p.get("base_offset")
                if code is ErrorCode.NONE and self.config.acks == 0:  # delivered as Kafka reports acks=0: no offset
                    self._complete(batches, -1)
                elif code is ErrorCode.NONE and (type(base_offset) is not int or base_offset < 0):
                    # A success without the offset it was written at cannot be reported as an ack (a delivery
                    # report at offset -1 names no record); it was appended, so it fails as maybe written.
                    self._retry_or_fail(batches, ErrorCode.UNKNOWN_SERVER_ERROR,
                                        f"a successful produce answer without a base_offset ({base_offset!r})")
                elif code is ErrorCode.NONE:
                    append_time = p.get("log_append_time_ms")
                    self._complete(batches, base_offset, append_time if type(append_time) is int else -1)
                else:
                    self._retry_or_fail(batches, code, str(p.get("error_message") or ""))
        for tp, batches in drained.items():
            if tp not in answered:
                self._retry_or_fail(batches, ErrorCode.UNKNOWN_SERVER_ERROR, "partition missing from response")

    def _complete(self, batches: list[ProducerBatch], base_offset: int, log_append_time_ms: int = -1) -> None:
        offset = base_offset
        for b in batches:
            if not b.completion.done():
                b.log_append_time_ms = log_append_time_ms
                b.completion.set_result(offset if base_offset >= 0 else -1)
                self._acc.release([b])
            offset += len(b)
        self._space.set()

    def _retry_or_fail(self, batches: list[ProducerBatch], code: ErrorCode, message: str) -> None:
        if all(b.completion.done() for b in batches):  # expired while in flight: its outcome is told already
            return
        if code not in NOT_APPENDED:
            for b in batches:
                b.maybe_written = True
        now = self._clock.monotonic_ms()
        head = batches[0]
        if code.retriable and now >= head.deadline_ms:
            self._fail(batches, self._delivery_timeout(f"last error {code.name}"))
            return
        if code is ErrorCode.MESSAGE_TOO_LARGE and self._split_too_large(batches, now):
            return
        if (code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and len(batches) > 1 and head.attempts > 1
                and not self._closed):
            # A retried group that a new leader holds only in part (its predecessor's follower fetched, or
            # recovery kept, a prefix of the group) is refused whole: the leader deduplicates a group only as
            # one unit. Kafka sends one batch per partition per request and so never meets this; here the
            # group is split and its batches retried one by one, in order: those in the log are answered with
            # their original offsets, the rest appended.
            log.info("producer_split_group", topic=head.tp.topic, partition=head.tp.partition,
                     batches=len(batches), base_sequence=head.base_sequence)
            for b in batches:
                b.group = [b]
                b.last_error = code.name
            self._acc.requeue(batches, now)
            return
        if code.retriable and head.attempts <= self.config.retries and not self._closed:
            log.info("producer_retry", topic=head.tp.topic, partition=head.tp.partition, error=code.name,
                     attempts=head.attempts, message=message)
            if code in _REFRESH_ON:
                self._need_refresh = True
            for b in batches:
                b.last_error = code.name
            self._acc.requeue(batches, now + self.config.retry_backoff_ms)
            return
        self._fail(batches, error_for(code, f"{code.name}: {message}" if message else code.name))

    def _split_too_large(self, batches: list[ProducerBatch], now: int) -> bool:
        """Send again, in smaller batches, a group the leader refused as too large (Kafka's Sender.completeBatch
        and RecordAccumulator.splitAndReenqueue): a group of several batches batch by batch (Kafka sends one
        batch per partition and so knows which one is too large; here the refused one is found by sending them
        alone), a single batch as two halves. The new batches take its place at the front of the queue, so the
        partition's order is kept. They are drained afresh: an idempotent producer stamps them then, with the
        sequences the group had, taken back here (nothing of it is in the log, and the partition has had no
        other batch stamped meanwhile: it is muted), so the sequences stay contiguous. False (the records fail)
        for one record, or when an earlier attempt of the group may have been written: a split could then
        write it twice."""
        head = batches[0]
        if self._closed or (len(batches) == 1 and len(head) == 1) or any(b.maybe_written for b in batches):
            return False
        if head.producer_id >= 0 and head.producer_id == self.producer_id:
            if self._sequences.get(head.tp) != (head.base_sequence + sum(map(len, batches))) & _SEQUENCE_MASK:
                return False  # not the partition's last stamped batches: their sequences cannot be taken back
            self._sequences[head.tp] = head.base_sequence
        # batches stamped with an earlier producer id get the current one: that id's sequences were abandoned
        if len(batches) > 1:
            for b in batches:
                b.undrained()
            smaller = batches
        else:
            smaller = head.split()
            loop = asyncio.get_running_loop()
            for piece in smaller:
                piece.completion = loop.create_future()
                piece.completion.add_done_callback(lambda _f: _complete_split(head))
        log.info("producer_split_too_large", topic=head.tp.topic, partition=head.tp.partition,
                 batches=len(batches), records=sum(map(len, batches)), into=len(smaller))
        self._acc.requeue(smaller, now)
        return True

    def _delivery_timeout(self, why: str) -> DeliveryTimeoutError:
        return DeliveryTimeoutError(f"not acknowledged within delivery.timeout.ms={self.config.delivery_timeout_ms}"
                                    + (f" ({why})" if why else ""))

    def _fail(self, batches: Sequence[ProducerBatch], exc: BaseException, *, definite: bool = True) -> None:
        """Fail ``batches`` with ``exc``; it is marked a definite failure when no attempt of any of them
        may have been written (``client.errors.is_definite_failure``)."""
        exc.definite_failure = definite and not any(  # type: ignore[attr-defined]
            b.maybe_written or b.in_flight for b in batches)
        if self._idempotent:
            self._new_producer_id_after(batches)
        for b in batches:
            if b.completion is not None and not b.completion.done():
                b.completion.set_exception(exc)
                # mark retrieved so an unawaited failure is not reported as "never retrieved"
                b.completion.exception()
                self._acc.release([b])
        self._space.set()


def _check_partition(partition: object) -> None:
    """Raise for a partition that is not None or an int (the per-record fast path checks ``type`` only)."""
    if not isinstance(partition, int) or isinstance(partition, bool):
        raise TypeError(f"partition must be an int or None, got {type(partition).__name__} {partition!r}")


def _check_timestamp(timestamp_ms: object) -> None:
    """Raise for a timestamp that is not None or an int in [0, 2**63-1] (Kafka refuses a negative one)."""
    if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
        raise TypeError(f"timestamp_ms must be an int (ms since the epoch) or None, got "
                        f"{type(timestamp_ms).__name__} {timestamp_ms!r}")
    if not 0 <= timestamp_ms <= MAX_TIMESTAMP_MS:
        raise ValueError(f"Invalid timestamp: {timestamp_ms}. Timestamp must be in [0, {MAX_TIMESTAMP_MS}] or None")


def _pieces_of(batch: ProducerBatch) -> list[ProducerBatch]:
    """The batches that finally carried ``batch``'s records: itself, or its pieces' pieces once split."""
    if batch.pieces is None:
        return [batch]
    return [leaf for piece in batch.pieces for leaf in _pieces_of(piece)]


def _complete_split(batch: ProducerBatch) -> None:
    """Complete a split batch once all its pieces are: with the first piece's error if any failed (for
    ``add_batch_callback``; each record's own outcome is its piece's, see ``DeliveryFuture``)."""
    assert batch.pieces is not None
    if batch.completion.done() or not all(p.completion.done() for p in batch.pieces):
        return
    error = next((e for p in batch.pieces if (e := p.completion.exception()) is not None), None)
    if error is None:
        batch.completion.set_result(-1)
    else:
        batch.completion.set_exception(error)
        batch.completion.exception()  # retrieved: each record reports its own


def _mark_answered(drained: dict[TopicPartition, list[ProducerBatch]]) -> None:
    for batches in drained.values():
        for b in batches:
            b.in_flight = False


__all__ = ["DeliveryFuture", "Producer", "ProducerConfig", "RecordMetadata", "RpcConnectionError", "parse_acks"]
