"""Fixtures: a fake controller and in-process brokers (real aiohttp servers on 127.0.0.1 port 0, real logs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.process import BrokerOptions, BrokerProcess
from common.config import broker_config
from common.http import RpcClient
from common.wire import TopicPartition
from storage.record_batch import build_batch
from tests.fake_controller import FakeController
from tests.procs import Procs

TP = TopicPartition("t", 0)


@pytest.fixture
async def controller() -> AsyncIterator[FakeController]:
    fc = await FakeController().start()
    try:
        yield fc
    finally:
        await fc.close()


@pytest.fixture
def fc(controller: FakeController) -> FakeController:
    """The fake controller, for tests that run real broker processes against it (``procs``)."""
    return controller


@pytest.fixture
async def procs(fc: FakeController) -> AsyncIterator[Procs]:
    """Real broker processes; stopped before ``fc`` and off the event loop, so that the fake controller (on
    this loop) answers the brokers' controlled shutdown: one whose controller does not answer retries it
    until controlled.shutdown.max.wait.ms."""
    p = Procs()
    try:
        yield p
    finally:
        await asyncio.to_thread(p.close)


@pytest.fixture
async def rpc() -> AsyncIterator[RpcClient]:
    client = RpcClient(timeout_s=60.0)
    try:
        yield client
    finally:
        await client.close()


StartBroker = Callable[..., Awaitable[BrokerProcess]]


@pytest.fixture
async def start_broker(tmp_path: Path, controller: FakeController) -> AsyncIterator[StartBroker]:
    started: list[BrokerProcess] = []

    async def start(node_id: int = 1, sets: dict[str, Any] | None = None, data_dir: Path | None = None,
                    register: bool = True,
                    on_dir_failure: Callable[[Path, str], None] | None = None) -> BrokerProcess:
        """An in-process broker. A data dir failure calls ``on_dir_failure`` (default: nothing; the failure
        is in ``proc.dir_failure``) where a broker process would halt: never the test runner's exit."""
        cfg = broker_config({"broker.heartbeat.interval.ms": 200, **(sets or {})})
        opts = BrokerOptions(node_id, "127.0.0.1", 0, controller.address, data_dir or tmp_path / f"b{node_id}",
                             None, cfg)
        proc = BrokerProcess(opts, on_dir_failure=on_dir_failure or _no_halt)
        await proc.start()
        started.append(proc)
        if register:
            await controller.wait_registered([node_id])
        return proc

    try:
        yield start
    finally:
        for proc in started:
            await proc.stop()


def _no_halt(data_dir: Path, error: str) -> None:
    pass


def batch(n: int = 3, size: int = 10, ts: int = 1_700_000_000_000) -> bytes:
    return build_batch([(None, bytes([65 + i % 26]) * size) for i in range(n)], timestamp_ms=ts)


def produce_body(records: bytes, *, acks: int = 1, timeout_ms: int = 30_000, tp: TopicPartition = TP
                 ) -> dict[str, Any]:
    return {"acks": acks, "timeout_ms": timeout_ms,
            "topics": [{"topic": tp.topic, "partitions": [{"partition": tp.partition, "records": records}]}]}


def fetch_body(offset: int, *, replica_id: int = -1, broker_epoch: int = -1, max_wait_ms: int = 0,
               min_bytes: int = 1, current_leader_epoch: int = -1, last_fetched_epoch: int = -1,
               tp: TopicPartition = TP, max_bytes: int = 1 << 20) -> dict[str, Any]:
    return {"replica_id": replica_id, "broker_epoch": broker_epoch, "max_wait_ms": max_wait_ms,
            "min_bytes": min_bytes, "max_bytes": max_bytes,
            "topics": [{"topic": tp.topic, "partitions": [{
                "partition": tp.partition, "fetch_offset": offset, "current_leader_epoch": current_leader_epoch,
                "last_fetched_epoch": last_fetched_epoch, "log_start_offset": 0,
                "partition_max_bytes": max_bytes}]}]}


def part(resp: dict[str, Any]) -> dict[str, Any]:
    """The single partition result of a response."""
    result: dict[str, Any] = resp["topics"][0]["partitions"][0]
    return result
