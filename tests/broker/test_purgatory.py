"""Delayed operations: keyed wake-up, exactly-once completion, expiry with an injected clock."""

from __future__ import annotations

from broker.delayed import DelayedProduce, LeaderView, ProduceWait
from broker.purgatory import DelayedOperation, Purgatory
from common.clock import ManualClock
from common.errors import ErrorCode
from common.wire import TopicPartition


class Counter(DelayedOperation[str]):
    def __init__(self, deadline_ms: int, box: dict[str, int], done: list[str]) -> None:
        super().__init__(deadline_ms, done.append)
        self.box = box

    def check(self) -> str | None:
        return "ready" if self.box["n"] >= 3 else None

    def expired_result(self) -> str:
        return "expired"


def test_completes_once_when_woken_by_key() -> None:
    clock = ManualClock()
    p = Purgatory("t", clock)
    box = {"n": 0}
    done: list[str] = []
    op = Counter(100, box, done)
    assert not p.try_complete_else_watch(op, ["a", "b"])
    assert len(p) == 1
    assert p.check_and_complete("a") == 0
    box["n"] = 3
    assert p.check_and_complete("b") == 1
    assert p.check_and_complete("a") == 0
    clock.advance(1000)
    assert p.expire_due() == 0
    assert done == ["ready"] and len(p) == 0


def test_expiry_with_clock() -> None:
    clock = ManualClock(monotonic_ms=0)
    p = Purgatory("t", clock)
    done: list[str] = []
    p.try_complete_else_watch(Counter(50, {"n": 0}, done), ["a"])
    p.try_complete_else_watch(Counter(200, {"n": 0}, done), ["a"])
    assert p.next_deadline_ms() == 50
    clock.advance(49)
    assert p.expire_due() == 0
    clock.advance(1)
    assert p.expire_due() == 1
    assert done == ["expired"] and len(p) == 1
    assert p.complete_all(lambda op: "shutdown") == 1
    assert done == ["expired", "shutdown"] and len(p) == 0


def test_completes_immediately_without_watching() -> None:
    p = Purgatory("t", ManualClock())
    done: list[str] = []
    assert p.try_complete_else_watch(Counter(10, {"n": 5}, done), ["a"])
    assert done == ["ready"] and len(p) == 0


def test_bounded_waiters() -> None:
    p = Purgatory("t", ManualClock(), max_waiting=2)
    done: list[str] = []
    for _ in range(3):
        p.try_complete_else_watch(Counter(10, {"n": 0}, done), ["a"])
    assert done == ["expired"] and len(p) == 2


TP = TopicPartition("t", 0)
TP2 = TopicPartition("t", 1)


def test_delayed_produce_answers() -> None:
    views = {TP: LeaderView(True, 3, 10, 2, 2), TP2: LeaderView(True, 3, 10, 2, 2)}
    results: list[dict[TopicPartition, ErrorCode]] = []
    op = DelayedProduce(100, {TP: ProduceWait(3, 20), TP2: ProduceWait(3, 15)}, views.get, results.append)
    assert not op.try_complete()
    views[TP2] = LeaderView(True, 3, 15, 1, 2)  # HW passed, but ISR shrank below min
    assert not op.try_complete()
    views[TP] = LeaderView(True, 4, 30, 2, 2)  # leader epoch changed: fails, never succeeds
    assert op.try_complete()
    assert results == [{TP: ErrorCode.NOT_LEADER_OR_FOLLOWER, TP2: ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND}]
    assert not op.force_complete({})


def test_delayed_produce_waits_for_the_hw_to_pass_its_last_record() -> None:
    # acks=all is answered only once the HW is past the last appended record (HW >= last offset + 1): a HW
    # one short leaves that record uncommitted, and the produce must keep waiting
    views = {TP: LeaderView(True, 3, 19, 2, 2)}  # records up to offset 19 appended; offset 19 not committed
    results: list[dict[TopicPartition, ErrorCode]] = []
    op = DelayedProduce(100, {TP: ProduceWait(3, 20)}, views.get, results.append)
    assert not op.try_complete() and results == []
    views[TP] = LeaderView(True, 3, 20, 2, 2)
    assert op.try_complete()
    assert results == [{TP: ErrorCode.NONE}]


def test_delayed_produce_expiry_keeps_known_answers() -> None:
    views = {TP: LeaderView(True, 3, 20, 2, 1), TP2: LeaderView(True, 3, 0, 2, 1)}
    results: list[dict[TopicPartition, ErrorCode]] = []
    op = DelayedProduce(100, {TP: ProduceWait(3, 20), TP2: ProduceWait(3, 15)}, views.get, results.append)
    assert not op.try_complete()
    op.force_complete(op.expired_result())
    assert results == [{TP: ErrorCode.NONE, TP2: ErrorCode.REQUEST_TIMED_OUT}]


def test_expire_completes_once_and_stops_watching_every_key() -> None:
    """The shell's per-operation timer (or a requester that went away) expires one operation."""
    p = Purgatory("t", ManualClock())
    box = {"n": 0}
    done: list[str] = []
    op = Counter(100, box, done)
    other = Counter(100, box, done)
    assert not p.try_complete_else_watch(op, ["a", "b"])
    assert not p.try_complete_else_watch(other, ["b"])
    assert p.expire(op) and len(p) == 1
    assert not p.expire(op)  # already complete: nothing more
    box["n"] = 3
    assert p.check_and_complete("a") == 0  # no longer watched there
    assert p.check_and_complete("b") == 1  # only the other one
    assert done == ["expired", "ready"] and len(p) == 0


def test_completed_by_one_key_leaves_the_count_at_once() -> None:
    p = Purgatory("t", ManualClock())
    box = {"n": 0}
    done: list[str] = []
    for _ in range(3):
        p.try_complete_else_watch(Counter(100, box, done), ["a", "b"])
    box["n"] = 3
    assert p.check_and_complete("a") == 3 and len(p) == 0
    assert p.check_and_complete("b") == 0 and done == ["ready"] * 3


def test_completed_by_one_key_stops_being_watched_under_the_others() -> None:
    """Operations completed through a busy key leave an idle key's list at once (a follower fetch over a
    busy and an idle partition would otherwise pile up under the idle one, one per fetch)."""
    p = Purgatory("t", ManualClock())
    box = {"n": 0}
    done: list[str] = []
    for _ in range(100):
        p.try_complete_else_watch(Counter(100, box, done), ["busy", "idle"])
    assert p.watch_entries() == 200
    box["n"] = 3
    assert p.check_and_complete("busy") == 100
    assert p.watch_entries() == 0 and len(p) == 0
