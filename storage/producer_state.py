"""Per-partition producer state for the idempotent producer (pure; no I/O).

Kafka's ``ProducerStateManager`` / ``ProducerStateEntry`` / ``ProducerAppendInfo``
cut down to idempotence (no transactions). For each producer id that has
batches in the log the state keeps its producer epoch and its last
``NUM_BATCHES_TO_RETAIN`` (5) batches: first/last sequence and first/last offset.

The leader checks every batch with ``producer_id >= 0`` before appending it
(``ProducerStateManager.check``), in Kafka's order
(``UnifiedLog.analyzeAndValidateProducerState``, ``ProducerAppendInfo``):

1. same epoch and the (first, last) sequence of one of the cached batches: a
   duplicate; nothing is appended and the original offsets are answered;
2. an epoch below the producer's: ``INVALID_PRODUCER_EPOCH``;
3. a newer epoch must start at sequence 0, else ``OUT_OF_ORDER_SEQUENCE_NUMBER``;
4. the same epoch must continue at last sequence + 1 (wrapping at 2**31-1 to 0),
   else ``OUT_OF_ORDER_SEQUENCE_NUMBER``;
5. an unknown producer id is accepted at any sequence.

The batches of one append (one produce request's records for one partition)
are one unit: all duplicates of consecutive cached batches of one producer ->
a duplicate answered with the first one's original offsets; duplicates mixed
with anything else -> ``OUT_OF_ORDER_SEQUENCE_NUMBER``; otherwise each batch is
checked against the state the previous one leaves, and all or none are
appended. Followers and the rebuild from the log (``Log.open``, truncation)
``apply`` batches without checks. Nothing is persisted: the log's batch headers
are the state's source (Kafka also writes ``.snapshot`` files to avoid scanning
the log on start; minibroker scans the headers instead, see ``storage.log``).
Kafka also forgets producers idle for ``producer.id.expiration.ms`` (a day);
minibroker forgets one only when retention moves the log start past its last
batch, so the state is bounded by the batches in the log, and needs no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from common.errors import ErrorCode, MinibrokerError

NUM_BATCHES_TO_RETAIN = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
MAX_SEQUENCE = 2**31 - 1
NO_PRODUCER_ID = -1


class ProducerStateError(MinibrokerError):
    """A batch refused by the producer-state checks; ``code`` is the partition's answer."""


class OutOfOrderSequenceError(ProducerStateError):
    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(ProducerStateError):
    code = ErrorCode.INVALID_PRODUCER_EPOCH


class InvalidProducerBatchError(ProducerStateError):
    """producer_id >= 0 with a negative producer epoch or base sequence."""

    code = ErrorCode.INVALID_RECORD


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's ``DefaultRecordBatch.incrementSequence``: wraps from 2**31-1 to 0."""
    if sequence > MAX_SEQUENCE - increment:
        return sequence - (MAX_SEQUENCE - increment) - 1
    return sequence + increment


