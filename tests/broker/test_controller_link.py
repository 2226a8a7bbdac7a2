"""The broker's controller link survives a controller that answers badly, and controlled shutdown retries.

Fakes behind the controller's HTTP interface (tests/fake_controller.py, extended here): real aiohttp servers
on 127.0.0.1 port 0, brokers in-process with real logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from broker.controller_link import ControllerLink
from broker.metadata_cache import MetadataCache
from broker.metrics import BrokerMetrics
from broker.process import BrokerOptions, BrokerProcess
from broker.replica_manager import ReplicaManager
from common.clock import SystemClock
from common.config import broker_config
from storage.log_manager import LogManager
from tests.fake_controller import FakeController


@dataclass
class HtmlController(FakeController):
    """Answers every call with a 200 text/html page (a proxy's login page) while ``garbage`` is set."""

    garbage: bool = True
    garbage_calls: list[str] = field(default_factory=list)

    def _handler(self, api: str) -> Any:
        real = super()._handler(api)

        async def handle(request: web.Request) -> web.StreamResponse:
            if not self.garbage:
                return await real(request)
            await request.read()
            self.garbage_calls.append(api)
            return web.Response(text="<html>proxy login</html>", content_type="text/html")
        return handle


@dataclass
class FlakyShutdownController(FakeController):
    """Fails the first ``failing_shutdown_calls`` controlled_shutdown calls with HTTP 503."""

    failing_shutdown_calls: int = 0

    async def _controlled_shutdown(self, body: dict[str, Any]) -> dict[str, Any]:
        self.shutdown_requests.append(body)
        if len(self.shutdown_requests) <= self.failing_shutdown_calls:
            raise web.HTTPServiceUnavailable(text="controller busy (test)")
        return {"error": 0, "remaining_partitions": []}


@dataclass
class OneLostHeartbeatController(FakeController):
    """Never answers the ``lost``-th heartbeat (its answer lost on a half-open connection); notes when each
    heartbeat arrived."""

    lost: int = 3
    arrived: list[float] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def _broker_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        self.arrived.append(time.monotonic())
        if len(self.arrived) == self.lost:
            await self.release.wait()
        return await super()._broker_heartbeat(body)

    async def close(self) -> None:
        self.release.set()  # the held handler ends, so the server's shutdown does not wait for it
        await super().close()


FC = TypeVar("FC", bound=FakeController)


@contextlib.asynccontextmanager
async def running(fc: FC) -> AsyncIterator[FC]:
    await fc.start()
    try:
        yield fc
    finally:
        await fc.close()


@pytest.fixture
async def html_controller() -> AsyncIterator[HtmlController]:
    async with running(HtmlController()) as fc:
        yield fc


def broker(tmp_path: Path, controller: str, **sets: Any) -> BrokerProcess:
    cfg = broker_config({"broker.heartbeat.interval.ms": 200, **sets})
    return BrokerProcess(BrokerOptions(1, "127.0.0.1", 0, controller, tmp_path / "b1", None, cfg),
                         on_dir_failure=lambda d, e: None)


async def wait_until(what: str, cond: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)


def messages(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(event)]


async def test_a_controller_answering_html_is_retried_until_it_answers_properly(
        tmp_path: Path, html_controller: HtmlController, caplog: pytest.LogCaptureFixture) -> None:
    """A 200 text/html answer killed the link's task (msgpack's ExtraData escaped the RPC client): the broker
    never registered nor retried, and its stop crashed in ``link.close``. Now it is a failed call, logged and
    retried, and the broker registers once the controller answers."""
    fc = html_controller
    b = broker(tmp_path, fc.address)
    await b.start()
    try:
        await wait_until("three registration attempts", lambda: fc.garbage_calls.count("broker_registration") >= 3)
        assert 1 not in fc.brokers
        failed = messages(caplog, "registration_failed")
        assert len(failed) >= 3 and all("response is not msgpack" in m for m in failed)
        fc.garbage = False
        await fc.wait_registered([1])
        assert b.link is not None
        await asyncio.wait_for(b.link.registered.wait(), 20)
    finally:
        await b.stop()
    assert messages(caplog, "broker_stopped")


async def test_sigterm_while_the_controller_answers_html_stops_cleanly(
        tmp_path: Path, html_controller: HtmlController) -> None:
    b = broker(tmp_path, html_controller.address)
    await b.start()
    await wait_until("a registration attempt", lambda: "broker_registration" in html_controller.garbage_calls)
    await b.stop()  # raised the link task's ExtraData


async def test_the_link_loop_survives_an_unexpected_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Any error the loop did not expect (here: the on_registered callback raising) ended its task, so no
    heartbeat was ever sent again; it is logged and the loop goes on."""
    async with running(FakeController()) as fc:
        cfg = broker_config({"broker.heartbeat.interval.ms": 100})
        clock = SystemClock()
        rm = ReplicaManager(1, cfg, clock, LogManager(tmp_path, cfg, clock), MetadataCache("c"), BrokerMetrics())
        link = ControllerLink(rm, fc.address, "127.0.0.1", 9, cfg, clock)
        calls: list[int] = []

        def on_registered() -> None:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("callback failed (test)")
        link.on_registered = on_registered
        await link.start()
        try:
            await wait_until("heartbeats after the failure", lambda: len(fc.heartbeats) >= 3)
        finally:
            await link.close()
        assert calls == [1] and rm.broker_epoch > 0
        [error] = [r for r in caplog.records if r.getMessage().startswith("controller_link_error")]
        assert "callback failed (test)" in error.getMessage()


async def test_one_unanswered_heartbeat_does_not_outlast_the_session(tmp_path: Path) -> None:
    """The heartbeat waits at most half the session timeout and is sent again soon after (Kafka's
    BrokerLifecycleManager): it waited the whole session and then a whole interval more, so one lost answer
    always got the broker fenced. The controller's rule: a session ends after this much silence."""
    session_ms = 3_000
    async with running(OneLostHeartbeatController()) as fc:
        b = broker(tmp_path, fc.address, **{"broker.session.timeout.ms": session_ms})
        await b.start()
        try:
            await wait_until("two heartbeats after the lost one", lambda: len(fc.arrived) >= fc.lost + 2)
        finally:
            await b.stop()
    last_answered, next_one = fc.arrived[fc.lost - 2], fc.arrived[fc.lost]
    assert (next_one - last_answered) * 1000 < session_ms, "the controller would have fenced the broker"


async def test_controlled_shutdown_retries_failed_calls_until_it_succeeds(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """It gave up at the first failed call, though it may take controlled.shutdown.max.wait.ms."""
    async with running(FlakyShutdownController(failing_shutdown_calls=3)) as fc:
        b = broker(tmp_path, fc.address, **{"controlled.shutdown.max.wait.ms": 30_000})
        await b.start()
        await fc.wait_registered([1])
        await b.stop()
        assert len(fc.shutdown_requests) == 4
        assert len(messages(caplog, "controlled_shutdown_failed")) == 3
        assert messages(caplog, "controlled_shutdown_done")


async def test_controlled_shutdown_that_keeps_failing_ends_at_its_deadline(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with running(FlakyShutdownController(failing_shutdown_calls=1_000)) as fc:
        b = broker(tmp_path, fc.address, **{"controlled.shutdown.max.wait.ms": 1_000})
        await b.start()
        await fc.wait_registered([1])
        await b.stop()
        assert len(fc.shutdown_requests) >= 2
        assert messages(caplog, "controlled_shutdown_timed_out") and not messages(caplog, "controlled_shutdown_done")
        assert messages(caplog, "broker_stopped")


@contextlib.asynccontextmanager
async def real_controller(data_dir: Path) -> AsyncIterator[tuple[str, Any]]:
    """A real controller (its app on 127.0.0.1) with its own data dir, hence its own cluster id."""
    from common.config import controller_config
    from controller.controller import Controller
    from controller.server import make_app

    controller = Controller(data_dir, controller_config({"broker.session.timeout.ms": 3000}), SystemClock())
    runner = web.AppRunner(make_app(controller), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}", controller
    finally:
        await runner.cleanup()


async def test_a_data_dir_of_another_cluster_is_refused_at_registration(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Found by review: a broker whose data dir came from another cluster (the same node id) registered,
    truncated to and joined the ISR, and as leader served that cluster's records. As Kafka: the first
    registration records the controller's cluster id in meta.properties, and a controller of another
    cluster refuses the broker (INCONSISTENT_CLUSTER_ID) for as long as it asks; it never gets a partition."""
    caplog.set_level(logging.INFO)
    data_dir = tmp_path / "b1"

    async def run_broker(controller: str) -> BrokerProcess:
        opts = BrokerOptions(1, "127.0.0.1", 0, controller, data_dir, None,
                             broker_config({"broker.heartbeat.interval.ms": 200}))
        proc = BrokerProcess(opts, on_dir_failure=lambda _d, _e: None)
        await proc.start()
        return proc

    async with real_controller(tmp_path / "cluster-a") as (address, a):
        proc = await run_broker(address)
        try:
            assert proc.link is not None
            await asyncio.wait_for(proc.link.registered.wait(), 20)
            assert f"cluster.id={a.cluster_id}\n" in (data_dir / "meta.properties").read_text()
            assert proc.rm is not None and proc.rm.metadata.cluster_id == a.cluster_id
        finally:
            await proc.stop()
    async with real_controller(tmp_path / "cluster-b") as (address, b):
        assert b.cluster_id != a.cluster_id
        proc = await run_broker(address)
        try:
            deadline = time.monotonic() + 20
            while not _refusals(caplog):
                assert time.monotonic() < deadline, "no registration_refused"
                await asyncio.sleep(0.05)
            [first] = _refusals(caplog)[:1]
            assert first.levelno == logging.ERROR and "INCONSISTENT_CLUSTER_ID" in first.getMessage()
            assert f"cluster_id='{a.cluster_id}'" in first.getMessage() and "empty --data-dir" in first.getMessage()
            assert proc.link is not None and not proc.link.registered.is_set() and not b.image.brokers
        finally:
            await proc.stop()
    assert f"cluster.id={a.cluster_id}\n" in (data_dir / "meta.properties").read_text()


def _refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("registration_refused")]
