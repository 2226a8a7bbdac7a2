"""Table-driven tests of the pure controller rules."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.wire import topic_name_error
from controller import rules
from controller.rules import AlterIsrRequest, IsrCheck, PartitionView


@pytest.mark.parametrize(
    ("replicas", "isr", "live", "unclean", "leader", "new_isr", "was_unclean"),
    [
        ((1, 2, 3), (1, 2, 3), {1, 2, 3}, False, 1, (1, 2, 3), False),
        ((1, 2, 3), (1, 2, 3), {2, 3}, False, 2, (1, 2, 3), False),  # first live in assignment order
        ((1, 2, 3), (3, 2), {2, 3}, False, 2, (3, 2), False),  # assignment order, not ISR order
        ((1, 2, 3), (1,), {2, 3}, False, -1, (1,), False),  # no live ISR member: offline, ISR kept
        ((1, 2, 3), (1,), {2, 3}, True, 2, (2,), True),  # unclean: first live replica, ISR = it
        ((1, 2, 3), (1,), set(), True, -1, (1,), False),  # nobody live at all
        ((1, 2, 3), (2,), {1, 2}, True, 2, (2,), False),  # clean choice preferred over unclean
        ((), (), {1}, True, -1, (), False),
    ],
)
def test_elect_leader(replicas: tuple[int, ...], isr: tuple[int, ...], live: set[int], unclean: bool,
                      leader: int, new_isr: tuple[int, ...], was_unclean: bool) -> None:
    e = rules.elect_leader(replicas, isr, live, unclean_enabled=unclean)
    assert (e.leader, e.isr, e.unclean) == (leader, new_isr, was_unclean)
    assert e.offline == (leader == -1)


@pytest.mark.parametrize(
    ("replicas", "isr", "broker", "live", "leader", "unclean", "new_leader", "new_isr"),
    [
        ((1, 2, 3), (1, 2, 3), 3, {1, 2}, 1, False, 1, (1, 2)),  # follower leaves; leader stays
        ((1, 2, 3), (1, 2, 3), 1, {2, 3}, 1, False, 2, (2, 3)),  # leader leaves; next in order leads
        ((1, 2, 3), (1,), 1, {2, 3}, 1, False, -1, (1,)),  # last ISR member stays; offline
        ((1, 2, 3), (1,), 1, {2, 3}, 1, True, 2, (2,)),  # ... unless unclean election
        ((1, 2), (2,), 1, {2}, 2, False, 2, (2,)),  # not in ISR: nothing changes
        ((1, 2, 3), (2, 3), 3, {1, 2}, -1, False, 2, (2,)),  # offline partition gets a leader
    ],
)
def test_remove_from_isr(replicas: tuple[int, ...], isr: tuple[int, ...], broker: int, live: set[int],
                         leader: int, unclean: bool, new_leader: int, new_isr: tuple[int, ...]) -> None:
    e = rules.remove_from_isr(replicas, isr, broker, live, current_leader=leader, unclean_enabled=unclean)
    assert (e.leader, e.isr) == (new_leader, new_isr)
    assert e.isr, "an ISR never becomes empty"


def test_assignment_matches_kafka_example() -> None:
    # Kafka's AdminUtils doc example: 5 brokers, 10 partitions, rf 3, start index 0, shift 0
    got = rules.assign_replicas(10, 3, [0, 1, 2, 3, 4], start_index=0, replica_shift=0)
    assert got[:5] == [(0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 0), (4, 0, 1)]
    assert got[5:] == [(0, 2, 3), (1, 3, 4), (2, 4, 0), (3, 0, 1), (4, 1, 2)]


@given(n_brokers=st.integers(1, 7), rf=st.integers(1, 7), parts=st.integers(1, 40),
       start=st.integers(0, 100), shift=st.integers(0, 100))
def test_assignment_spreads_evenly(n_brokers: int, rf: int, parts: int, start: int, shift: int) -> None:
    brokers = list(range(10, 10 + n_brokers))
    if rf > n_brokers:
        with pytest.raises(ValueError):
            rules.assign_replicas(parts, rf, brokers, start_index=start, replica_shift=shift)
        return
    got = rules.assign_replicas(parts, rf, brokers, start_index=start, replica_shift=shift)
    assert len(got) == parts
    for replicas in got:
        assert len(set(replicas)) == rf and set(replicas) <= set(brokers)
    leaders = Counter(r[0] for r in got)
    counts = [leaders.get(b, 0) for b in brokers]
    assert max(counts) - min(counts) <= 1, "preferred leaders spread evenly"
    load = Counter(b for r in got for b in r)
    per = [load.get(b, 0) for b in brokers]
    assert max(per) - min(per) <= max(1, rf), "replicas spread evenly"


@pytest.mark.parametrize(
    ("name", "ok"),
    [("orders", True), ("a.b_c-D9", True), ("", False), (".", False), ("..", False), ("a/b", False),
     ("x" * 249, True), ("x" * 250, False), ("héllo", False), ("abc\n", False), (5, False), (None, False)],
)
def test_topic_names(name: object, ok: bool) -> None:
    assert (topic_name_error(name) is None) == ok


PART = PartitionView(replicas=(1, 2, 3), isr=(1, 2), leader=1, leader_epoch=5, partition_epoch=7)


@pytest.mark.parametrize(
    ("req", "eligible", "epochs", "expected"),
    [
        (AlterIsrRequest(1, 5, 7, (1, 2, 3), {3: 30}), {1, 2, 3}, {3: 30}, IsrCheck.OK),
        (AlterIsrRequest(1, 5, 7, (1,), {}), {1}, {}, IsrCheck.OK),  # shrink needs no eligibility
        (AlterIsrRequest(2, 5, 7, (1, 2), {}), {1, 2, 3}, {}, IsrCheck.NOT_LEADER_OR_FOLLOWER),
        (AlterIsrRequest(1, 4, 7, (1, 2), {}), {1, 2, 3}, {}, IsrCheck.FENCED_LEADER_EPOCH),
        (AlterIsrRequest(1, 6, 7, (1, 2), {}), {1, 2, 3}, {}, IsrCheck.FENCED_LEADER_EPOCH),
        (AlterIsrRequest(1, 5, 6, (1, 2, 3), {}), {1, 2, 3}, {}, IsrCheck.INVALID_UPDATE_VERSION),
        (AlterIsrRequest(1, 5, 6, (2, 1), {}), {1, 2, 3}, {}, IsrCheck.OK),  # a resend of an applied change
        # a partition epoch ahead of the controller's is no version it ever gave out: refused like a stale one
        (AlterIsrRequest(1, 5, 9, (1, 2, 3), {3: 30}), {1, 2, 3}, {3: 30}, IsrCheck.INVALID_UPDATE_VERSION),
        (AlterIsrRequest(1, 5, 6, (1, 2, 2), {}), {1, 2, 3}, {}, IsrCheck.INVALID_UPDATE_VERSION),
        (AlterIsrRequest(1, 5, 7, (1, 2, 3), {3: 30}), {1, 2}, {3: 30}, IsrCheck.INELIGIBLE_REPLICA),  # fenced
        (AlterIsrRequest(1, 5, 7, (1, 2, 3), {3: 29}), {1, 2, 3}, {3: 30}, IsrCheck.INELIGIBLE_REPLICA),  # stale
        (AlterIsrRequest(1, 5, 7, (1, 2, 4), {}), {1, 2, 3, 4}, {}, IsrCheck.INVALID_REQUEST),  # not a replica
        (AlterIsrRequest(1, 5, 7, (2,), {}), {1, 2, 3}, {}, IsrCheck.INVALID_REQUEST),  # leader left out
        (AlterIsrRequest(1, 5, 7, (), {}), {1, 2, 3}, {}, IsrCheck.INVALID_REQUEST),
        (AlterIsrRequest(1, 5, 7, (1, 1), {}), {1, 2, 3}, {}, IsrCheck.INVALID_REQUEST),
    ],
)
def test_check_alter_isr(req: AlterIsrRequest, eligible: set[int], epochs: dict[int, int],
                         expected: IsrCheck) -> None:
    assert rules.check_alter_isr(req, PART, eligible=eligible, broker_epochs=epochs) is expected


def test_preferred_imbalance_and_election() -> None:
    pairs = [(1, 1), (1, 2), (2, 2), (2, 2), (3, 1)]
    imb = rules.preferred_imbalance(pairs)
    assert imb == {1: 0.5, 2: 0.0, 3: 1.0}
    assert rules.brokers_over_imbalance(imb, 10) == {1, 3}
    assert rules.brokers_over_imbalance(imb, 50) == {3}
    assert rules.preferred_election((1, 2), (1, 2), 2, {1, 2}) == 1
    assert rules.preferred_election((1, 2), (2,), 2, {1, 2}) is None  # preferred not in ISR
    assert rules.preferred_election((1, 2), (1, 2), 2, {2}) is None  # preferred not live
    assert rules.preferred_election((1, 2), (1, 2), 1, {1, 2}) is None  # already leads


def test_expired_brokers() -> None:
    assert rules.expired_brokers({1: 0, 2: 700, 3: 1000}, 1500, 900) == [1]
    assert rules.expired_brokers({1: 0}, 900, 900) == []
