"""Pure partition logic: HW math, follower caught-up tracking, ISR eligibility and changes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker import partition_state as ps

LAG = 10_000


def leader(isr: tuple[int, ...] = (1, 2, 3), leo: int = 100, hw: int = 100, now: int = 0,
           replicas: tuple[int, ...] = (1, 2, 3)) -> ps.PartitionState:
    base = ps.PartitionState(broker_id=1, high_watermark=hw)
    return ps.become_leader(base, leader_epoch=5, partition_epoch=7, isr=isr, replicas=replicas,
                            leader_end_offset=leo, high_watermark=hw, now_ms=now)


def fetch(state: ps.PartitionState, broker: int, offset: int, now: int, leo: int) -> ps.PartitionState:
    return ps.update_follower(state, broker_id=broker, fetch_offset=offset, log_start_offset=0, now_ms=now,
                              leader_end_offset=leo, broker_epoch=1)


def test_new_leader_hw_waits_for_followers() -> None:
    s = leader(hw=90, leo=100)
    assert ps.compute_high_watermark(s, 120) == 90  # followers' LEOs unknown: HW holds
    s = fetch(s, 2, 110, 1, 120)
    assert ps.compute_high_watermark(s, 120) == 90
    s = fetch(s, 3, 105, 1, 120)
    assert ps.compute_high_watermark(s, 120) == 105


def test_hw_never_moves_back() -> None:
    s = leader(hw=100, leo=100)
    s = fetch(s, 2, 50, 1, 100)
    s = fetch(s, 3, 50, 1, 100)
    assert ps.advance_high_watermark(s, 100).high_watermark == 100


def test_hw_counts_pending_expansion_not_pending_shrink_removal() -> None:
    s = leader(isr=(1, 2), hw=0, leo=100)
    s = fetch(s, 2, 100, 1, 100)
    s = fetch(s, 3, 40, 1, 100)
    assert ps.compute_high_watermark(s, 100) == 100  # 3 is not in the ISR
    grow = s._replace(pending=ps.PendingIsrChange(new_isr=(1, 2, 3), is_expand=True))
    assert ps.compute_high_watermark(grow, 100) == 40  # maximal ISR includes the addition
    s2 = leader(isr=(1, 2, 3), hw=0, leo=100)
    s2 = fetch(fetch(s2, 2, 100, 1, 100), 3, 40, 1, 100)
    shrink = s2._replace(pending=ps.PendingIsrChange(new_isr=(1, 2), is_expand=False))
    assert ps.compute_high_watermark(shrink, 100) == 40  # still waits for the replica being removed


def test_expansion_needs_hw_and_epoch_start() -> None:
    s = leader(isr=(1, 2), hw=80, leo=100)  # epoch start offset = 100
    s = fetch(s, 3, 90, 1, 100)
    assert ps.expansion_candidates(s) == ()  # below the epoch start offset
    s = fetch(s, 3, 100, 2, 100)
    assert ps.expansion_candidates(s) == (3,)
    change = ps.next_isr_change(s, now_ms=2, leader_end_offset=100, replica_lag_time_max_ms=LAG)
    assert change == ps.PendingIsrChange(new_isr=(1, 2, 3), is_expand=True)
    assert ps.next_isr_change(s._replace(pending=change), now_ms=2, leader_end_offset=100,
                              replica_lag_time_max_ms=LAG) is None  # one in flight


def test_expansion_needs_everything_committed_not_just_the_epoch_start() -> None:
    # the HW moved past the epoch start: a follower one record short of the HW lacks a committed record and
    # must not join the ISR (it could be elected and lose it) until it has it
    s = leader(isr=(1, 2), hw=100, leo=100)  # epoch start offset = 100
    s = ps.advance_high_watermark(fetch(s, 2, 150, 1, 150), 150)
    assert s.high_watermark == 150
    s = fetch(s, 3, 149, 2, 150)
    assert ps.expansion_candidates(s) == ()
    s = fetch(s, 3, 150, 3, 150)
    assert ps.expansion_candidates(s) == (3,)


def test_only_one_isr_change_in_flight_even_with_more_candidates() -> None:
    # two followers could join; while the change adding the first is pending, nothing more is proposed
    s = leader(isr=(1, 2), hw=100, leo=100, replicas=(1, 2, 3, 4))
    s = fetch(fetch(s, 3, 100, 1, 100), 4, 100, 1, 100)
    change = ps.next_isr_change(s, now_ms=2, leader_end_offset=100, replica_lag_time_max_ms=LAG)
    assert change == ps.PendingIsrChange(new_isr=(1, 2, 3), is_expand=True)
    assert ps.next_isr_change(s._replace(pending=change), now_ms=2, leader_end_offset=100,
                              replica_lag_time_max_ms=LAG) is None


def test_shrink_after_lag_time_only() -> None:
    s = leader(isr=(1, 2, 3), leo=100, now=0)
    s = fetch(s, 2, 100, 100, 100)
    s = fetch(s, 3, 100, 100, 100)
    # 3 stops fetching; leader appends
    s = fetch(s, 2, 150, 5_000, 150)
    assert ps.shrink_candidates(s, now_ms=LAG, leader_end_offset=150, replica_lag_time_max_ms=LAG) == ()
    assert ps.shrink_candidates(s, now_ms=LAG + 101, leader_end_offset=150, replica_lag_time_max_ms=LAG) == (3,)
    change = ps.next_isr_change(s, now_ms=LAG + 101, leader_end_offset=150, replica_lag_time_max_ms=LAG)
    assert change == ps.PendingIsrChange(new_isr=(1, 2), is_expand=False)


def test_shrink_counts_from_the_last_catch_up_not_the_last_fetch() -> None:
    # a follower fetching every second but always behind a faster-growing leader is out of sync once the
    # lag time has passed since it last caught up, however recently it fetched
    s = leader(isr=(1, 2), leo=100, now=0)
    leo = 100
    for t in range(1, 30):
        leo += 100
        s = fetch(s, 2, leo - 150, t * 1_000, leo)
    assert ps.shrink_candidates(s, now_ms=29_500, leader_end_offset=leo, replica_lag_time_max_ms=LAG) == (2,)


def test_a_follower_at_the_leader_leo_stays_in_sync_however_long_idle() -> None:
    # nothing written: a follower holding the leader's LEO is caught up, whenever it last caught up
    s = leader(isr=(1, 2), leo=100, now=0)
    s = fetch(s, 2, 100, 1, 100)
    assert ps.shrink_candidates(s, now_ms=10 * LAG, leader_end_offset=100, replica_lag_time_max_ms=LAG) == ()


def test_a_new_leader_counts_its_isr_as_caught_up_at_election() -> None:
    # before any follower fetches, the leader appends: no ISR member is out of sync before the lag time passes
    s = leader(isr=(1, 2, 3), leo=100, now=1_000_000)
    assert ps.shrink_candidates(s, now_ms=1_000_010, leader_end_offset=120, replica_lag_time_max_ms=LAG) == ()


def test_a_new_leader_epoch_forgets_what_followers_had_fetched() -> None:
    # a follower's offset from the previous epoch may be of a log since truncated: the new epoch's HW waits
    # for it to fetch again
    s = leader(isr=(1, 2), hw=0, leo=100)
    s = fetch(s, 2, 100, 1, 100)
    again = ps.become_leader(s, leader_epoch=6, partition_epoch=8, isr=(1, 2), replicas=(1, 2, 3),
                             leader_end_offset=100, high_watermark=0, now_ms=5)
    assert ps.compute_high_watermark(again, 100) == 0
    r = again.follower(2)
    assert r is not None and r.log_end_offset == -1


def test_an_isr_only_update_keeps_the_epoch_start_offset() -> None:
    # same leader epoch, new partition epoch: the epoch still started at 100, so a follower past it (and past
    # the HW) may join although it is below the leader's LEO at the update
    s = leader(isr=(1, 2), hw=100, leo=100)
    upd = ps.become_leader(s, leader_epoch=5, partition_epoch=8, isr=(1, 2), replicas=(1, 2, 3),
                           leader_end_offset=150, high_watermark=s.high_watermark, now_ms=3)
    assert upd.leader_epoch_start_offset == 100
    upd = fetch(upd, 3, 120, 4, 150)
    assert ps.expansion_candidates(upd) == (3,)


def test_caught_up_to_previous_leader_leo_counts() -> None:
    s = leader(isr=(1, 2), leo=100, now=0)
    s = fetch(s, 2, 100, 10, 120)   # leader LEO was 120 at this fetch, follower behind
    s = fetch(s, 2, 120, 20, 140)   # reached the LEO of its previous fetch: caught up as of t=10
    r = s.follower(2)
    assert r is not None and r.last_caught_up_ms == 10


def test_commit_applies_only_same_leader_epoch() -> None:
    s = leader(isr=(1, 2))
    s = s._replace(pending=ps.PendingIsrChange((1, 2, 3), True))
    ok = ps.isr_change_committed(s, leader_epoch=5, isr=(1, 2, 3), partition_epoch=8)
    assert ok.isr == (1, 2, 3) and ok.partition_epoch == 8 and ok.pending is None
    stale = ps.isr_change_committed(s, leader_epoch=4, isr=(1, 2, 3), partition_epoch=8)
    assert stale.isr == (1, 2) and stale.pending is None


def test_commit_with_an_older_partition_epoch_is_not_applied() -> None:
    # an answer carrying an older partition epoch than the leader's: a late one, never the current ISR
    s = leader(isr=(1, 2))._replace(pending=ps.PendingIsrChange((1, 2, 3), True))
    old = ps.isr_change_committed(s, leader_epoch=5, isr=(1, 2, 3), partition_epoch=6)
    assert (old.isr, old.partition_epoch, old.pending) == ((1, 2), 7, None)


def test_follower_hw_is_the_leader_hw_within_log_start_and_leo() -> None:
    assert ps.follower_high_watermark(log_start_offset=0, log_end_offset=50, leader_high_watermark=70) == 50
    assert ps.follower_high_watermark(log_start_offset=0, log_end_offset=50, leader_high_watermark=30) == 30
    # a new leader whose HW is below the old leader's: the follower's HW follows it down, as Kafka's does
    assert ps.follower_high_watermark(log_start_offset=0, log_end_offset=50, leader_high_watermark=5) == 5
    assert ps.follower_high_watermark(log_start_offset=8, log_end_offset=50, leader_high_watermark=5) == 8


@given(st.lists(st.tuples(st.sampled_from([2, 3]), st.integers(0, 1000)), max_size=30),
       st.integers(0, 1000))
def test_hw_is_monotonic_and_bounded(fetches: list[tuple[int, int]], leo: int) -> None:
    s = leader(isr=(1, 2, 3), hw=0, leo=leo)
    last = s.high_watermark
    for t, (broker, offset) in enumerate(fetches):
        s = ps.advance_high_watermark(fetch(s, broker, min(offset, leo), t, leo), leo)
        assert last <= s.high_watermark <= leo
        for r in s.followers:
            if r.log_end_offset >= 0 and s.high_watermark > last:
                assert s.high_watermark <= r.log_end_offset
        last = s.high_watermark


def test_replica_refused_as_ineligible_is_not_proposed_again_until_a_new_broker_epoch() -> None:
    s = leader(isr=(1, 2), hw=100, leo=100)
    s = fetch(fetch(s, 2, 100, 1, 100), 3, 100, 1, 100)  # 3 fetched once (broker epoch 1), e.g. just before dying
    change = ps.next_isr_change(s, now_ms=1, leader_end_offset=100, replica_lag_time_max_ms=LAG)
    assert change is not None and change.new_isr == (1, 2, 3)
    refused = ps.isr_change_refused(s._replace(pending=change), ineligible=True)
    assert refused.pending is None and refused.ineligible == {(3, 1)}
    assert ps.next_isr_change(refused, now_ms=2, leader_end_offset=120, replica_lag_time_max_ms=LAG) is None
    # the HW no longer waits for the refused replica
    moved = ps.update_follower(refused, broker_id=2, fetch_offset=120, log_start_offset=0, now_ms=3,
                               leader_end_offset=120, broker_epoch=1)
    assert ps.compute_high_watermark(moved, 120) == 120
    # a new incarnation (new broker epoch) is a candidate again
    back = ps.update_follower(moved, broker_id=3, fetch_offset=120, log_start_offset=0, now_ms=4,
                              leader_end_offset=120, broker_epoch=2)
    assert ps.expansion_candidates(back) == (3,)
    # any other refusal only drops the pending change
    other = ps.isr_change_refused(s._replace(pending=change), ineligible=False)
    assert other.pending is None and other.ineligible == frozenset()


def test_positional_copies_equal_replace() -> None:
    """``with_followers`` / ``with_high_watermark`` list every field by position: a new field must be added there."""
    s = ps.PartitionState(broker_id=1, role=ps.Role.LEADER, leader=1, leader_epoch=4, partition_epoch=7, isr=(1, 2),
                          replicas=(1, 2, 3), high_watermark=10, leader_epoch_start_offset=3,
                          pending=ps.PendingIsrChange((1, 2, 3), True), followers=(ps.ReplicaState(2),),
                          ineligible=frozenset({(3, 9)}))
    followers = (ps.ReplicaState(2, log_end_offset=5), ps.ReplicaState(3))
    assert s.with_followers(followers) == s._replace(followers=followers)
    assert s.with_high_watermark(12) == s._replace(high_watermark=12)
    assert set(ps.PartitionState._fields) == {
        "broker_id", "role", "leader", "leader_epoch", "partition_epoch", "isr", "replicas", "high_watermark",
        "leader_epoch_start_offset", "pending", "followers", "ineligible"}