class ProducerBatch(NamedTuple):
    """One batch of an append, as the state sees it (built from the header fields and assigned offsets)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    first_offset: int
    last_offset: int

    @property
    def last_sequence(self) -> int:
        return increment_sequence(self.base_sequence, self.record_count - 1)


class BatchMetadata(NamedTuple):
    """Kafka's ``BatchMetadata``: what is remembered of one appended batch."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """One producer's state: its epoch and its last batches, oldest first (at most 5, all of ``epoch``)."""

    producer_id: int
    epoch: int
    batches: tuple[BatchMetadata, ...]

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> int | None:
        """Index in ``batches`` of the batch with this epoch and sequence range (Kafka's findDuplicateBatch)."""
        if epoch != self.epoch:
            return None
        for i, b in enumerate(self.batches):
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return i
        return None

    def with_batch(self, batch: ProducerBatch) -> ProducerEntry:
        """The entry after ``batch`` is appended: a new epoch forgets the old epoch's batches (Kafka's
        ``maybeUpdateProducerEpoch``); only the last 5 are kept."""
        meta = BatchMetadata(batch.base_sequence, batch.last_sequence, batch.first_offset, batch.last_offset)
        kept = self.batches if batch.producer_epoch == self.epoch else ()
        return ProducerEntry(self.producer_id, batch.producer_epoch, (*kept, meta)[-NUM_BATCHES_TO_RETAIN:])


class Duplicate(NamedTuple):
    """A unit every batch of which was already appended: the original offsets."""

    first_offset: int
    last_offset: int


def check_batch(entry: ProducerEntry | None, batch: ProducerBatch) -> None:
    """Rules 2-5 for one non-duplicate batch; raises ``ProducerStateError``."""
    if batch.producer_epoch < 0 or batch.base_sequence < 0:
        raise InvalidProducerBatchError(f"producer {batch.producer_id}: epoch {batch.producer_epoch}, "
                                        f"base sequence {batch.base_sequence}: both must be >= 0")
    if entry is None:
        return
    if batch.producer_epoch < entry.epoch:
        raise InvalidProducerEpochError(f"producer {batch.producer_id}: epoch {batch.producer_epoch} < "
                                        f"current epoch {entry.epoch}")
    if batch.producer_epoch > entry.epoch:
        if batch.base_sequence != 0:
            raise OutOfOrderSequenceError(f"producer {batch.producer_id}: new epoch {batch.producer_epoch} "
                                          f"starts at sequence {batch.base_sequence}, not 0")
        return
    expected = increment_sequence(entry.last_seq, 1)
    if batch.base_sequence != expected:
        raise OutOfOrderSequenceError(f"producer {batch.producer_id} epoch {batch.producer_epoch}: sequence "
                                      f"{batch.base_sequence}, expected {expected}")


class ProducerStateManager:
    """The producer state of one partition. Mutated only by ``apply``, ``remove_below`` and ``clear``."""

    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def entries(self) -> list[ProducerEntry]:
        return list(self._producers.values())

    def check(self, batches: Sequence[ProducerBatch], unit_size: int) -> Duplicate | None:
        """Check the idempotent ``batches`` of one append of ``unit_size`` batches in all (the others have
        producer id -1). A ``Duplicate`` when the whole unit was appended before; None when it may be
        appended (then ``apply`` it after the write); ``ProducerStateError`` when it must not be."""
        dup = self._duplicate_unit(batches, unit_size)
        if dup is not None:
            return dup
        pending: dict[int, ProducerEntry] = {}  # the state the unit's earlier batches leave
        for b in batches:
            entry = pending.get(b.producer_id) or self._producers.get(b.producer_id)
            if entry is not None and entry.find_duplicate(b.producer_epoch, b.base_sequence,
                                                          b.last_sequence) is not None:
                raise OutOfOrderSequenceError(
                    f"producer {b.producer_id}: sequences {b.base_sequence}..{b.last_sequence} were already "
                    "appended, but the request also holds other batches")
            check_batch(entry, b)
            pending[b.producer_id] = _next_entry(entry, b)
        return None

    def _duplicate_unit(self, batches: Sequence[ProducerBatch], unit_size: int) -> Duplicate | None:
        """The original offsets when every batch of the unit duplicates consecutive cached batches of one
        producer; None when the first idempotent batch is not a duplicate."""
        if not batches:
            return None
        first = batches[0]
        entry = self._producers.get(first.producer_id)
        start = None if entry is None else entry.find_duplicate(first.producer_epoch, first.base_sequence,
                                                                first.last_sequence)
        if start is None:
            return None
        assert entry is not None
        ok = len(batches) == unit_size and start + len(batches) <= len(entry.batches)
        for i, b in enumerate(batches):
            if not ok:
                break
            cached = entry.batches[start + i]
            ok = (b.producer_id == first.producer_id and b.producer_epoch == entry.epoch
                  and (b.base_sequence, b.last_sequence) == (cached.first_seq, cached.last_seq))
        if not ok:
            raise OutOfOrderSequenceError(
                f"producer {first.producer_id}: sequences {first.base_sequence}..{first.last_sequence} were "
                "already appended, but the request's other batches are not the ones appended after them")
        return Duplicate(entry.batches[start].first_offset, entry.batches[start + len(batches) - 1].last_offset)

    def apply(self, batches: Iterable[ProducerBatch]) -> None:
        """Record appended batches (leader after ``check``, follower, rebuild): no checks."""
        producers = self._producers
        for b in batches:
            producers[b.producer_id] = _next_entry(producers.get(b.producer_id), b)

    def remove_below(self, log_start_offset: int) -> int:
        """Forget producers whose last batch is below the log start (Kafka's ``truncateHead``). -> count."""
        gone = [pid for pid, e in self._producers.items() if e.last_offset < log_start_offset]
        for pid in gone:
            del self._producers[pid]
        return len(gone)

    def has_batches_from(self, offset: int) -> bool:
        """Whether some producer's last batch ends at or after ``offset`` (a truncation there changes the
        state)."""
        return any(e.last_offset >= offset for e in self._producers.values())

    def clear(self) -> None:
        self._producers.clear()


def _next_entry(entry: ProducerEntry | None, batch: ProducerBatch) -> ProducerEntry:
    if entry is None:
        entry = ProducerEntry(batch.producer_id, batch.producer_epoch, ())
    return entry.with_batch(batch)
