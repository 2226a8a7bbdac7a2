"""The broker's HTTP surface (aiohttp's low-level server with a route table): paths, methods, sizes."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from broker.replica_manager import ReplicaManager
from broker.server import MAX_BODY_BYTES, _endpoint, low_level_server
from common.errors import ErrorCode
from common.wire import CONTENT_TYPE, decode, encode
from tests.broker.conftest import StartBroker


async def test_routes_methods_and_body_limit(start_broker: StartBroker) -> None:
    broker = await start_broker()
    base = f"http://{broker.address}"
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/v1/status") as resp:
            assert resp.status == 200
            assert "partitions" in await resp.json()
        async with s.get(f"{base}/metrics") as resp:
            assert resp.status == 200
            assert "under_replicated" in await resp.text()
        async with s.post(f"{base}/v1/metadata", data=encode({"topics": None}),
                          headers={"Content-Type": CONTENT_TYPE}) as resp:
            assert resp.status == 200
            assert "brokers" in decode(await resp.read())
        async with s.head(f"{base}/v1/status") as resp:  # HEAD where GET, as the controller (aiohttp's router)
            assert resp.status == 200
            assert await resp.read() == b""
        async with s.get(f"{base}/v1/produce") as resp:  # known path, wrong method
            assert resp.status == 405
            assert resp.headers["Allow"] == "POST"
        async with s.put(f"{base}/metrics") as resp:
            assert resp.status == 405
            assert resp.headers["Allow"] == "GET, HEAD"
        async with s.post(f"{base}/v1/no_such_api", data=b"") as resp:
            assert resp.status == 404
            assert "no_such_api" in await resp.text()
        big = encode({"topics": None, "padding": b"x" * (4 << 20)})  # over aiohttp's 1 MiB default
        async with s.post(f"{base}/v1/metadata", data=io.BytesIO(big), headers={"Content-Type": CONTENT_TYPE}) as resp:
            assert resp.status == 200  # read in full, not refused as too large
            assert "brokers" in decode(await resp.read())

        async def trickle() -> AsyncIterator[bytes]:  # a body that arrives in pieces, the broker waiting between
            for i in range(0, len(big), 1 << 20):
                await asyncio.sleep(0.02)
                yield big[i:i + (1 << 20)]

        async with s.post(f"{base}/v1/metadata", data=trickle(), headers={"Content-Type": CONTENT_TYPE}) as resp:
            assert resp.status == 200
            assert "brokers" in decode(await resp.read())
        async with s.post(f"{base}/v1/produce", data=io.BytesIO(b"\0" * (MAX_BODY_BYTES + 1))) as resp:
            assert resp.status == 413
        async with s.get(f"{base}/v1/status") as resp:  # still serving
            assert resp.status == 200
        async with s.get(f"{base}/metrics") as resp:  # every answered request is counted, the 413 too
            text = await resp.text()
            assert 'minibroker_requests_total{api="produce",status="413"} 1.0' in text
            assert 'minibroker_requests_total{api="metadata",status="200"} 3.0' in text


async def test_unexpected_exception_is_counted_as_a_server_error(start_broker: StartBroker) -> None:
    """An exception no handler expects is answered UNKNOWN_SERVER_ERROR (HTTP 200) and counted as such."""
    broker = await start_broker()
    assert broker.rm is not None
    rm = broker.rm

    async def failing(_rm: ReplicaManager, _body: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("disk on fire")

    runner = web.ServerRunner(low_level_server(_endpoint(rm, "list_offsets", failing), access_log=None))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/", data=encode({})) as resp:
            assert resp.status == 200
            answer = decode(await resp.read())
            assert answer["error"] == ErrorCode.UNKNOWN_SERVER_ERROR
            assert "disk on fire" in answer["error_message"]
    finally:
        await runner.cleanup()
    samples = rm.metrics.registry.get_sample_value
    assert samples("minibroker_request_errors_total", {"api": "list_offsets"}) == 1
    assert samples("minibroker_request_errors_total", {"api": "produce"}) == 0
