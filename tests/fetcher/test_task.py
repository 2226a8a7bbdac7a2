"""Step tests: ``FetcherTask.do_work()`` one step at a time against a fake leader, real follower logs."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from common.clock import ManualClock, SystemClock
from common.errors import ErrorCode
from common.wire import TopicPartition
from fetcher.api import InitialFetchState
from fetcher.endpoint import FetchPartitionData, FetchRequest, FetchResponse
from fetcher.state import EpochEndOffset, FetchStatus
from fetcher.task import FetcherConfig, FetcherTask
from storage.log import Log
from tests.fetcher.fakes import TP, FakeLeader, LocalFollower, batch, log_bytes, open_log, write

CONFIG = FetcherConfig(wait_max_ms=0, backoff_ms=1_000)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class Setup:
    def __init__(self, tmp_path: Path, clock: ManualClock, *, config: FetcherConfig = CONFIG, **leader_kw: bool):
        self.tmp_path = tmp_path
        self.clock = clock
        self.leader = FakeLeader(**leader_kw)
        self.follower = LocalFollower()
        self.task = FetcherTask(0, self.leader, self.follower, config, clock)
        self.logs: list[Log] = []

    def log(self, name: str, tp: TopicPartition = TP) -> Log:
        log = open_log(self.tmp_path, name, self.clock, tp)
        self.logs.append(log)
        return log

    def start(self, tp: TopicPartition, follower_log: Log, leader_epoch: int, hw: int = 0) -> None:
        self.follower.follow(tp, follower_log, leader_epoch, hw)
        self.task.add_partitions({tp: InitialFetchState(self.leader.broker, leader_epoch,
                                                        follower_log.log_end_offset)})

    async def converge(self, max_steps: int = 50) -> int:
        """do_work until every partition is fetching and caught up; returns the steps used."""
        for step in range(1, max_steps + 1):
            await self.task.do_work()
            if all(self._caught_up(tp) for tp in self.task.partitions()):
                return step
        raise AssertionError("did not converge")

    def _caught_up(self, tp: TopicPartition) -> bool:
        state = self.task.fetch_state(tp)
        leader = self.leader.partitions[tp].log
        return (state is not None and state.status is FetchStatus.FETCHING
                and state.fetch_offset == leader.log_end_offset)

    def close(self) -> None:
        for log in self.logs:
            log.close()


@pytest.fixture
def setup(tmp_path: Path, clock: ManualClock):  # type: ignore[no-untyped-def]
    s = Setup(tmp_path, clock)
    yield s
    s.close()


def assert_identical(follower: Log, leader: Log) -> None:
    assert follower.log_end_offset == leader.log_end_offset
    assert log_bytes(follower) == log_bytes(leader)


async def test_replicates_from_empty(setup: Setup) -> None:
    leader_log, follower_log = setup.log("leader"), setup.log("follower")
    write(leader_log, 0, 20, setup.clock)
    setup.leader.lead(TP, leader_log, 0)
    setup.start(TP, follower_log, 0)
    await setup.converge()
    assert_identical(follower_log, leader_log)
    assert follower_log.latest_epoch() == 0
    assert setup.follower.partitions[TP].high_watermark == leader_log.log_end_offset
    write(leader_log, 0, 1, setup.clock)
    await setup.converge()
    fetch = setup.leader.fetches[-1]
    sent = fetch.partitions[TP]
    assert (fetch.replica_id, fetch.broker_epoch) == (2, 7)
    assert (sent.current_leader_epoch, sent.last_fetched_epoch) == (0, 0)


async def test_kip101_scenario1_no_truncation_to_high_watermark(setup: Setup) -> None:
    """The follower restarts with HW behind its LEO; the leader still has everything: keep it all."""
    leader_log, follower_log = setup.log("leader"), setup.log("follower")
    write(leader_log, 0, 2, setup.clock)
    follower_log.append_as_follower(log_bytes(leader_log))
    setup.leader.lead(TP, leader_log, 1)
    setup.start(TP, follower_log, 1, hw=3)  # HW says 3, LEO is 6: the old rule would have cut m2
    await setup.task.do_work()
    assert follower_log.log_end_offset == 6
    assert setup.follower.truncations == []
    # the leader wrote in epoch 1 meanwhile; the follower catches up without losing anything
    write(leader_log, 1, 1, setup.clock)
    await setup.converge()
    assert_identical(follower_log, leader_log)


async def test_kip101_scenario2_divergence_is_truncated(setup: Setup) -> None:
    """Old leader A kept m2 at offset 3 (epoch 0); new leader B wrote m3 there in epoch 1."""
    a, b = setup.log("a"), setup.log("b")
    write(b, 0, 1, setup.clock)
    a.append_as_follower(log_bytes(b))
    write(a, 0, 1, setup.clock)  # A's uncommitted tail: offsets 3..5 in epoch 0
    write(b, 1, 2, setup.clock)  # B's epoch 1: offsets 3..8
    setup.leader.lead(TP, b, 1)
    setup.start(TP, a, 1, hw=6)  # even a HW above the divergence point does not keep A's tail
    await setup.converge()
    assert_identical(a, b)
    assert [(off, reason) for _, off, reason in setup.follower.truncations] == [
        (3, "offsets_for_leader_epoch:leader_epoch_end_offset")]


async def test_a_divergent_tail_of_a_single_record_is_truncated(setup: Setup) -> None:
    """As scenario 2, but the old leader's uncommitted tail is one record: the cut one below the LEO is made."""
    a, b = setup.log("a"), setup.log("b")
    write(b, 0, 1, setup.clock)
    a.append_as_follower(log_bytes(b))
    write(a, 0, 1, setup.clock, records=1)  # A's tail: offset 3 alone (epoch 0)
    write(b, 1, 2, setup.clock)  # B's epoch 1: offsets 3..8
    setup.leader.lead(TP, b, 1)
    setup.start(TP, a, 1, hw=3)
    await setup.converge()
    assert_identical(a, b)
    assert [off for _, off, _ in setup.follower.truncations] == [3]


