"""Stand-ins for ``minibroker controller`` / ``minibroker broker`` with the same command line and the
same HTTP surface the cluster tooling uses (``broker_registration``, ``GET /v1/status``, endpoint and pid
files, SIGTERM = clean exit). Run as a script by ``cluster up --exec``; lets the cluster commands be tested
with real processes before (and independently of) the real broker and controller."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from common.wire import CONTENT_TYPE, decode_body, encode

START_DELAY_ENV = "MINIBROKER_FAKE_BROKER_START_DELAY_S"
# set: on SIGTERM the stand-in broker does a "controlled shutdown" (waits this long, as a real one moving its
# leaderships away, then asks the controller) and prints whether the controller answered
SHUTDOWN_ENV = "MINIBROKER_FAKE_BROKER_SHUTDOWN_S"


def write_files(data_dir: str, address: str) -> None:
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in (("endpoint", address), ("pid", str(os.getpid()))):
        tmp = d / f"{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, d / name)


async def serve(app: web.Application, listen: str) -> web.AppRunner:
    host, port = listen.rsplit(":", 1)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, int(port)).start()
    return runner


async def controller(args: argparse.Namespace, stop: asyncio.Event) -> None:
    brokers: dict[int, dict[str, Any]] = {}

    async def register(request: web.Request) -> web.Response:
        body = decode_body(await request.read())
        epoch = max((b["broker_epoch"] for b in brokers.values()), default=0) + 1
        brokers[int(body["node_id"])] = {"node_id": body["node_id"], "host": body["host"], "port": body["port"],
                                         "broker_epoch": epoch, "fenced": False}
        return web.Response(body=encode({"error": 0, "broker_epoch": epoch}), content_type=CONTENT_TYPE)

    async def status(_request: web.Request) -> web.Response:
        return web.json_response({"role": "controller", "controller_epoch": 1,
                                  "brokers": sorted(brokers.values(), key=lambda b: b["node_id"]), "topics": []})

    app = web.Application()
    app.router.add_post("/v1/broker_registration", register)
    app.router.add_get("/v1/status", status)
    runner = await serve(app, args.listen)
    write_files(args.data_dir, args.listen)
    await stop.wait()
    await runner.cleanup()


async def broker(args: argparse.Namespace, stop: asyncio.Event) -> None:
    registered = {"broker_epoch": -1}  # as the real broker: -1 until the controller answers its registration

    async def status(_request: web.Request) -> web.Response:
        return web.json_response({"node_id": args.node_id, "role": "broker", **registered,
                                  "controller_epoch": 1, "partitions": []})

    # a slow start (a real broker recovering its logs), so that a test sees what waits for it
    await asyncio.sleep(float(os.environ.get(START_DELAY_ENV, "0")))
    app = web.Application()
    app.router.add_get("/v1/status", status)
    runner = await serve(app, args.listen)
    write_files(args.data_dir, args.listen)
    host, port = args.listen.rsplit(":", 1)
    async with ClientSession(timeout=ClientTimeout(total=2)) as session:
        for _ in range(100):
            try:
                async with session.post(f"http://{args.controller}/v1/broker_registration",
                                        data=encode({"node_id": args.node_id, "host": host, "port": int(port),
                                                     "incarnation_id": str(os.getpid())}),
                                        headers={"Content-Type": CONTENT_TYPE}) as resp:
                    if resp.status == 200:
                        registered["broker_epoch"] = decode_body(await resp.read())["broker_epoch"]
                        break
            except OSError:
                pass
            await asyncio.sleep(0.1)
    await stop.wait()
    if SHUTDOWN_ENV in os.environ:
        await asyncio.sleep(float(os.environ[SHUTDOWN_ENV]))
        try:
            async with ClientSession(timeout=ClientTimeout(total=2)) as session, \
                    session.get(f"http://{args.controller}/v1/status") as resp:
                print(f"controlled shutdown: controller answered {resp.status}", flush=True)
        except Exception as exc:  # refused (ClientConnectorError) or no answer (TimeoutError)
            print(f"controlled shutdown failed: controller unreachable ({exc})", flush=True)
    await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="kind", required=True)
    c = sub.add_parser("controller")
    b = sub.add_parser("broker")
    b.add_argument("--node-id", type=int, required=True)
    b.add_argument("--controller", required=True)
    for p in (c, b):
        p.add_argument("--listen", required=True)
        p.add_argument("--data-dir", required=True)
        p.add_argument("--set", action="append")
    args = parser.parse_args()

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await (controller(args, stop) if args.kind == "controller" else broker(args, stop))

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
