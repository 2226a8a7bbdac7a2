"""Fake brokers for controller tests: real aiohttp servers on 127.0.0.1 port 0 that record what they are told."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from common.wire import CONTENT_TYPE, decode_body, encode


class FakeBroker:
    """Answers leader_and_isr / update_metadata / stop_replica like a broker would and records them."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.fail_next = 0  # answer this many requests with HTTP 503
        self.garble_next = 0  # answer this many requests with a map whose "error" is no integer
        self.hang = False  # never answer (a paused process): the controller must not wait on it
        self.controller_epoch = -1
        self.stop_errors: dict[tuple[str, int], int] = {}  # StopReplica answers these partitions with this error
        self.epochs: dict[tuple[str, int], tuple[int, int]] = {}  # (leader_epoch, partition_epoch)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        for api in ("leader_and_isr", "update_metadata", "stop_replica"):
            app.router.add_post(f"/v1/{api}", self._handler(api))
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _handler(self, api: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            body = decode_body(await request.read())
            if self.hang:
                await asyncio.sleep(3600)
            if self.fail_next > 0:
                self.fail_next -= 1
                raise web.HTTPServiceUnavailable(text="injected failure")
            if self.garble_next > 0:
                self.garble_next -= 1
                return web.Response(body=encode({"error": "NONE"}), content_type=CONTENT_TYPE)
            if body["controller_epoch"] < self.controller_epoch:
                return web.Response(body=encode({"error": 11, "partitions": []}), content_type=CONTENT_TYPE)
            self.controller_epoch = body["controller_epoch"]
            self.received.append((api, body))
            partitions = []
            for ps in body.get("partition_states", []) if api == "leader_and_isr" else []:
                key = (ps["topic"], ps["partition"])
                new = (ps["leader_epoch"], ps["partition_epoch"])
                error = 11 if new <= self.epochs.get(key, (-1, -1)) else 0  # the broker's _is_newer
                if not error:
                    self.epochs[key] = new
                partitions.append({"topic": ps["topic"], "partition": ps["partition"], "error": error})
            for sp in body.get("partitions", []) if api == "stop_replica" else []:
                error = self.stop_errors.get((sp["topic"], sp["partition"]), 0)
                partitions.append({"topic": sp["topic"], "partition": sp["partition"], "error": error})
            return web.Response(body=encode({"error": 0, "partitions": partitions}), content_type=CONTENT_TYPE)
        return handle

    def states(self, api: str = "leader_and_isr") -> list[dict[str, Any]]:
        return [ps for a, body in self.received if a == api for ps in body.get("partition_states", [])]

    def latest(self, topic: str, partition: int) -> dict[str, Any] | None:
        found = [ps for ps in self.states() if (ps["topic"], ps["partition"]) == (topic, partition)]
        return found[-1] if found else None


async def eventually(cond: Callable[[], bool], *, timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``cond`` (bounded in time and count) until it holds."""
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
