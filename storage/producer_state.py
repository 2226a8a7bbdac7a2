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
appended. Followers and the rebuild from the log (``Log.open``) ``apply``
batches without checks.

Producers are forgotten only when they expire (Kafka's
``removeExpiredProducers``: idle longer than ``producer.id.expiration.ms``,
run by the ``LogManager`` tick), never because retention moved the log start
past their batches (Kafka's ``onLogStartOffsetIncremented`` keeps them too): a
retry of a batch that retention deleted must still be a duplicate. A
truncation drops the cut batches from the cache (``truncate_from``); when that
would leave a producer with none, ``Log`` rebuilds the state instead (newest
snapshot at or below the cut, then the batch headers after it), as Kafka's
``truncateAndReload`` always does: the producer's older batches may remain.
``Log`` persists the state with
``encode_snapshot`` at every roll and clean close (Kafka's ``.snapshot`` files)
and ``Log.open`` loads the newest usable one and replays only the batches after it.
"""

from __future__ import annotations

import json
import zlib
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
    """One producer's state: its epoch and its last batches, oldest first (at most 5, all of ``epoch``).

    ``last_timestamp``: when this replica last appended one of its batches (wall clock, ms), for the
    expiration. Kafka uses the batch's max timestamp, but that is the producer's own value (CreateTime;
    minibroker does not bound it against the broker clock): a producer with a skewed or made-up clock
    would be expired at once, or never. The append time is the broker's. An entry rebuilt from batch
    headers (no snapshot covers them) takes the time of the rebuild: it can only live longer."""

    producer_id: int
    epoch: int
    batches: tuple[BatchMetadata, ...]
    last_timestamp: int

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

    def with_batch(self, batch: ProducerBatch, now_ms: int) -> ProducerEntry:
        """The entry after ``batch`` is appended at ``now_ms``: a new epoch forgets the old epoch's batches
        (Kafka's ``maybeUpdateProducerEpoch``); only the last 5 are kept."""
        meta = BatchMetadata(batch.base_sequence, batch.last_sequence, batch.first_offset, batch.last_offset)
        kept = self.batches if batch.producer_epoch == self.epoch else ()
        return ProducerEntry(self.producer_id, batch.producer_epoch, (*kept, meta)[-NUM_BATCHES_TO_RETAIN:],
                             max(now_ms, self.last_timestamp))


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
    """The producer state of one partition. Mutated only by ``apply``, ``remove_expired``,
    ``truncate_from``, ``load`` and ``clear``."""

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
            pending[b.producer_id] = _next_entry(entry, b, 0)
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

    def apply(self, batches: Iterable[ProducerBatch], now_ms: int) -> None:
        """Record appended batches (leader after ``check``, follower, rebuild) at ``now_ms``: no checks."""
        producers = self._producers
        for b in batches:
            producers[b.producer_id] = _next_entry(producers.get(b.producer_id), b, now_ms)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers whose last append is more than ``expiration_ms`` before ``now_ms`` (Kafka's
        ``removeExpiredProducers`` with ``producer.id.expiration.ms``). -> how many."""
        gone = [pid for pid, e in self._producers.items() if now_ms - e.last_timestamp > expiration_ms]
        for pid in gone:
            del self._producers[pid]
        return len(gone)

    def truncate_from(self, offset: int) -> bool:
        """Drop every cached batch ending at or after ``offset`` (a truncation of the log to ``offset``, a
        batch boundary), unless that would leave a producer with no cached batch: then nothing changes and
        False says the state must be rebuilt from the log (``Log._reload_producer_state``), since that
        producer's older batches may remain. A producer keeping some of its cached batches is right as it is
        for everything a producer can send: it retries only its one request in flight, whose batches, where
        appended here, are its latest and so among those kept; its next sequence follows the last kept."""
        kept: dict[int, tuple[BatchMetadata, ...]] = {}
        for pid, e in self._producers.items():
            if e.last_offset < offset:
                continue
            left = tuple(m for m in e.batches if m.last_offset < offset)
            if not left:
                return False
            kept[pid] = left
        for pid, batches in kept.items():
            e = self._producers[pid]
            self._producers[pid] = ProducerEntry(pid, e.epoch, batches, e.last_timestamp)
        return True

    def load(self, entries: Iterable[ProducerEntry]) -> None:
        """Replace the state with ``entries`` (from a snapshot)."""
        self._producers = {e.producer_id: e for e in entries}

    def clear(self) -> None:
        self._producers.clear()


def _next_entry(entry: ProducerEntry | None, batch: ProducerBatch, now_ms: int) -> ProducerEntry:
    if entry is None:
        entry = ProducerEntry(batch.producer_id, batch.producer_epoch, (), now_ms)
    return entry.with_batch(batch, now_ms)


# ---- snapshot (Log.close writes it, Log.open reads it) --------------------------------------------------
SNAPSHOT_VERSION = 1


class SnapshotError(ValueError):
    """A snapshot that cannot be used (CRC mismatch, bad JSON, wrong shape or version)."""


def encode_snapshot(offset: int, entries: Iterable[ProducerEntry]) -> str:
    """The state at log offset ``offset`` (the LEO: it describes every batch below it) as text: a line with
    the CRC-32 (hex) of the JSON body, then the body."""
    body = json.dumps({
        "version": SNAPSHOT_VERSION,
        "offset": offset,
        "producers": [[e.producer_id, e.epoch, e.last_timestamp, [list(m) for m in e.batches]] for e in entries],
    }, separators=(",", ":"))
    return f"{zlib.crc32(body.encode()):08x}\n{body}"


def decode_snapshot(text: str) -> tuple[int, list[ProducerEntry]]:
    """(offset, entries) of an ``encode_snapshot`` text; ``SnapshotError`` if it is damaged."""
    crc, sep, body = text.partition("\n")
    try:
        if not sep or int(crc, 16) != zlib.crc32(body.encode()):
            raise SnapshotError("CRC mismatch")
        data = json.loads(body)
        if data["version"] != SNAPSHOT_VERSION:
            raise SnapshotError(f"version {data['version']!r}")
        offset = data["offset"]
        entries = []
        for pid, epoch, last_ts, batches in data["producers"]:
            metas = tuple(BatchMetadata(*(_int(v) for v in m)) for m in batches)
            if not 0 < len(metas) <= NUM_BATCHES_TO_RETAIN:
                raise SnapshotError(f"producer {pid!r}: {len(metas)} batches")
            entries.append(ProducerEntry(_int(pid), _int(epoch), metas, _int(last_ts)))
        return _int(offset), entries
    except SnapshotError:
        raise
    except (ValueError, TypeError, KeyError) as exc:  # JSONDecodeError is a ValueError
        raise SnapshotError(f"{type(exc).__name__}: {exc}") from exc


def _int(value: object) -> int:
    if type(value) is not int:
        raise SnapshotError(f"expected an integer, got {value!r}")
    return value
