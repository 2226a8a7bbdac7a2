"""The producer-state checks (storage/producer_state.py), without I/O: tables and a hypothesis model."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ErrorCode
from storage.producer_state import (
    MAX_SEQUENCE,
    Duplicate,
    ProducerBatch,
    ProducerStateError,
    ProducerStateManager,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    increment_sequence,
)

PID = 7


def b(seq: int, count: int = 1, *, epoch: int = 0, offset: int = 0, pid: int = PID) -> ProducerBatch:
    return ProducerBatch(pid, epoch, seq, count, offset, offset + count - 1)


def state_with(*batches: ProducerBatch) -> ProducerStateManager:
    s = ProducerStateManager()
    s.apply(batches, 0)
    return s


def code_of(s: ProducerStateManager, batches: list[ProducerBatch], unit_size: int | None = None) -> ErrorCode:
    with pytest.raises(ProducerStateError) as info:
        s.check(batches, len(batches) if unit_size is None else unit_size)
    return info.value.code


# six batches of 2 records: sequences 0-1, 2-3, ... 10-11 at offsets 100+10i
SIX = [b(2 * i, 2, offset=100 + 10 * i) for i in range(6)]


@pytest.mark.parametrize("i", range(1, 6))
def test_a_duplicate_of_each_of_the_last_five_returns_its_original_offsets(i: int) -> None:
    s = state_with(*SIX)
    again = b(SIX[i].base_sequence, 2, offset=999)
    assert s.check([again], 1) == Duplicate(SIX[i].first_offset, SIX[i].last_offset)


def test_a_batch_older_than_the_last_five_is_out_of_order() -> None:
    s = state_with(*SIX)
    assert code_of(s, [b(0, 2, offset=999)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


@pytest.mark.parametrize(("seq", "count"), [(13, 1), (11, 1), (5, 1), (10, 1), (10, 3)])
def test_anything_but_the_next_sequence_or_an_exact_duplicate_is_out_of_order(seq: int, count: int) -> None:
    s = state_with(*SIX)
    assert code_of(s, [b(seq, count, offset=999)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_the_next_sequence_is_accepted() -> None:
    s = state_with(*SIX)
    assert s.check([b(12, 5, offset=200)], 1) is None


def test_a_lower_epoch_is_fenced_even_at_a_cached_sequence() -> None:
    s = state_with(b(0, 2, epoch=3), b(2, 2, epoch=3, offset=2))
    assert code_of(s, [b(4, 1, epoch=2)]) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert code_of(s, [b(0, 2, epoch=2)]) is ErrorCode.INVALID_PRODUCER_EPOCH


def test_a_new_epoch_must_start_at_zero() -> None:
    s = state_with(b(0, 2), b(2, 2, offset=2))
    assert s.check([b(0, 1, epoch=1, offset=10)], 1) is None
    assert code_of(s, [b(5, 1, epoch=1, offset=10)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert code_of(s, [b(4, 1, epoch=1, offset=10)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_new_epoch_forgets_the_old_epochs_batches() -> None:
    s = state_with(b(0, 2), b(0, 1, epoch=1, offset=2))
    entry = s.entry(PID)
    assert entry is not None and entry.epoch == 1 and len(entry.batches) == 1
    # sequence 0-1 of epoch 0 is no duplicate any more: the epoch is older now
    assert code_of(s, [b(0, 2, epoch=0, offset=9)]) is ErrorCode.INVALID_PRODUCER_EPOCH


@pytest.mark.parametrize("seq", [0, 17, MAX_SEQUENCE])
def test_an_unknown_producer_is_accepted_at_any_sequence(seq: int) -> None:
    s = state_with(b(0, 3, pid=1))
    assert s.check([b(seq, 1, pid=2)], 1) is None


@pytest.mark.parametrize(("pid_epoch", "seq"), [(-1, 0), (0, -1)])
def test_an_idempotent_batch_needs_an_epoch_and_a_sequence(pid_epoch: int, seq: int) -> None:
    s = ProducerStateManager()
    assert code_of(s, [b(seq, 1, epoch=pid_epoch)]) is ErrorCode.INVALID_RECORD


def test_sequences_wrap_at_int32_max() -> None:
    assert increment_sequence(MAX_SEQUENCE, 1) == 0
    assert increment_sequence(MAX_SEQUENCE - 1, 3) == 1
    wrapping = b(MAX_SEQUENCE - 1, 3)  # sequences 2**31-2, 2**31-1, 0
    assert wrapping.last_sequence == 0
    s = state_with(wrapping)
    assert s.check([b(1, 1, offset=3)], 1) is None
    assert code_of(s, [b(MAX_SEQUENCE, 1, offset=3)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert s.check([b(MAX_SEQUENCE - 1, 3, offset=50)], 1) == Duplicate(0, 2)
    at_max = state_with(b(MAX_SEQUENCE - 4, 5))  # ends exactly at 2**31-1: the next one starts at 0
    assert at_max.check([b(0, 1, offset=5)], 1) is None
    assert code_of(at_max, [b(MAX_SEQUENCE - 4 + 5, 1, offset=5)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_sequences_reach_int32_max_before_they_wrap() -> None:
    # 2**31-1 is a sequence like any other: only the step past it wraps to 0
    assert increment_sequence(MAX_SEQUENCE - 1, 1) == MAX_SEQUENCE
    assert increment_sequence(MAX_SEQUENCE - 4, 4) == MAX_SEQUENCE
    assert b(MAX_SEQUENCE - 4, 5).last_sequence == MAX_SEQUENCE
    s = state_with(b(MAX_SEQUENCE - 2, 2))  # sequences 2**31-3 and 2**31-2
    assert s.check([b(MAX_SEQUENCE, 1, offset=2)], 1) is None
    s.apply([b(MAX_SEQUENCE, 1, offset=2)], 0)
    assert s.entry(PID).last_seq == MAX_SEQUENCE
    assert s.check([b(0, 1, offset=3)], 1) is None


# ---- one append of several batches: one unit ----------------------------------------------------------

def test_a_unit_of_consecutive_duplicates_answers_the_first_ones_offset() -> None:
    s = state_with(*SIX)
    assert s.check([b(4, 2), b(6, 2), b(8, 2)], 3) == Duplicate(SIX[2].first_offset, SIX[4].last_offset)


def test_a_unit_of_duplicates_that_are_not_consecutive_in_the_cache_is_out_of_order() -> None:
    s = state_with(*SIX)
    assert code_of(s, [b(4, 2), b(8, 2)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


@pytest.mark.parametrize("unit", [[(8, 2), (10, 2), (12, 2)], [(12, 2), (10, 2)], [(10, 2), (12, 2)]])
def test_duplicates_mixed_with_new_batches_are_out_of_order(unit: list[tuple[int, int]]) -> None:
    s = state_with(*SIX)
    assert code_of(s, [b(seq, n) for seq, n in unit]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_duplicate_with_a_non_idempotent_batch_in_the_same_unit_is_out_of_order() -> None:
    s = state_with(*SIX)
    assert code_of(s, [b(10, 2)], unit_size=2) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_unit_is_a_duplicate_only_if_every_batch_has_the_cached_epoch() -> None:
    # the first batch matches the cache with its epoch; a later one with sequences of the cache but another
    # epoch is no retry of what was written
    s = state_with(b(0, 1, offset=0), b(1, 1, offset=1))
    assert code_of(s, [b(0, 1, offset=9), b(1, 1, epoch=1, offset=10)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_unit_is_checked_batch_by_batch_against_the_state_the_previous_one_leaves() -> None:
    s = state_with(*SIX)
    assert s.check([b(12, 2, offset=200), b(14, 3, offset=202), b(17, 1, offset=205)], 3) is None
    assert code_of(s, [b(12, 2, offset=200), b(15, 1, offset=202)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert code_of(s, [b(12, 2, offset=200), b(12, 2, offset=202)]) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # a new epoch inside the unit, then its continuation
    assert s.check([b(0, 2, epoch=1, offset=200), b(2, 1, epoch=1, offset=202)], 2) is None
    # check changes nothing
    entry = s.entry(PID)
    assert entry is not None and entry.last_seq == 11 and entry.epoch == 0


def test_two_producers_in_one_unit_are_each_checked() -> None:
    s = state_with(b(0, 1, pid=1), b(0, 1, pid=2, offset=1))
    assert s.check([b(1, 1, pid=1, offset=2), b(1, 1, pid=2, offset=3)], 2) is None
    assert code_of(s, [b(1, 1, pid=1, offset=2), b(3, 1, pid=2, offset=3)]) \
        is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_only_the_last_five_batches_are_kept() -> None:
    s = state_with(*SIX, b(0, 1, pid=9, offset=170))
    entry = s.entry(PID)
    assert entry is not None and [m.first_seq for m in entry.batches] == [2, 4, 6, 8, 10]


def test_producers_expire_after_their_last_append_only() -> None:
    s = ProducerStateManager()
    s.apply([b(0, 2)], 1_000)
    s.apply([b(0, 1, pid=9, offset=2)], 1_000)
    s.apply([b(2, 2, offset=3)], 5_000)  # PID appended again later
    entry = s.entry(PID)
    assert entry is not None and entry.last_timestamp == 5_000
    assert s.remove_expired(now_ms=11_000, expiration_ms=10_000) == 0  # exactly 10 s idle: kept (Kafka: >)
    assert s.remove_expired(now_ms=11_001, expiration_ms=10_000) == 1
    assert s.entry(9) is None and s.entry(PID) is not None
    assert s.check([b(7, 2, pid=9, offset=300)], 1) is None  # unknown again: any sequence


def test_a_snapshot_round_trips_and_damage_is_detected() -> None:
    s = ProducerStateManager()
    s.apply(SIX, 123)
    s.apply([b(MAX_SEQUENCE - 1, 3, pid=9, epoch=4, offset=200)], 456)
    text = encode_snapshot(203, s.entries())
    offset, entries = decode_snapshot(text)
    assert offset == 203 and entries == s.entries()
    for damaged in (text[:-1], text.replace('"offset":203', '"offset":204'), "", "zz\n{}",
                    text.replace("[", "(", 1), _signed('{"version":1,"offset":5,"producers":[[1,0,0,[]]]}'),
                    _signed('{"version":1,"offset":5,"producers":[[1,0,0,[[0,1,2]]]]}'),
                    _signed('{"version":2,"offset":5,"producers":[]}'), _signed('{"version":1,"offset":"5"}')):
        with pytest.raises(SnapshotError):
            decode_snapshot(damaged)
    assert decode_snapshot(_signed('{"version":1,"offset":5,"producers":[]}')) == (5, [])


def _signed(body: str) -> str:
    return f"{zlib.crc32(body.encode()):08x}\n{body}"


# ---- a model: a producer that retries, against the state ------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 7)), min_size=1, max_size=40))
def test_retries_of_any_of_the_last_five_never_append_twice(steps: list[tuple[int, int]]) -> None:
    """Each step appends a new batch of ``count`` records, then resends the batch ``back`` steps ago. A
    resend of one of the last 5 is a duplicate with its original offsets; an older one is refused."""
    s = ProducerStateManager()
    sent: list[ProducerBatch] = []
    seq, offset = 0, 0
    for count, back in steps:
        new = ProducerBatch(PID, 0, seq, count, offset, offset + count - 1)
        assert s.check([new], 1) is None
        s.apply([new], 0)
        sent.append(new)
        seq, offset = increment_sequence(seq, count), offset + count
        if back < len(sent):
            old = sent[-1 - back]
            retry = old._replace(first_offset=offset, last_offset=offset + old.record_count - 1)
            if back < 5:
                assert s.check([retry], 1) == Duplicate(old.first_offset, old.last_offset)
            else:
                with pytest.raises(ProducerStateError):
                    s.check([retry], 1)
