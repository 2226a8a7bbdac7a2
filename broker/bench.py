"""``minibroker perf broker``: produce throughput of one broker vs a bare aiohttp server.

Both servers run as separate processes on 127.0.0.1; the same client (one
keep-alive aiohttp session, ``--concurrency`` requests in flight) sends the
same produce bodies (one batch of ``--records`` x ``--record-size`` bytes,
acks=1, one partition) to each in the same run. The bare server reads the body
and answers a tiny msgpack map. Figures are printed, never asserted. Per round,
each server's and the client's CPU per request and how busy each kept its CPU
(CPU seconds per second): whichever is near 100 % sets the rate, and the other
side sleeps between requests, so the busy one also pays for waking it (see
docs/benchmarks/broker.md).

``python -m broker.bench bare DIR app|lowlevel`` runs the bare server (writes DIR/endpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from broker.server import MAX_BODY_BYTES, low_level_server
from common.wire import CONTENT_TYPE, decode, encode

REPO = Path(__file__).resolve().parent.parent
TOPIC = "bench"


async def _bare_server(data_dir: Path, kind: str) -> None:
    """``kind`` "app": a ``web.Application`` with one route, the usual bare aiohttp server; "lowlevel":
    aiohttp's low-level ``web.Server``, which is what the broker uses (``broker.server``)."""
    answer = encode({"topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "error": 0, "base_offset": 0,
                                                                  "log_start_offset": 0}]}]})

    async def handle(request: web.BaseRequest) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type=CONTENT_TYPE)

    runner: web.BaseRunner
    if kind == "app":
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/produce", handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
    else:
        runner = web.ServerRunner(low_level_server(handle, access_log=None))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    (data_dir / "endpoint").write_text(f"127.0.0.1:{runner.addresses[0][1]}\n")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


async def _stub_controller() -> tuple[web.AppRunner, str]:
    """Just enough controller for a broker to register and heartbeat."""
    async def register(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=encode({"error": 0, "broker_epoch": 1}), content_type=CONTENT_TYPE)

    async def heartbeat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=encode({"error": 0, "is_fenced": False, "should_shutdown": False}),
                            content_type=CONTENT_TYPE)

    async def shutdown(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=encode({"error": 0, "remaining_partitions": []}), content_type=CONTENT_TYPE)

    app = web.Application()
    app.router.add_post("/v1/broker_registration", register)
    app.router.add_post("/v1/broker_heartbeat", heartbeat)
    app.router.add_post("/v1/controlled_shutdown", shutdown)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"127.0.0.1:{runner.addresses[0][1]}"


def _spawn(args: list[str], data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(data_dir.parent / f"{data_dir.name}.stderr.log", "wb")  # noqa: SIM115 - lives with the process
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
                            stdin=subprocess.DEVNULL)
    log.close()
    return proc, wait_for_endpoint(proc, data_dir, f"{args[:3]} did not start; see {data_dir}.stderr.log")


def wait_for_endpoint(proc: subprocess.Popen[bytes], data_dir: Path, failure: str) -> str:
    """The ``host:port`` a process started with ``--listen ...:0`` wrote to ``<data-dir>/endpoint``
    (bounded wait); the process is stopped and ``failure`` raised when it does not come up."""
    endpoint = data_dir / "endpoint"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if endpoint.exists() and endpoint.read_text().strip():
            return endpoint.read_text().strip()
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError(failure)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (graceful stop), then SIGKILL after 20 s."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _drive(address: str, body: bytes, requests: int, concurrency: int) -> tuple[float, int]:
    """Send ``requests`` produce bodies with ``concurrency`` in flight; -> (seconds, errors)."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    errors = 0
    url = f"http://{address}/v1/produce"
    headers = {"Content-Type": CONTENT_TYPE}
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> bool:
            async with session.post(url, data=body, headers=headers) as resp:
                answer = decode(await resp.read())
            part = answer["topics"][0]["partitions"][0]
            return resp.status == 200 and part["error"] == 0

        for _ in range(min(50, requests)):  # warm-up: connections, caches
            await one()
        remaining = requests

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0:
                remaining -= 1
                if not await one():
                    errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start, errors


def proc_counters(pid: int) -> tuple[float, int]:
    """(user + system CPU seconds, minor page faults) of a process so far (Linux /proc); (NaN, 0) elsewhere.
    Robust to other load on the machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])
    except (OSError, IndexError, ValueError):
        return float("nan"), 0


