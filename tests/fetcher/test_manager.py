"""ReplicaFetcherManager: task placement, on-demand creation, idle shutdown."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.clock import SystemClock
from common.config import broker_config
from common.errors import ErrorCode
from common.wire import TopicPartition
from fetcher.api import BrokerEndpoint, InitialFetchState
from fetcher.endpoint import EpochAnswer, EpochRequest, FetchRequest, FetchResponse, OffsetAnswer
from fetcher.manager import ReplicaFetcherManager, fetcher_id_for
from fetcher.state import EpochEndOffset

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
