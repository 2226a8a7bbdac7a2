"""Pure tests of the fetch state and the KIP-279 / out-of-range decisions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from common.wire import TopicPartition
from fetcher.state import (
    EpochEndOffset,
    FetchStatus,
    OutOfRangeAction,
    PartitionFetchState,
    PartitionStates,
    decide_out_of_range,
    decide_truncation,
    fetch_lag,
)

UNDEF = EpochEndOffset(-1, -1)


def test_initial_state_truncates_first_and_is_not_fetchable() -> None:
    s = PartitionFetchState.initial(10, 3, None)
    assert s.status is FetchStatus.TRUNCATING
    assert s.is_truncating(0) and not s.is_fetchable(0)


def test_parked_until_time_passes() -> None:
    s = PartitionFetchState.initial(0, 1, None).truncated(0, 1, True).parked(1_000)
    assert not s.is_fetchable(999)
    assert s.is_fetchable(1_000)


def test_truncated_not_completed_stays_truncating() -> None:
    s = PartitionFetchState.initial(0, 1, None).truncated(5, 2, False)
    assert s.status is FetchStatus.TRUNCATING and s.last_fetched_epoch == 2


def test_same_epoch_on_both_sides_truncates_to_smaller_end() -> None:
    d = decide_truncation(EpochEndOffset(2, 100), EpochEndOffset(2, 120), log_end_offset=130, high_watermark=90)
    assert (d.offset, d.completed) == (100, True)


def test_same_epoch_cut_where_the_followers_copy_of_it_ends() -> None:
    # the follower had epoch 2 up to 10, then an epoch 3 of its own (10-14) the leader never saw; the leader
    # kept epoch 2 up to 15. Offsets 10-14 differ from the leader's, so the cut is at the follower's end of
    # epoch 2, below both the leader's end of it and the follower's LEO
    d = decide_truncation(EpochEndOffset(2, 15), EpochEndOffset(2, 10), log_end_offset=15, high_watermark=8)
    assert (d.offset, d.completed) == (10, True)


def test_follower_shorter_than_leader_keeps_everything() -> None:
    d = decide_truncation(EpochEndOffset(2, 200), EpochEndOffset(2, 150), log_end_offset=150, high_watermark=90)
    assert (d.offset, d.completed) == (150, True)


def test_leader_undefined_falls_back_to_high_watermark() -> None:
    d = decide_truncation(UNDEF, UNDEF, log_end_offset=150, high_watermark=90)
    assert (d.offset, d.completed) == (90, True)
    d = decide_truncation(UNDEF, UNDEF, log_end_offset=150, high_watermark=None)
    assert (d.offset, d.completed) == (150, True)


def test_follower_lacking_any_epoch_truncates_to_leader_end() -> None:
    d = decide_truncation(EpochEndOffset(1, 40), UNDEF, log_end_offset=100, high_watermark=None)
    assert (d.offset, d.completed) == (40, True)


def test_follower_lacking_leaders_epoch_cuts_to_its_own_and_asks_again() -> None:
    # leader answers epoch 2; follower jumped from epoch 1 (ending at 60) to epoch 3
    d = decide_truncation(EpochEndOffset(2, 80), EpochEndOffset(1, 60), log_end_offset=100, high_watermark=None)
    assert (d.offset, d.completed, d.next_epoch) == (60, False, 1)


def test_never_truncates_above_log_end() -> None:
    d = decide_truncation(EpochEndOffset(5, 1_000), EpochEndOffset(5, 1_000), log_end_offset=10, high_watermark=None)
    assert d.offset == 10


@given(leader_epoch=st.integers(0, 50), leader_end=st.integers(0, 10_000),
       follower_epoch=st.integers(-1, 50), follower_end=st.integers(0, 10_000),
       leo=st.integers(0, 10_000), hw=st.none() | st.integers(0, 10_000))
def test_decision_bounds(leader_epoch: int, leader_end: int, follower_epoch: int, follower_end: int,
                         leo: int, hw: int | None) -> None:
    follower = UNDEF if follower_epoch < 0 else EpochEndOffset(min(follower_epoch, leader_epoch), follower_end)
    d = decide_truncation(EpochEndOffset(leader_epoch, leader_end), follower, leo, hw)
    assert 0 <= d.offset <= leo
    if d.completed:
        assert d.offset <= leader_end
    else:  # progress: the next epoch asked is strictly smaller than the leader's answer
        assert d.next_epoch is not None and d.next_epoch < leader_epoch


def test_out_of_range_cases() -> None:
    assert decide_out_of_range(100, 80, 0).action is OutOfRangeAction.TRUNCATE_TO
    assert decide_out_of_range(100, 80, 0).offset == 80
    d = decide_out_of_range(100, 500, 300)
    assert (d.action, d.offset) == (OutOfRangeAction.TRUNCATE_FULLY, 300)
    d = decide_out_of_range(100, 500, 50)
    assert (d.action, d.offset) == (OutOfRangeAction.RETRY, 100)


def test_lag_never_negative() -> None:
    assert fetch_lag(10, 20) == 0
    assert fetch_lag(30, 20) == 10


def test_partition_states_rotate() -> None:
    states = PartitionStates()
    a, b, c = (TopicPartition("t", i) for i in range(3))
    for tp in (a, b, c):
        states.set(tp, PartitionFetchState.initial(0, 1, None))
    states.update_and_move_to_end(a, PartitionFetchState.initial(5, 1, None))
    assert states.tps() == [b, c, a]
    states.set(b, PartitionFetchState.initial(7, 1, None))
    assert states.tps() == [b, c, a]
    assert states.remove(c) is not None and c not in states
    states.set(a, PartitionFetchState.initial(5, 1, None).parked(50))
    assert states.next_wakeup_ms(10) == 50 and states.next_wakeup_ms(60) is None


def test_leader_end_offset_without_epoch_keeps_only_what_lies_below_it() -> None:
    # the broker's diverging_epoch when the leader has no epoch <= ours: {epoch: -1, end_offset: log start}
    d = decide_truncation(EpochEndOffset(-1, 40), UNDEF, log_end_offset=100, high_watermark=90)
    assert (d.offset, d.completed) == (40, True)