@pytest.mark.parametrize("on_fetch", [False, True])
async def test_a_round_of_truncations_is_checkpointed_once_before_any_append(tmp_path: Path, clock: ManualClock,
                                                                               on_fetch: bool) -> None:
    """The broker writes its recovery-point checkpoint (every log's) at truncations_done: once for all the
    partitions one leader change cut, not once each (quadratic), and before anything is appended to them."""
    s = Setup(tmp_path, clock, config=FetcherConfig(wait_max_ms=0, truncate_on_fetch=on_fetch))
    try:
        tps = [TopicPartition("d", i) for i in range(3)]
        for tp in tps:
            a, b = s.log(f"a{tp.partition}", tp), s.log(f"b{tp.partition}", tp)
            write(b, 0, 1, clock)
            a.append_as_follower(log_bytes(b))
            write(a, 0, 1, clock)  # a tail the new leader never had
            write(b, 1, 2, clock)
            s.leader.lead(tp, b, 1)
            s.start(tp, a, 1)
        await s.converge()
        kinds = [kind for kind, _ in s.follower.events]
        first_append = kinds.index("appended")
        assert kinds[:first_append] == ["truncated"] * 3 + ["truncations_done"]
        assert kinds.count("truncations_done") == 1
        for tp in tps:
            assert_identical(s.follower.partitions[tp].log, s.leader.partitions[tp].log)
    finally:
        s.close()


@pytest.mark.parametrize("on_fetch", [False, True])
async def test_kip279_fast_double_failover(tmp_path: Path, clock: ManualClock, on_fetch: bool) -> None:
    """The follower's epochs (1, 3) and the leader's (1, 2, 4) differ twice: two rounds to agree.

    on_fetch: the first round comes from Fetch's diverging_epoch (KIP-320) instead of OffsetsForLeaderEpoch.
    """
    s = Setup(tmp_path, clock, config=FetcherConfig(wait_max_ms=0, truncate_on_fetch=on_fetch))
    try:
        f, ld = s.log("f"), s.log("l")
        write(ld, 1, 1, clock)                 # 0..2 e1 (common)
        f.append_as_follower(log_bytes(ld))
        write(f, 1, 1, clock)                  # f: 3..5 e1
        write(ld, 2, 1, clock)                 # l: 3..5 e2
        write(f, 3, 2, clock)                  # f: 6..11 e3
        write(ld, 4, 3, clock)                 # l: 6..14 e4
        s.leader.lead(TP, ld, 4)
        s.start(TP, f, 4)
        await s.converge()
        assert_identical(f, ld)
        assert [off for _, off, _ in s.follower.truncations] == [6, 3]
        asked = [next(iter(r.values())).leader_epoch for r in s.leader.epoch_requests]
        assert asked == ([1] if on_fetch else [3, 1])
        if on_fetch:
            assert s.follower.truncations[0][2] == "diverging_epoch:follower_lacks_leader_epoch"
    finally:
        s.close()


async def test_divergent_tail_of_unclean_leader_via_diverging_epoch(setup: Setup) -> None:
    """Fetching already: the leader changes with an unclean election; Fetch reports the divergence."""
    old, new = setup.log("old"), setup.log("new")
    write(old, 1, 2, setup.clock)
    new.append_as_follower(log_bytes(old, upto=3))  # the new leader only had 0..2
    write(old, 1, 2, setup.clock)                    # the old leader went on: 6..11 e1
    setup.leader.lead(TP, old, 1)
    setup.start(TP, new, 1)
    # swap roles by hand: 'new' leads in epoch 2 with its own writes; 'old' follows it
    setup.task.remove_partitions([TP])
    setup.leader.partitions.clear()
    write(new, 2, 1, setup.clock)                    # new: 3..5 e2
    setup.leader.lead(TP, new, 2)
    setup.follower.partitions.clear()
    setup.start(TP, old, 2)
    await setup.converge()
    assert_identical(old, new)
    assert setup.follower.truncations[0][1] == 3


