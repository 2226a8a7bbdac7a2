"""``minibroker perf controller``: figures for the controller (printed, never asserted).

Runs an in-process controller on 127.0.0.1 with stub brokers (tiny aiohttp
servers that acknowledge every control request) and measures:
  - create_topics round trips (each one journal frame + fsync) over HTTP;
  - failover: a broker fenced -> every LeaderAndIsr/UpdateMetadata acknowledged;
  - restart: journal + snapshot replay time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from common.clock import SystemClock
from common.config import controller_config
from common.http import RpcClient
from common.wire import CONTENT_TYPE, encode
from controller.controller import Controller
from controller.server import make_app


async def _stub_broker() -> tuple[web.AppRunner, int, list[int]]:
    counter = [0]

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        counter[0] += 1
        return web.Response(body=encode({"error": 0, "partitions": []}), content_type=CONTENT_TYPE)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    for api in ("leader_and_isr", "update_metadata", "stop_replica"):
        app.router.add_post(f"/v1/{api}", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1], counter


async def run_bench(brokers: int, topics: int, partitions: int, rf: int, data_dir: Path) -> dict[str, Any]:
    overrides = {"broker.session.timeout.ms": 600_000, "auto.leader.rebalance.enable": False,
                 "metadata.snapshot.interval.records": 100_000}
    controller = Controller(data_dir, controller_config(overrides), SystemClock())
    runner = web.AppRunner(make_app(controller), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    address = f"127.0.0.1:{runner.addresses[0][1]}"
    rpc = RpcClient(timeout_s=30)
    stubs = [await _stub_broker() for _ in range(brokers)]
    out: dict[str, Any] = {}
    try:
        for i, (_, port, _) in enumerate(stubs, start=1):
            await rpc.call(address, "broker_registration",
                           {"node_id": i, "host": "127.0.0.1", "port": port, "incarnation_id": f"b{i}"})
        lat: list[float] = []
        t0 = time.perf_counter()
        for i in range(topics):
            s = time.perf_counter()
            resp = await rpc.call(address, "create_topics", {"topics": [
                {"name": f"bench-{i}", "num_partitions": partitions, "replication_factor": rf, "configs": {}}]})
            lat.append((time.perf_counter() - s) * 1000)
            result = resp["topics"][0]
            if result["error"] != 0:
                from cli.main import CliError

                raise CliError(f"create_topics bench-{i} failed: {result.get('error_message') or result['error']}")
        elapsed = time.perf_counter() - t0
        out["create_topics_per_s"] = topics / elapsed
        out["create_topics_p50_ms"] = statistics.median(lat)
        out["create_topics_p99_ms"] = sorted(lat)[int(len(lat) * 0.99) - 1] if len(lat) >= 100 else max(lat)
        await _wait_idle(controller)
        led = sum(1 for st in controller.image.partitions.values() if st.leader == 1)
        s = time.perf_counter()
        controller.last_heard[1] = -10**12  # as if broker 1 went silent long ago
        await controller.check_liveness()
        fenced_ms = (time.perf_counter() - s) * 1000
        await _wait_idle(controller)
        out["failover_partitions_moved"] = led
        out["failover_commit_ms"] = fenced_ms
        out["failover_all_acked_ms"] = (time.perf_counter() - s) * 1000
    finally:
        await rpc.close()
        await runner.cleanup()
        for r, _, _ in stubs:
            await r.cleanup()
    s = time.perf_counter()
    again = Controller(data_dir, controller_config(overrides), SystemClock())
    await again.start()
    out["restart_replay_ms"] = (time.perf_counter() - s) * 1000
    out["partitions"] = len(again.image.partitions)
    await again.close()
    return out


async def _wait_idle(controller: Controller) -> None:
    for _ in range(30_000):
        if controller.propagator.idle() and not any(
                s.task is not None and s.pending.metadata for s in controller.propagator.senders().values()):
            await asyncio.sleep(0)
            if controller.propagator.idle():
                return
        await asyncio.sleep(0.001)


def main(args: argparse.Namespace) -> int:
    from common.logging import configure

    configure("controller-bench", level="WARNING")
    with tempfile.TemporaryDirectory(prefix="mb-ctl-bench-") as d:
        result = asyncio.run(run_bench(args.brokers, args.topics, args.partitions, args.replication_factor,
                                       Path(d)))
    for k, v in result.items():
        print(f"{k:28s} {v:.1f}" if isinstance(v, float) else f"{k:28s} {v}")
    return 0
