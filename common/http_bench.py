"""Client CPU per call: ``aiohttp.ClientSession`` (the old ``RpcClient``) vs ``common.http.RpcClient``.

    .venv/bin/python -m common.http_bench [--calls 2000] [--rounds 3]

Starts one aiohttp server in a child process (so that its CPU is not counted), then times
sequential calls from this process with ``time.process_time``: a small request and answer, a
100 KiB request (a produce), a 100 KiB answer (a fetch). Prints the median over rounds of the
client's CPU microseconds per call; the machine may be shared, so wall time is not reported.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from common.http import RpcClient
from common.wire import CONTENT_TYPE, decode, encode

CASES = {  # name: (request data bytes, answer data bytes)
    "small": (16, 16),
    "100 KiB request": (100 * 1024, 16),
    "100 KiB answer": (16, 100 * 1024),
}


class Caller(Protocol):
    async def call(self, address: str, api: str, body: dict[str, Any]) -> dict[str, Any]: ...
    async def close(self) -> None: ...


class AiohttpCaller:
    """What ``RpcClient.call`` did before it was hand-written: one ClientSession, one post per call."""

    def __init__(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=8))

    async def call(self, address: str, api: str, body: dict[str, Any]) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=30.0)
        async with self._session.post(f"http://{address}/v1/{api}", data=encode(body),
                                      headers={"Content-Type": CONTENT_TYPE}, timeout=timeout) as resp:
            payload = await resp.read()
        result = decode(payload)
        assert isinstance(result, dict)
        return result

    async def close(self) -> None:
        await self._session.close()


def serve() -> None:
    async def data(request: web.Request) -> web.Response:
        body = decode(await request.read())
        return web.Response(body=encode({"data": b"a" * body["want"]}), content_type=CONTENT_TYPE)

    async def main() -> None:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post("/v1/data", data)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
        await runner.cleanup()

    asyncio.run(main())


async def cpu_us_per_call(caller: Caller, address: str, request_bytes: int, answer_bytes: int, calls: int) -> float:
    body = {"want": answer_bytes, "data": b"r" * request_bytes}
    for _ in range(min(200, calls)):  # warm up: connection open, caches
        await caller.call(address, "data", body)
    start = time.process_time()
    for _ in range(calls):
        await caller.call(address, "data", body)
    return (time.process_time() - start) / calls * 1e6


async def bench(address: str, calls: int, rounds: int) -> None:
    print(f"client CPU us/call, median of {rounds} rounds of {calls} sequential calls")
    print(f"{'case':<18}{'aiohttp':>10}{'RpcClient':>12}")
    for case, (request_bytes, answer_bytes) in CASES.items():
        results: dict[str, list[float]] = {"aiohttp": [], "rpc": []}
        for _ in range(rounds):
            for name, caller in (("aiohttp", AiohttpCaller()), ("rpc", RpcClient())):
                try:
                    results[name].append(await cpu_us_per_call(caller, address, request_bytes, answer_bytes, calls))
                finally:
                    await caller.close()
        print(f"{case:<18}{statistics.median(results['aiohttp']):>10.1f}{statistics.median(results['rpc']):>12.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    server = subprocess.Popen([sys.executable, "-m", "common.http_bench", "--serve"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        asyncio.run(bench(f"127.0.0.1:{port}", args.calls, args.rounds))
    finally:
        assert server.stdin is not None
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
