"""ReplicaFetcherManager: task placement, on-demand creation, idle shutdown."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from common.clock import ManualClock, SystemClock
from common.config import broker_config
from common.errors import ErrorCode
from common.wire import TopicPartition
from fetcher.api import BrokerEndpoint, InitialFetchState
from fetcher.endpoint import EpochAnswer, EpochRequest, FetchRequest, FetchResponse, OffsetAnswer
from fetcher.manager import ReplicaFetcherManager, fetcher_id_for
from fetcher.state import EpochEndOffset
from fetcher.task import FetcherConfig
from tests.fetcher.fakes import TP, FakeLeader, LocalFollower, log_bytes, open_log, write

ROOT = Path(__file__).resolve().parents[2]
L1 = BrokerEndpoint(1, "127.0.0.1", 9001)
L2 = BrokerEndpoint(2, "127.0.0.1", 9002)


class IdleLeader:
    """A leader with nothing to say (every partition answers NOT_LEADER); counts closes."""

    instances: list[IdleLeader] = []

    def __init__(self, broker: BrokerEndpoint) -> None:
        self._broker = broker
        self.closed = False
        IdleLeader.instances.append(self)

    @property
    def broker(self) -> BrokerEndpoint:
        return self._broker

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        await asyncio.sleep(0.01)
        return FetchResponse(ErrorCode.NONE, {})

    async def offsets_for_leader_epoch(self, replica_id: int, requests: Mapping[TopicPartition, EpochRequest]
                                       ) -> dict[TopicPartition, EpochAnswer]:
        await asyncio.sleep(0.01)
        return {tp: EpochAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER, EpochEndOffset(-1, -1)) for tp in requests}

    async def list_offset(self, replica_id: int, tp: TopicPartition, current_leader_epoch: int,
                          timestamp: int) -> OffsetAnswer:
        return OffsetAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)

    async def close(self) -> None:
        self.closed = True


class NoLogs:
    broker_id = 5
    broker_epoch = 1

    def follower_log(self, tp: TopicPartition, leader_epoch: int) -> Any:
        return None

    def on_follower_appended(self, tp: TopicPartition, leader_high_watermark: int,
                             leader_log_start_offset: int) -> None:
        raise AssertionError("nothing to append")

    def on_follower_truncated(self, tp: TopicPartition, offset: int, reason: str) -> None:
        raise AssertionError("nothing to truncate")


def manager(num_fetchers: int = 1) -> ReplicaFetcherManager:
    IdleLeader.instances.clear()
    config = broker_config({"num.replica.fetchers": num_fetchers, "replica.fetch.backoff.ms": 50})
    return ReplicaFetcherManager(NoLogs(), config, SystemClock(), endpoint_factory=IdleLeader)


def test_fetcher_id_is_stable_across_processes() -> None:
    tps = [TopicPartition("orders", i) for i in range(8)]
    here = [fetcher_id_for(tp, 3) for tp in tps]
    code = ("from common.wire import TopicPartition as T; from fetcher.manager import fetcher_id_for as f;"
            "print([f(T('orders', i), 3) for i in range(8)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=ROOT)
    assert out.stdout.strip() == str(here)
    assert len(set(here)) > 1  # spreads over the fetchers


async def test_one_task_per_leader_and_fetcher_id() -> None:
    m = manager(num_fetchers=2)
    tps = [TopicPartition("t", i) for i in range(6)]
    m.add_partitions({tp: InitialFetchState(L1 if tp.partition % 2 else L2, 1, 0) for tp in tps})
    keys = set(m.tasks())
    expected = {(1 if tp.partition % 2 else 2, fetcher_id_for(tp, 2)) for tp in tps}
    assert keys == expected
    for (leader, fid), task in m.tasks().items():
        assert task.leader.broker.broker_id == leader and task.fetcher_id == fid
        assert all(fetcher_id_for(tp, 2) == fid for tp in task.partitions())
    await m.shutdown()
    assert m.tasks() == {} and all(leader.closed for leader in IdleLeader.instances)


async def test_task_ends_when_its_last_partition_leaves() -> None:
    m = manager()
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    m.add_partitions({a: InitialFetchState(L1, 1, 0), b: InitialFetchState(L1, 1, 0)})
    (task,) = m.tasks().values()
    await asyncio.sleep(0.05)
    assert task.running
    m.remove_partitions([a])
    assert task.running and m.fetch_state(a) is None and m.fetch_state(b) is not None
    m.remove_partitions([b])
    await m.shutdown_idle_fetchers()
    assert not task.running and m.tasks() == {}
    assert IdleLeader.instances[0].closed
    m.add_partitions({a: InitialFetchState(L1, 2, 0)})  # on demand again: a fresh task
    (fresh,) = m.tasks().values()
    assert fresh is not task and fresh.running
    await m.shutdown()


async def test_moving_leader_moves_partition_between_tasks() -> None:
    m = manager()
    a = TopicPartition("t", 0)
    m.add_partitions({a: InitialFetchState(L1, 1, 0)})
    m.add_partitions({a: InitialFetchState(L2, 2, 0)})
    assert set(m.tasks()) == {(2, 0)}
    state = m.fetch_state(a)
    assert state is not None and state.current_leader_epoch == 2
    await m.shutdown()


async def test_leader_address_change_restarts_task_with_all_partitions() -> None:
    m = manager()
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    m.add_partitions({a: InitialFetchState(L1, 1, 0), b: InitialFetchState(L1, 1, 0)})
    moved = BrokerEndpoint(1, "127.0.0.1", 9999)
    m.add_partitions({a: InitialFetchState(moved, 2, 0)})
    (task,) = m.tasks().values()
    assert task.leader.broker == moved and set(task.partitions()) == {a, b}
    await m.shutdown()
    assert all(leader.closed for leader in IdleLeader.instances)


async def test_same_epoch_re_add_keeps_state() -> None:
    m = manager()
    a = TopicPartition("t", 0)
    m.add_partitions({a: InitialFetchState(L1, 1, 0)})
    before = m.fetch_state(a)
    m.add_partitions({a: InitialFetchState(L1, 1, 0)})
    assert m.fetch_state(a) is before
    await m.shutdown()


async def test_offline_or_self_leader_is_not_fetched() -> None:
    m = manager()
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    m.add_partitions({a: InitialFetchState(BrokerEndpoint(-1, "", 0), 1, 0),
                      b: InitialFetchState(BrokerEndpoint(5, "127.0.0.1", 9005), 1, 0)})  # 5 = this broker
    assert m.tasks() == {} and m.fetch_state(a) is None and m.fetch_state(b) is None
    await m.shutdown()


class Leaders:
    """An endpoint factory: a ``FakeLeader`` at each endpoint asked for, all leading TP from one real log,
    and the follower broker (id 2) with its real log."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = ManualClock()
        self.log = open_log(tmp_path, "leader", self.clock)
        self.follower = LocalFollower()
        self.follower_log = open_log(tmp_path, "follower", self.clock)
        self.follower.follow(TP, self.follower_log, 0)
        self.epoch = 0
        self.made: list[FakeLeader] = []

    def __call__(self, endpoint: BrokerEndpoint) -> FakeLeader:
        leader = FakeLeader(endpoint.broker_id)
        leader._broker = endpoint
        leader.lead(TP, self.log, self.epoch)
        self.made.append(leader)
        return leader

    def write(self, batches: int) -> None:
        write(self.log, self.epoch, batches, self.clock)
        for leader in self.made:
            leader.partitions[TP].high_watermark = self.log.log_end_offset

    def new_epoch(self) -> None:
        self.epoch += 1
        self.follower.partitions[TP].leader_epoch = self.epoch
        for leader in self.made:
            leader.partitions[TP].leader_epoch = self.epoch

    def caught_up(self) -> bool:
        return self.follower_log.log_end_offset == self.log.log_end_offset

    def manager(self, registry: CollectorRegistry) -> ReplicaFetcherManager:
        return ReplicaFetcherManager(self.follower, broker_config(), SystemClock(), endpoint_factory=self,
                                     fetcher_config=FetcherConfig(wait_max_ms=0, backoff_ms=50), registry=registry)

    def close(self) -> None:
        self.log.close()
        self.follower_log.close()


