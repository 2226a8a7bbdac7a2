"""Pure partition logic: HW math, follower caught-up tracking, ISR eligibility and changes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker import partition_state as ps

LAG = 10_000


def leader(isr: tuple[int, ...] = (1, 2, 3), leo: int = 100, hw: int = 100, now: int = 0) -> ps.PartitionState:
    base = ps.PartitionState(broker_id=1, high_watermark=hw)
    return ps.become_leader(base, leader_epoch=5, partition_epoch=7, isr=isr, replicas=(1, 2, 3),
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