def _log_settings(retained_mb: int) -> list[str]:
    """Broker ``--set`` flags: a bounded log (segments of a quarter of ``retained_mb``, at most 64 MiB;
    retention checked every second), or one 1 GiB segment (Kafka's default size) when ``retained_mb``
    is 0."""
    if retained_mb <= 0:
        return ["--set", "log.segment.bytes=1073741824"]
    segment = max(1 << 20, min(64 << 20, (retained_mb << 20) // 4))
    return ["--set", f"log.segment.bytes={segment}", "--set", f"log.retention.bytes={retained_mb << 20}",
            "--set", "log.retention.check.interval.ms=1000"]


def _produce_body(records: int, record_size: int) -> bytes:
    from storage.record_batch import build_batch

    value = b"x" * record_size
    batch = build_batch([(None, value)] * records, timestamp_ms=int(time.time() * 1000))
    return encode({"acks": 1, "timeout_ms": 30_000,
                   "topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "records": batch}]}]})


async def _perf(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    body = _produce_body(args.records, args.record_size)
    stub, controller = await _stub_controller()
    broker, broker_addr = _spawn(["-m", "cli.main", "broker", "--node-id", "1", "--listen", "127.0.0.1:0",
                                  "--controller", controller, "--data-dir", str(work / "broker"),
                                  *_log_settings(args.retained_mb)], work / "broker")
    bare, bare_addr = _spawn(["-m", "broker.bench", "bare", str(work / "bare"), args.bare], work / "bare")
    rows = []
    try:
        async with aiohttp.ClientSession() as s:
            lai = {"controller_id": 0, "controller_epoch": 1, "broker_epoch": -1,
                   "partition_states": [{"topic": TOPIC, "partition": 0, "leader": 1, "leader_epoch": 0,
                                         "isr": [1], "partition_epoch": 0, "replicas": [1], "is_new": True}],
                   "live_leaders": [], "topic_configs": {}}
            async with s.post(f"http://{broker_addr}/v1/leader_and_isr", data=encode(lai)) as resp:
                assert decode(await resp.read())["error"] == 0
        for rnd in range(1, args.rounds + 1):  # alternate targets so background load hits both alike
            for name, addr, pid in (("bare aiohttp", bare_addr, bare.pid), ("broker", broker_addr, broker.pid)):
                cpu0, faults0 = proc_counters(pid)
                client0 = time.process_time()
                seconds, errors = await _drive(addr, body, args.requests, args.concurrency)
                client_us = (time.process_time() - client0) / args.requests * 1e6
                cpu1, faults1 = proc_counters(pid)
                cpu_us = (cpu1 - cpu0) / args.requests * 1e6
                rows.append({"round": rnd, "target": name, "seconds": seconds, "errors": errors,
                             "req_s": args.requests / seconds, "records_s": args.requests * args.records / seconds,
                             "mb_s": args.requests * len(body) / seconds / 1e6, "cpu_us": cpu_us,
                             "faults": (faults1 - faults0) / args.requests, "client_us": client_us})
    finally:
        # off the event loop: it serves the stub controller the broker's controlled shutdown talks to
        await asyncio.to_thread(stop_process, broker)
        await asyncio.to_thread(stop_process, bare)
        await stub.cleanup()
    return rows


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """The closing lines: per-round broker/bare request-rate ratios with their median, the ratio over all
    rounds together, and per-round bare/broker CPU ratios with their median.
    ``rows`` alternate bare and broker rounds, as ``_perf`` returns them."""
    ratios = sorted(rows[i + 1]["req_s"] / rows[i]["req_s"] for i in range(0, len(rows), 2))
    # CPU time moves in 10 ms ticks: a short round can show none for the broker; such rounds are left out
    cpu = sorted(rows[i]["cpu_us"] / rows[i + 1]["cpu_us"] for i in range(0, len(rows), 2)
                 if rows[i + 1]["cpu_us"] > 0)
    lines = [f"broker / bare request rate per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
             f"median {ratios[len(ratios) // 2]:.2f}"]
    # The median discounts the few slow rounds (most often those that carry the broker's periodic flush and
    # delete); over all rounds together every request weighs alike (each round sends as many, so time decides)
    bare_s, broker_s = sum(r["seconds"] for r in rows[0::2]), sum(r["seconds"] for r in rows[1::2])
    lines.append(f"broker / bare request rate over all rounds together: {bare_s / broker_s:.2f}")
    if cpu:
        lines.append(f"bare / broker server CPU per request (rate ratio if CPU-bound and alone): "
                     f"{', '.join(f'{x:.2f}' for x in cpu)}; median {cpu[len(cpu) // 2]:.2f}")
    else:
        lines.append("bare / broker server CPU per request: rounds too short to measure (CPU time moves in "
                     "10 ms ticks)")
    return lines


def run_perf(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        work = args.data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mb-perf-")))
        rows = asyncio.run(_perf(args, Path(work)))
    log = f"log bounded at {args.retained_mb} MiB" if args.retained_mb > 0 else "unbounded log"
    print(f"produce: 1 partition, acks=1, {args.requests} requests of {args.records} x {args.record_size} B "
          f"records, {args.concurrency} in flight, {log}, bare server: {args.bare}, cpus={os.cpu_count()}")
    print(f"{'round':<7}{'target':<14}{'req/s':>10}{'records/s':>14}{'MB/s':>10}{'server CPU us/req':>19}"
          f"{'faults/req':>12}{'client CPU us/req':>19}{'server busy':>13}{'client busy':>13}{'errors':>8}")
    for r in rows:
        # busy: CPU seconds per second, as % of one CPU; the side near 100 % is the one that sets the rate
        print(f"{r['round']:<7}{r['target']:<14}{r['req_s']:>10.0f}{r['records_s']:>14.0f}{r['mb_s']:>10.1f}"
              f"{r['cpu_us']:>19.0f}{r['faults']:>12.1f}{r['client_us']:>19.0f}"
              f"{r['cpu_us'] * r['req_s'] / 1e4:>12.0f}%{r['client_us'] * r['req_s'] / 1e4:>12.0f}%{r['errors']:>8}")
    for line in summary(rows):
        print(line)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "bare" and sys.argv[3] in ("app", "lowlevel"):
        asyncio.run(_bare_server(Path(sys.argv[2]), sys.argv[3]))
    else:
        print("usage: python -m broker.bench bare DIR app|lowlevel", file=sys.stderr)
        sys.exit(2)