async def until(cond: Any, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def fetcher_series(registry: CollectorRegistry) -> list[tuple[str, dict[str, str]]]:
    return [(sample.name, sample.labels) for metric in registry.collect() for sample in metric.samples
            if sample.name.startswith("minibroker_fetcher_") and not sample.name.endswith("_created")]


LAG = {"broker_id": "2", "topic": "t", "partition": "0"}


async def test_leadership_moving_away_removes_the_old_leaders_fetcher_series(tmp_path: Path) -> None:
    """Kafka removes a fetcher thread's metrics when it shuts down: after the partition moved to leader 3,
    no frozen series of leader 1's fetcher; after the partition left, no series at all."""
    registry = CollectorRegistry()
    leaders = Leaders(tmp_path)
    m = leaders.manager(registry)
    try:
        leaders.write(2)
        m.add_partitions({TP: InitialFetchState(L1, 0, 0)})
        await until(leaders.caught_up)
        old = {"broker_id": "2", "leader": "1", "fetcher": "0"}
        assert (registry.get_sample_value("minibroker_fetcher_requests_total", old) or 0) >= 1
        leaders.new_epoch()
        m.add_partitions({TP: InitialFetchState(BrokerEndpoint(3, "127.0.0.1", 9003), leaders.epoch,
                                                leaders.follower_log.log_end_offset)})
        await m.shutdown_idle_fetchers()  # leader 1's task has stopped
        leaders.write(1)
        await until(leaders.caught_up)
        assert [labels for _, labels in fetcher_series(registry) if labels.get("leader") == "1"] == []
        new = {"broker_id": "2", "leader": "3", "fetcher": "0"}
        assert (registry.get_sample_value("minibroker_fetcher_requests_total", new) or 0) >= 1
        assert registry.get_sample_value("minibroker_fetcher_partition_lag", LAG) == 0
        m.remove_partitions([TP])
        await m.shutdown_idle_fetchers()
        assert fetcher_series(registry) == []
    finally:
        await m.shutdown()
        leaders.close()


async def test_a_task_retired_for_a_new_leader_address_stops_late_and_keeps_the_new_tasks_series(
        tmp_path: Path) -> None:
    """The leader's address changed: the manager retires the task and makes a new one with the same
    (leader, fetcher) key at once; the old task's stop runs later. It must not remove the series the new
    task updates (same labels): neither the per-task counters nor the partition's lag gauge."""
    registry = CollectorRegistry()
    leaders = Leaders(tmp_path)
    m = leaders.manager(registry)
    try:
        leaders.write(2)
        m.add_partitions({TP: InitialFetchState(L1, 0, 0)})
        await until(lambda: registry.get_sample_value("minibroker_fetcher_partition_lag", LAG) == 0)
        # The old task is held in a fetch, and its cancellation lasts until `release`.
        in_fetch, release = asyncio.Event(), asyncio.Event()

        async def slow_to_stop(api: str) -> None:
            in_fetch.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await release.wait()
                raise

        (old_leader,) = leaders.made
        (old_task,) = m.tasks().values()
        old_leader.hook = slow_to_stop
        await asyncio.wait_for(in_fetch.wait(), 30)
        moved = BrokerEndpoint(1, "127.0.0.1", 9999)
        m.add_partitions({TP: InitialFetchState(moved, 0, leaders.follower_log.log_end_offset)})
        (task,) = m.tasks().values()
        assert task is not old_task and task.leader.broker == moved and task.partitions() == [TP]
        assert old_task.partitions() == []  # out of the retired task at once, not when its stop runs
        leaders.write(1)
        await until(leaders.caught_up)  # the new task fetches while the old one is still stopping
        release.set()
        await m.shutdown_idle_fetchers()  # the old task's stop has run
        assert old_leader.closed
        assert registry.get_sample_value("minibroker_fetcher_partition_lag", LAG) == 0
        leaders.write(1)
        await until(leaders.caught_up)
        labels = {"broker_id": "2", "leader": "1", "fetcher": "0"}
        requests = registry.get_sample_value("minibroker_fetcher_requests_total", labels)
        assert requests is not None and requests >= task.stats.fetch_requests
        assert registry.get_sample_value("minibroker_fetcher_bytes_total", labels) == len(log_bytes(leaders.log))
        assert registry.get_sample_value("minibroker_fetcher_partition_lag", LAG) == 0
        await m.shutdown()
        assert fetcher_series(registry) == []
    finally:
        release.set()
        await m.shutdown()
        leaders.close()