async def test_leader_without_epoch_info_out_of_range_truncates_to_leader_end(tmp_path: Path,
                                                                             clock: ManualClock) -> None:
    s = Setup(tmp_path, clock, epochs=False, diverging_epoch=False)
    try:
        f, ld = s.log("f"), s.log("l")
        write(ld, 0, 2, clock)
        f.append_as_follower(log_bytes(ld))
        write(f, 0, 2, clock)  # f ends at 12, the leader at 6
        s.leader.lead(TP, ld, 0)
        s.start(TP, f, 0, hw=12)  # the follower believed all of it committed (the unclean leader lost it)
        await s.task.do_work()  # epoch answer UNDEFINED -> keep; fetch -> OUT_OF_RANGE -> leader end 6
        assert f.log_end_offset == 6
        assert s.follower.truncations[-1][2] == "out_of_range:leader_end_below_local_end"
        write(ld, 0, 1, clock)
        await s.converge()
        assert_identical(f, ld)
    finally:
        s.close()


async def test_leader_without_epoch_info_truncates_to_high_watermark(tmp_path: Path, clock: ManualClock) -> None:
    s = Setup(tmp_path, clock, epochs=False, diverging_epoch=False)
    try:
        f, ld = s.log("f"), s.log("l")
        write(ld, 0, 3, clock)
        f.append_as_follower(log_bytes(ld, upto=6))
        s.leader.lead(TP, ld, 0)
        s.start(TP, f, 0, hw=3)
        await s.task.do_work()
        assert s.follower.truncations[0][1:] == (3, "offsets_for_leader_epoch:leader_epoch_undefined_high_watermark")
        await s.converge()
        assert_identical(f, ld)
    finally:
        s.close()


async def test_follower_far_behind_leader_log_start(setup: Setup) -> None:
    f, ld = setup.log("f"), setup.log("l")
    write(ld, 0, 2, setup.clock)
    f.append_as_follower(log_bytes(ld))          # follower at 6
    ld.truncate_fully_and_start_at(1_000)        # the leader deleted everything up to 1000
    write(ld, 3, 2, setup.clock)
    setup.leader.lead(TP, ld, 3)
    setup.start(TP, f, 3)
    await setup.converge()
    assert f.log_start_offset == 1_000 and f.log_end_offset == 1_006
    assert_identical(f, ld)
    assert setup.follower.truncations[-1][1:] == (1_000, "out_of_range:leader_start_above_local_end")


async def test_response_after_partition_removed_is_not_appended(setup: Setup) -> None:
    f, ld = setup.log("f"), setup.log("l")
    write(ld, 0, 3, setup.clock)
    setup.leader.lead(TP, ld, 0)
    setup.start(TP, f, 0)
    await setup.task.do_work()  # truncation round + first fetch
    before = f.log_end_offset
    write(ld, 0, 2, setup.clock)

    async def became_leader(api: str) -> None:
        if api == "fetch":  # while the fetch is in flight: this broker becomes the leader
            setup.task.remove_partitions([TP])
            setup.follower.partitions[TP].leader_epoch = 1
            write(f, 1, 1, setup.clock)

    setup.leader.hook = became_leader
    await setup.task.do_work()
    assert f.log_end_offset == before + 3  # only its own leader write, nothing from the stale response
    assert f.latest_epoch() == 1
    assert setup.task.partitions() == []


async def test_response_after_leader_epoch_changed_is_ignored(setup: Setup) -> None:
    f, ld = setup.log("f"), setup.log("l")
    write(ld, 0, 3, setup.clock)
    setup.leader.lead(TP, ld, 0)
    setup.start(TP, f, 0)
    await setup.task.do_work()
    write(ld, 0, 1, setup.clock)
    appended_before = setup.follower.appended_calls

    async def new_epoch(api: str) -> None:
        if api == "fetch":
            setup.follower.partitions[TP].leader_epoch = 1
            setup.task.add_partitions({TP: InitialFetchState(setup.leader.broker, 1, f.log_end_offset)})
            setup.leader.hook = None

    setup.leader.hook = new_epoch
    end = f.log_end_offset
    await setup.task.do_work()
    assert f.log_end_offset == end and setup.follower.appended_calls == appended_before
    state = setup.task.fetch_state(TP)
    assert state is not None and state.current_leader_epoch == 1 and state.status is FetchStatus.TRUNCATING


def two_partitions(setup: Setup, error: ErrorCode) -> tuple[TopicPartition, TopicPartition, Log, Log, Log, Log]:
    """Partitions t-0 and t-1 of one leader, two batches each, followed from 0; t-1's answers carry ``error``."""
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    la, lb = setup.log("la", a), setup.log("lb", b)
    fa, fb = setup.log("fa", a), setup.log("fb", b)
    write(la, 0, 2, setup.clock)
    write(lb, 0, 2, setup.clock)
    setup.leader.lead(a, la, 0)
    setup.leader.lead(b, lb, 0).error = error
    setup.start(a, fa, 0)
    setup.start(b, fb, 0)
    return a, b, la, lb, fa, fb


