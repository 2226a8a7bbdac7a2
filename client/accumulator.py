"""Per-partition record batching for the producer (pure: no I/O, no asyncio).

Records are appended to the last open batch of their partition until it holds
``batch.size`` bytes; a batch is *ready* when it is full, when ``linger.ms``
passed since it was opened, when a flush is in progress, or when it waits for a
retry whose backoff has passed. Each partition has at most one produce request
in flight (it is *muted* meanwhile): this keeps records of a partition in
order across retries without the idempotent producer. Kafka lets up to
``max.in.flight.requests.per.connection`` batches of one partition fly and can
reorder on retry; we chose ordering and make up for it by draining every ready
batch of a partition into the same request (at most ``max_batches`` of them:
the idempotent producer passes 5, the number of batches a leader remembers per
producer for deduplication).

The batches drained together for a partition are a *group*: a retry resends
exactly that group, never fewer batches and never merged with newer ones (the
idempotent producer stamped them with consecutive sequences and a leader
deduplicates a retried request as one unit, see the producer), and a group
whose first batch expires expires whole.

A group the leader refused as too large (MESSAGE_TOO_LARGE: nothing of it was
appended) goes back undrained and *solo*, each batch drained alone: a group
of several batches as its batches, a single batch as two halves of its
records (``split``), which hand its records' outcomes on (``pieces``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from common.wire import TopicPartition

RECORD_OVERHEAD_BYTES = 12  # rough msgpack framing per record, for sizing batches


def record_size(key: bytes | None, value: bytes | None) -> int:
    return RECORD_OVERHEAD_BYTES + (len(key) if key else 0) + (len(value) if value else 0)


@dataclass(slots=True, eq=False)
class ProducerBatch:
    """Records for one partition that travel (and succeed or fail) together. Mutable: owned by one producer."""

    tp: TopicPartition
    created_ms: int  # monotonic
    deadline_ms: int  # monotonic: delivery.timeout.ms after creation
    records: list[tuple[bytes | None, bytes | None, int]] = field(default_factory=list)
    size_bytes: int = 0
    closed: bool = False
    attempts: int = 0
    retry_at_ms: int = 0
    last_error: str = ""  # name of the error that caused the last retry
    retrying: bool = False  # requeued after a failed attempt: ready at retry_at_ms, not by linger
    maybe_written: bool = False  # some attempt got an answer (or none) that does not rule out an append
    in_flight: bool = False  # an attempt is sent and not yet answered
    completion: Any = None  # the producer's asyncio.Future[int] for the base offset
    # the batches drained with this one into its first request (itself included), in order; None until drained
    group: list[ProducerBatch] | None = None
    # the idempotent producer's stamp, set once when the batch is first drained (-1: not stamped)
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    solo: bool = False  # drained alone, never with other batches (see the module docstring)
    pieces: list[ProducerBatch] | None = None  # set by split: the batches now carrying its records, in order
    log_append_time_ms: int = -1  # the leader's time of append, on a LogAppendTime topic (set at completion)

    def __len__(self) -> int:
        return len(self.records)

    def undrained(self) -> None:
        """As if never drained: no group, no stamp, no attempt (Kafka treats the batches of a split "as if they
        are not even tried"), drained alone next time."""
        self.group = None
        self.producer_id = self.producer_epoch = self.base_sequence = -1
        self.attempts = 0
        self.solo = True

    def split(self) -> list[ProducerBatch]:
        """Two batches, undrained, with the first and the second half of the records; this batch's records
        are theirs from now on (``pieces``). Kafka splits to batch.size, which cannot help when the topic's
        max.message.bytes is below it: halves always make progress."""
        half = len(self.records) // 2
        assert half > 0, "a batch of one record cannot be split"
        self.pieces = []
        for records in (self.records[:half], self.records[half:]):
            piece = ProducerBatch(tp=self.tp, created_ms=self.created_ms, deadline_ms=self.deadline_ms,
                                  records=records, size_bytes=sum(record_size(k, v) for k, v, _ in records),
                                  closed=True, last_error=self.last_error)
            piece.undrained()
            self.pieces.append(piece)
        return self.pieces


class RecordAccumulator:
    def __init__(self, *, batch_size: int, linger_ms: int, delivery_timeout_ms: int) -> None:
        assert batch_size > 0 and linger_ms >= 0 and delivery_timeout_ms > 0
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self.flushing = 0  # flushes in progress (Kafka's flushesInProgress): every batch is ready meanwhile
        self.buffered_bytes = 0

    def try_append(self, tp: TopicPartition, key: bytes | None, value: bytes | None, timestamp_ms: int,
                   size: int) -> ProducerBatch | None:
        """Add a record to ``tp``'s open batch if it has room and return that batch (the record is its last);
        None, appending nothing, when the record would need a new batch. The producer's hot path: one call
        per record, no objects but the record's tuple."""
        queue = self._queues.get(tp)
        if not queue:
            return None
        batch = queue[-1]
        if batch.closed or batch.size_bytes + size > self.batch_size:
            return None
        batch.records.append((key, value, timestamp_ms))
        batch.size_bytes += size
        self.buffered_bytes += size
        if batch.size_bytes >= self.batch_size:
            batch.closed = True
        return batch

    def append(self, tp: TopicPartition, key: bytes | None, value: bytes | None, timestamp_ms: int,
               now_ms: int | Callable[[], int], size: int | None = None) -> ProducerBatch:
        """Add a record, opening a new batch when the open one is full or sent; returns the batch, whose
        last record it is (``len(batch) == 1``: a new batch). ``now_ms`` (monotonic) may be a clock
        function: it is only read when a batch is opened."""
        if size is None:
            size = record_size(key, value)
        batch = self.try_append(tp, key, value, timestamp_ms, size)
        if batch is not None:
            return batch
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        if queue:
            queue[-1].closed = True
        now = now_ms() if callable(now_ms) else now_ms
        batch = ProducerBatch(tp=tp, created_ms=now, deadline_ms=now + self.delivery_timeout_ms)
        queue.append(batch)
        batch.records.append((key, value, timestamp_ms))
        batch.size_bytes = size
        self.buffered_bytes += size
        if size >= self.batch_size:
            batch.closed = True
        return batch

    def is_ready(self, batch: ProducerBatch, now_ms: int) -> bool:
        if batch.retrying:
            return now_ms >= batch.retry_at_ms
        return batch.closed or self.flushing > 0 or now_ms - batch.created_ms >= self.linger_ms

    def next_ready_ms(self, batch: ProducerBatch) -> int:
        """When a not-yet-ready batch becomes ready (monotonic ms)."""
        if batch.retrying:
            return batch.retry_at_ms
        return batch.created_ms + self.linger_ms

    def partitions(self) -> list[TopicPartition]:
        return [tp for tp, q in self._queues.items() if q]

    def head(self, tp: TopicPartition) -> ProducerBatch | None:
        q = self._queues.get(tp)
        return q[0] if q else None

    def drain(self, tp: TopicPartition, max_bytes: int, now_ms: int, *, max_batches: int | None = None,
              at_least_one: bool = True) -> list[ProducerBatch]:
        """Pop the ready batches at the front of ``tp``'s queue, up to ``max_bytes`` and ``max_batches``;
        at least one when ``at_least_one`` (the first partition of a request: a batch larger than the budget
        must still go). A retried group comes out exactly as it was first drained (whole, or not at all
        when it does not fit and ``at_least_one`` is False)."""
        q = self._queues.get(tp)
        if not q or not self.is_ready(q[0], now_ms):
            return []
        group = q[0].group
        if group is not None:
            if not at_least_one and sum(b.size_bytes for b in group) > max_bytes:
                return []
            for batch in group:
                assert q and q[0] is batch, "a retried group must sit whole at the front of its queue"
                q.popleft()
            return list(group)
        out: list[ProducerBatch] = []
        total = 0
        while q and self.is_ready(q[0], now_ms) and q[0].group is None:
            if max_batches is not None and len(out) >= max_batches:
                break
            if (out or not at_least_one) and total + q[0].size_bytes > max_bytes:
                break
            if out and q[0].solo:
                break
            batch = q.popleft()
            batch.closed = True
            batch.group = out
            total += batch.size_bytes
            out.append(batch)
            if batch.solo:
                break
        return out

    def requeue(self, batches: Iterable[ProducerBatch], retry_at_ms: int) -> None:
        """Put batches back at the front of their queues, in their original order."""
        for batch in reversed(list(batches)):
            batch.retry_at_ms = retry_at_ms
            batch.retrying = True
            q = self._queues.setdefault(batch.tp, deque())
            q.appendleft(batch)

    def expire(self, now_ms: int) -> list[ProducerBatch]:
        """Remove and return queued batches whose delivery deadline passed, with the rest of their group when
        they were sent before (its batches only ever travel together)."""
        expired: list[ProducerBatch] = []
        for q in self._queues.values():
            while q and q[0].deadline_ms <= now_ms:
                head = q[0]
                for batch in head.group if head.group is not None else (head,):
                    assert q and q[0] is batch, "a retried group must sit whole at the front of its queue"
                    expired.append(q.popleft())
        return expired

    def release(self, batches: Iterable[ProducerBatch]) -> None:
        """Batches that are done (acknowledged or failed) no longer count against buffer.memory."""
        for batch in batches:
            self.buffered_bytes -= batch.size_bytes

    def take_unstamped(self) -> list[ProducerBatch]:
        """Remove and return every queued batch that was never drained (no producer id or sequence yet)."""
        out: list[ProducerBatch] = []
        for q in self._queues.values():
            kept = [b for b in q if b.group is not None]
            out += [b for b in q if b.group is None]
            q.clear()
            q.extend(kept)
        return out

    def fail_all(self) -> list[ProducerBatch]:
        out = [b for q in self._queues.values() for b in q]
        self._queues.clear()
        return out

    def empty(self) -> bool:
        return not any(self._queues.values())