@pytest.mark.parametrize("error", [ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                   ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                   ErrorCode.KAFKA_STORAGE_ERROR])
async def test_partition_error_parks_only_that_partition(setup: Setup, error: ErrorCode) -> None:
    _a, b, la, lb, fa, fb = two_partitions(setup, error)
    await setup.task.do_work()
    state_b = setup.task.fetch_state(b)
    assert state_b is not None and state_b.is_parked(setup.clock.monotonic_ms())
    assert fa.log_end_offset == la.log_end_offset and fb.log_end_offset == 0
    write(la, 0, 1, setup.clock)
    await setup.task.do_work()  # b stays parked, a goes on
    assert fa.log_end_offset == la.log_end_offset
    assert b not in setup.leader.fetches[-1].partitions
    setup.leader.partitions[b].error = ErrorCode.NONE
    setup.clock.advance(CONFIG.backoff_ms)
    await setup.converge()
    assert_identical(fb, lb)


async def test_fenced_epoch_in_truncation_parks_until_a_new_leader_and_isr(setup: Setup) -> None:
    f, ld = setup.log("f"), setup.log("l")
    write(ld, 0, 1, setup.clock)
    setup.leader.lead(TP, ld, 5)
    setup.start(TP, f, 4)  # our LeaderAndIsr is older than the leader's epoch
    write(f, 0, 1, setup.clock)
    await setup.task.do_work()
    state = setup.task.fetch_state(TP)
    assert state is not None and state.status is FetchStatus.TRUNCATING
    assert state.is_parked(setup.clock.monotonic_ms())
    assert f.log_end_offset == 3 and setup.follower.truncations == []
    # asking again cannot help: as Kafka's onPartitionFenced, it waits for the LeaderAndIsr it missed
    asked = len(setup.leader.epoch_requests)
    for _ in range(5):
        setup.clock.advance(CONFIG.backoff_ms)
        await setup.task.do_work()
    assert len(setup.leader.epoch_requests) == asked and setup.leader.fetches == []
    setup.follower.partitions[TP].leader_epoch = 5
    setup.task.add_partitions({TP: InitialFetchState(setup.leader.broker, 5, f.log_end_offset)})
    await setup.task.do_work()
    assert len(setup.leader.epoch_requests) == asked + 1
    state = setup.task.fetch_state(TP)
    assert state is not None and state.current_leader_epoch == 5 and not state.is_parked(setup.clock.monotonic_ms())


async def test_fenced_epoch_in_a_fetch_parks_until_a_new_leader_and_isr(setup: Setup) -> None:
    _a, b, la, lb, fa, fb = two_partitions(setup, ErrorCode.FENCED_LEADER_EPOCH)
    await setup.task.do_work()
    setup.leader.partitions[b].error = ErrorCode.NONE
    for _ in range(5):
        setup.clock.advance(CONFIG.backoff_ms)
        write(la, 0, 1, setup.clock)
        await setup.task.do_work()
        assert b not in setup.leader.fetches[-1].partitions  # a goes on, b waits
    assert fa.log_end_offset == la.log_end_offset and fb.log_end_offset == 0
    setup.follower.partitions[b].leader_epoch = 1
    setup.leader.partitions[b].leader_epoch = 1
    setup.task.add_partitions({b: InitialFetchState(setup.leader.broker, 1, 0)})
    await setup.converge()
    assert_identical(fb, lb)


async def test_connection_failure_backs_off_whole_task(setup: Setup) -> None:
    f, ld = setup.log("f"), setup.log("l")
    write(ld, 0, 2, setup.clock)
    setup.leader.lead(TP, ld, 0)
    setup.start(TP, f, 0)
    setup.leader.down = True
    result = await setup.task.do_work()
    assert result.backed_off and setup.task.stats.backoffs == 1
    setup.leader.down = False
    result = await setup.task.do_work()  # still within the backoff: nothing sent
    assert result.backed_off and not result.sent
    setup.clock.advance(CONFIG.backoff_ms)
    await setup.converge()
    assert_identical(f, ld)


async def test_partitions_rotate_so_none_starves(tmp_path: Path, clock: ManualClock) -> None:
    """A response budget that fits one partition's data: every partition still progresses."""
    s = Setup(tmp_path, clock, config=FetcherConfig(wait_max_ms=0, response_max_bytes=1, partition_max_bytes=1))
    try:
        tps = [TopicPartition("r", i) for i in range(3)]
        for tp in tps:
            ld, f = s.log(f"l{tp.partition}", tp), s.log(f"f{tp.partition}", tp)
            write(ld, 0, 4, clock)
            s.leader.lead(tp, ld, 0)
            s.start(tp, f, 0)
        for _ in range(6):
            await s.task.do_work()
        ends = [s.follower.partitions[tp].log.log_end_offset for tp in tps]
        assert all(end > 0 for end in ends), ends
        await s.converge(max_steps=40)
        for tp in tps:
            assert_identical(s.follower.partitions[tp].log, s.leader.partitions[tp].log)
    finally:
        s.close()


async def test_follows_leader_log_start_offset(setup: Setup) -> None:
    f, ld = setup.log("f"), setup.log("l")
    write(ld, 0, 4, setup.clock)
    setup.leader.lead(TP, ld, 0)
    setup.start(TP, f, 0)
    await setup.converge()
    ld.maybe_increment_log_start_offset(6)
    write(ld, 0, 1, setup.clock)
    setup.leader.partitions[TP].high_watermark = ld.log_end_offset
    await setup.converge()
    assert f.log_start_offset == 6


async def test_answers_without_records_still_move_high_watermark_and_log_start(setup: Setup) -> None:
    """An answer with nothing new for a partition costs no bookkeeping; a new HW or log start is still applied."""
    f, ld = setup.log("f"), setup.log("l")
    write(ld, 0, 4, setup.clock)
    lp = setup.leader.lead(TP, ld, 0)
    lp.high_watermark = 3
    setup.start(TP, f, 0)
    await setup.converge()
    follower = setup.follower.partitions[TP]
    assert follower.high_watermark == 3 and f.log_end_offset == ld.log_end_offset
    calls = setup.follower.appended_calls
    await setup.task.do_work()
    assert setup.follower.appended_calls == calls
    lp.high_watermark = ld.log_end_offset
    await setup.task.do_work()
    assert follower.high_watermark == ld.log_end_offset
    ld.maybe_increment_log_start_offset(6)
    await setup.task.do_work()
    assert f.log_start_offset == 6
    state = setup.task.fetch_state(TP)
    assert state is not None and state.lag == 0


async def a_replicated_b_idle(setup: Setup) -> tuple[TopicPartition, TopicPartition, Log, Log, Log, Log]:
    """Partition a replicated and caught up; b's logs exist, nobody leads or follows it yet."""
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    la, lb, fa, fb = setup.log("la", a), setup.log("lb", b), setup.log("fa", a), setup.log("fb", b)
    write(la, 0, 1, setup.clock)
    setup.leader.lead(a, la, 0)
    setup.start(a, fa, 0)
    await setup.converge()
    return a, b, la, lb, fa, fb


async def test_adding_a_partition_interrupts_a_long_polling_fetch(setup: Setup) -> None:
    """A broker that just became follower does not wait for the fetch in flight (replica.fetch.wait.max.ms)."""
    a, b, _la, lb, _fa, fb = await a_replicated_b_idle(setup)
    write(lb, 0, 2, setup.clock)
    setup.leader.lead(b, lb, 0)

    async def long_poll(api: str) -> None:
        if api == "fetch" and b not in setup.leader.fetches[-1].partitions:
            await asyncio.sleep(3600)  # a leader with nothing new for a: it would hold the fetch

    setup.leader.hook = long_poll
    step = asyncio.create_task(setup.task.do_work())
    for _ in range(10):
        await asyncio.sleep(0)
    assert not step.done()
    setup.start(b, fb, 0)
    result = await asyncio.wait_for(step, 10)
    assert result.fetch_requests == 1 and setup.task.stats.fetches_interrupted == 1
    await setup.task.do_work()  # truncation round for b, then one fetch for both
    assert_identical(fb, lb)
    assert set(setup.leader.fetches[-1].partitions) == {a, b}


async def test_stop_during_a_long_polling_fetch_ends_the_task(setup: Setup) -> None:
    """The fetch in flight is the task's own await: stopping cancels it and is never taken for an interruption."""
    a = TopicPartition("t", 0)
    la, fa = setup.log("la", a), setup.log("fa", a)
    write(la, 0, 1, setup.clock)
    setup.leader.lead(a, la, 0)
    setup.start(a, fa, 0)
    await setup.converge()
    polling = asyncio.Event()

    async def long_poll(api: str) -> None:
        if api == "fetch":
            polling.set()
            await asyncio.sleep(3600)

    setup.leader.hook = long_poll
    setup.task.start()
    await asyncio.wait_for(polling.wait(), 10)
    await asyncio.wait_for(setup.task.stop(), 10)
    assert not setup.task.running and setup.task.stats.fetches_interrupted == 0


async def test_a_partition_added_after_the_answer_arrived_keeps_the_answer(setup: Setup) -> None:
    """Only a fetch still in flight is abandoned; an answer that is already there is applied (the new
    partition is not in it, and its own state decides what the next step does)."""
    _a, b, la, lb, fa, fb = await a_replicated_b_idle(setup)
    write(la, 1, 2, setup.clock)
    setup.leader.lead(b, lb, 0)

    async def add_once_answered(api: str) -> None:
        if api == "fetch":  # the fake answers right after this hook: the add runs once the answer is there
            setup.leader.hook = None
            asyncio.get_running_loop().call_soon(setup.start, b, fb, 0)

    setup.leader.hook = add_once_answered
    result = await asyncio.wait_for(setup.task.do_work(), 10)
    assert result.fetch_requests == 1 and setup.task.stats.fetches_interrupted == 0
    assert b in setup.task.partitions()
    assert fa.log_end_offset == la.log_end_offset


class CorruptingLeader(FakeLeader):
    """Flips one byte inside the records of every answer while ``corrupt`` is set."""

    corrupt = True

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        response = await super().fetch(request)
        if not self.corrupt:
            return response
        parts = {}
        for tp, data in response.partitions.items():
            if data.records:
                raw = bytearray(data.records)
                raw[-1] ^= 0xFF
                data = replace(data, records=bytes(raw))
            parts[tp] = data
        return FetchResponse(response.error, parts)


def _partition_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("fetcher_partition_failed")]


async def test_corrupt_data_parks_the_partition_and_appends_nothing(tmp_path: Path, clock: ManualClock,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    s = Setup(tmp_path, clock)
    s.leader = CorruptingLeader()
    s.task = FetcherTask(0, s.leader, s.follower, CONFIG, clock)
    try:
        f, ld = s.log("f"), s.log("l")
        write(ld, 0, 2, clock)
        s.leader.lead(TP, ld, 0)
        s.start(TP, f, 0)
        await s.task.do_work()
        state = s.task.fetch_state(TP)
        assert f.log_end_offset == 0 and state is not None and state.is_parked(clock.monotonic_ms())
        assert s.task.stats.partition_errors == 1
        # the leader's data is bad: a warning that says so, not an error with a traceback (one every retry)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        s.leader.corrupt = False
        clock.advance(CONFIG.backoff_ms)
        await s.converge()
        assert_identical(f, ld)
    finally:
        s.close()


async def test_removed_while_epoch_request_in_flight_is_not_truncated(setup: Setup) -> None:
    f, ld = setup.log("f"), setup.log("l")
    write(ld, 0, 1, setup.clock)
    f.append_as_follower(log_bytes(ld))
    write(f, 0, 2, setup.clock)  # a tail the leader does not have
    write(ld, 1, 1, setup.clock)
    setup.leader.lead(TP, ld, 1)
    setup.start(TP, f, 1)

    async def removed(api: str) -> None:
        if api == "offsets_for_leader_epoch":
            setup.task.remove_partitions([TP])

    setup.leader.hook = removed
    end = f.log_end_offset
    await setup.task.do_work()
    assert f.log_end_offset == end and setup.follower.truncations == []
    assert setup.leader.fetches == []


class FailingFollower(LocalFollower):
    fail = True

    def on_follower_appended(self, tp: TopicPartition, leader_high_watermark: int,
                             leader_log_start_offset: int) -> None:
        if self.fail:
            raise RuntimeError("broker-side bookkeeping failed")
        super().on_follower_appended(tp, leader_high_watermark, leader_log_start_offset)


async def test_run_loop_survives_a_failing_partition(tmp_path: Path) -> None:
    """Nothing but removal ends the task: the failing partition is parked, the other one goes on."""
    clock = SystemClock()
    leader, follower = FakeLeader(), FailingFollower()
    task = FetcherTask(0, leader, follower, FetcherConfig(wait_max_ms=0, backoff_ms=20), clock)
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    logs = [open_log(tmp_path, n, ManualClock(), tp) for n, tp in (("la", a), ("lb", b), ("fa", a), ("fb", b))]
    la, lb, fa, fb = logs
    try:
        write(la, 0, 2, ManualClock())
        write(lb, 0, 2, ManualClock())
        leader.lead(a, la, 0)
        leader.lead(b, lb, 0)
        follower.follow(a, fa, 0)
        follower.follow(b, fb, 0)
        task.add_partitions({tp: InitialFetchState(leader.broker, 0, 0) for tp in (a, b)})
        task.start()
        for _ in range(3000):  # bounded: 30 s on a loaded machine
            if task.stats.partition_errors >= 2:
                break
            await asyncio.sleep(0.01)
        assert task.running and task.stats.partition_errors >= 2
        follower.fail = False
        for _ in range(3000):  # bounded: 30 s on a loaded machine
            if fa.log_end_offset == la.log_end_offset and fb.log_end_offset == lb.log_end_offset:
                break
            await asyncio.sleep(0.01)
        assert_identical(fa, la)
        assert_identical(fb, lb)
        assert task.running
    finally:
        await task.stop()
        for log in logs:
            log.close()
    assert not task.running and leader.closed


async def test_metrics_in_the_given_registry(tmp_path: Path, clock: ManualClock) -> None:
    registry = CollectorRegistry()
    s = Setup(tmp_path, clock)
    s.task = FetcherTask(0, s.leader, s.follower, CONFIG, clock, registry=registry)
    try:
        f, ld = s.log("f"), s.log("l")
        write(ld, 0, 2, clock)
        s.leader.lead(TP, ld, 0)
        s.start(TP, f, 0)
        await s.converge()
        labels = {"broker_id": "2", "leader": "1", "fetcher": "0"}
        assert (registry.get_sample_value("minibroker_fetcher_requests_total", labels) or 0) >= 1
        assert registry.get_sample_value("minibroker_fetcher_bytes_total", labels) == len(log_bytes(ld))
        lag = {"broker_id": "2", "topic": "t", "partition": "0"}
        assert registry.get_sample_value("minibroker_fetcher_partition_lag", lag) == 0
        s.task.remove_partitions([TP])
        assert registry.get_sample_value("minibroker_fetcher_partition_lag", lag) is None
    finally:
        s.close()


@pytest.mark.parametrize("on_fetch", [False, True])
async def test_leader_deposed_before_writing_keeps_no_phantom_epoch(tmp_path: Path, clock: ManualClock,
                                                                    on_fetch: bool) -> None:
    """A became leader in epoch 1 (recording (1, LEO)) but wrote nothing; B leads epoch 2. A's empty epoch
    must not stay its 'last fetched epoch' (the leader would report a divergence forever)."""
    s = Setup(tmp_path, clock, config=FetcherConfig(wait_max_ms=0, truncate_on_fetch=on_fetch))
    try:
        a, b = s.log("a"), s.log("b")
        write(b, 0, 1, clock)
        a.append_as_follower(log_bytes(b))
        a.maybe_assign_epoch_start_offset(1, a.log_end_offset)  # leader in epoch 1, no writes
        b.maybe_assign_epoch_start_offset(2, b.log_end_offset)
        write(b, 2, 2, clock)
        s.leader.lead(TP, b, 2)
        s.start(TP, a, 2)
        steps = await s.converge(max_steps=5)
        assert steps <= 2
        assert_identical(a, b)
        assert a.latest_epoch() == 2 and s.follower.truncations == []
    finally:
        s.close()


class InsistingLeader(FakeLeader):
    """A buggy leader: every Fetch answers a diverging epoch that truncates nothing."""

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        parts = {tp: FetchPartitionData(ErrorCode.NONE, high_watermark=0, log_start_offset=0,
                                        diverging_epoch=EpochEndOffset(max(p.last_fetched_epoch, 0),
                                                                       p.fetch_offset + 100))
                 for tp, p in request.partitions.items()}
        self.fetches.append(request)
        return FetchResponse(ErrorCode.NONE, parts)


async def test_a_diverging_epoch_that_changes_nothing_parks_instead_of_spinning(tmp_path: Path,
                                                                                clock: ManualClock) -> None:
    s = Setup(tmp_path, clock)
    s.leader = InsistingLeader()
    s.task = FetcherTask(0, s.leader, s.follower, CONFIG, clock)
    try:
        f, ld = s.log("f"), s.log("l")
        write(ld, 0, 2, clock)
        f.append_as_follower(log_bytes(ld))
        s.leader.lead(TP, ld, 0)
        s.start(TP, f, 0)
        for _ in range(5):
            await s.task.do_work()
        state = s.task.fetch_state(TP)
        assert state is not None and state.is_parked(clock.monotonic_ms())
        assert len(s.leader.fetches) == 1 and f.log_end_offset == 6
    finally:
        s.close()


async def test_batch_bounds_that_disagree_park_and_recheck_epochs(setup: Setup,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The leader's batch holding our LEO starts below it: nothing is appended, the epochs are re-checked."""
    caplog.set_level(logging.INFO)
    f, ld = setup.log("f"), setup.log("l")
    ld.append_as_leader(batch(3, setup.clock), 0)  # leader: one batch 0..2
    f.append_as_leader(batch(2, setup.clock), 0)   # follower: one batch 0..1 (cannot happen with sane peers)
    setup.leader.lead(TP, ld, 0)
    setup.start(TP, f, 0)
    await setup.task.do_work()
    state = setup.task.fetch_state(TP)
    assert f.log_end_offset == 2
    assert state is not None and state.status is FetchStatus.TRUNCATING and state.is_parked(setup.clock.monotonic_ms())
    [failure] = _partition_failures(caplog)
    assert failure.levelno == logging.WARNING and failure.exc_info is None
    assert "OffsetMismatchError" in failure.getMessage()


async def test_a_log_that_fails_during_truncation_parks_only_its_partition(setup: Setup) -> None:
    """A follower log whose truncation fails (an I/O error) used to fail the whole step before the fetch,
    every step: no partition of this leader replicated again. Now it is parked alone (Kafka's
    truncateToEpochEndOffsets marks it failed) and the others are fetched."""
    import os

    broken, healthy = TopicPartition("a", 0), TopicPartition("b", 0)
    la, fa = setup.log("leader", broken), setup.log("follower", broken)
    lb, fb = setup.log("leader", healthy), setup.log("follower", healthy)
    write(la, 0, 1, setup.clock)
    fa.append_as_follower(log_bytes(la))
    write(fa, 0, 2, setup.clock)  # a tail the leader never had: the follower must truncate
    write(la, 1, 2, setup.clock)
    # the segment's descriptor now refers to a write-only /dev/null: reading it to find the cut fails
    write_only = os.open(os.devnull, os.O_WRONLY)
    os.dup2(write_only, fa.segments[-1].fd)
    os.close(write_only)
    write(lb, 0, 10, setup.clock)
    setup.leader.lead(broken, la, 1)
    setup.leader.lead(healthy, lb, 0)
    setup.start(broken, fa, 1)
    setup.start(healthy, fb, 0)
    for _ in range(5):
        await setup.task.do_work()
        setup.clock.advance(2_000)  # past the backoff of anything parked
    assert_identical(fb, lb)
    state = setup.task.fetch_state(broken)
    assert state is not None and state.status is FetchStatus.TRUNCATING
    assert setup.follower.truncations == [] and setup.task.stats.partition_errors >= 1


def _diverged(s: Setup, tp: TopicPartition) -> None:
    """``tp`` follows a leader whose epoch 1 replaced the follower's uncommitted epoch-0 tail (one truncation)."""
    leader, follower = s.log(f"l{tp.partition}", tp), s.log(f"f{tp.partition}", tp)
    write(leader, 0, 1, s.clock)
    follower.append_as_follower(log_bytes(leader))
    write(follower, 0, 1, s.clock)
    write(leader, 1, 2, s.clock)
    s.leader.lead(tp, leader, 1)
    s.start(tp, follower, 1)


async def test_a_partition_leaving_the_task_takes_its_truncation_series_along(tmp_path: Path,
                                                                              clock: ManualClock) -> None:
    """Kafka removes a partition's fetcher metrics when it leaves the fetcher: the truncation counter of a
    deleted or moved partition must not stay in /metrics forever (the lag gauge already went)."""
    registry = CollectorRegistry()
    s = Setup(tmp_path, clock)
    s.task = FetcherTask(0, s.leader, s.follower, CONFIG, clock, registry=registry)
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    try:
        _diverged(s, a)
        _diverged(s, b)
        await s.converge()

        def truncations(tp: TopicPartition) -> float | None:
            return registry.get_sample_value("minibroker_fetcher_truncations_total", {
                "broker_id": "2", "topic": tp.topic, "partition": str(tp.partition),
                "reason": "leader_epoch_end_offset"})

        def lag(tp: TopicPartition) -> float | None:
            return registry.get_sample_value("minibroker_fetcher_partition_lag", {
                "broker_id": "2", "topic": tp.topic, "partition": str(tp.partition)})

        assert (truncations(a), truncations(b), lag(a), lag(b)) == (1, 1, 0, 0)
        s.task.remove_partitions([a])
        assert (truncations(a), lag(a)) == (None, None)
        assert (truncations(b), lag(b)) == (1, 0)  # the other partition's stay
        await s.task.stop()  # a stopping task takes along the partitions it still had
        assert (truncations(b), lag(b)) == (None, None)
    finally:
        s.close()


async def test_a_stopped_task_leaves_no_series_of_its_own(tmp_path: Path, clock: ManualClock) -> None:
    """Kafka removes a fetcher thread's metrics when it shuts down: no frozen series of an old leader's
    fetcher. Another task's series in the same registry stay."""
    registry = CollectorRegistry()
    s = Setup(tmp_path, clock)
    s.task = FetcherTask(0, s.leader, s.follower, CONFIG, clock, registry=registry)
    other_leader = FakeLeader(3)
    other = FetcherTask(0, other_leader, s.follower, CONFIG, clock, registry=registry)
    mine = {"broker_id": "2", "leader": "1", "fetcher": "0"}
    theirs = {"broker_id": "2", "leader": "3", "fetcher": "0"}
    error = {**mine, "error": "KAFKA_STORAGE_ERROR"}
    try:
        f, ld = s.log("f"), s.log("l")
        write(ld, 0, 2, clock)
        s.leader.lead(TP, ld, 0)
        s.start(TP, f, 0)
        await s.converge()
        s.leader.partitions[TP].error = ErrorCode.KAFKA_STORAGE_ERROR
        await s.task.do_work()  # the partition is parked after an error
        clock.advance(CONFIG.backoff_ms)
        s.leader.down = True
        assert (await s.task.do_work()).backed_off  # and the whole task backs off
        assert (registry.get_sample_value("minibroker_fetcher_requests_total", mine) or 0) >= 1
        assert registry.get_sample_value("minibroker_fetcher_bytes_total", mine) == len(log_bytes(ld))
        assert registry.get_sample_value("minibroker_fetcher_partition_errors_total", error) == 1
        assert registry.get_sample_value("minibroker_fetcher_backoffs_total", mine) == 1
        assert registry.get_sample_value("minibroker_fetcher_requests_total", theirs) == 0

        await s.task.stop()
        for name in ("requests", "bytes", "backoffs"):
            assert registry.get_sample_value(f"minibroker_fetcher_{name}_total", mine) is None, name
        assert registry.get_sample_value("minibroker_fetcher_partition_errors_total", error) is None
        assert [sample for metric in registry.collect() for sample in metric.samples
                if sample.labels.get("leader") == "1"] == []
        assert registry.get_sample_value("minibroker_fetcher_requests_total", theirs) == 0
        await s.task.stop()  # a second stop is harmless
        await other.stop()
        assert registry.get_sample_value("minibroker_fetcher_requests_total", theirs) is None
    finally:
        s.close()
