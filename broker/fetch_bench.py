"""What one fetch costs the leader: ``python -m broker.fetch_bench [--fetches N] [--rounds R]``.

One broker process on 127.0.0.1 (this process acting as its controller) leads one partition holding
``--batches`` batches of 1000 x 100-byte records. This process then sends ``--fetches`` sequential
consumer fetches per round (``max_bytes`` ``--max-bytes``, offsets walking through the log, so nothing
is written while it measures) and prints, per round, the broker's CPU and minor page faults per
fetch (from ``/proc/<pid>/stat``) and this client's CPU per fetch. Figures are printed, never
asserted; page faults are the steadiest of them on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.http import RpcClient


async def run(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    from broker.bench import proc_counters, stop_process
    from fetcher.bench import PER_BATCH, Bench, StubController, spawn_broker

    controller = StubController()
    await controller.start()
    rows = []
    try:
        broker = await asyncio.to_thread(spawn_broker, 1, work, controller.address, {})
        rpc = RpcClient()
        try:
            bench = Bench(rpc, controller, {1: broker})
            await bench.elect("t", 0, 1, [1], 1)
            await bench.produce("t", 1, args.batches, 1, 4)
            end = args.batches * PER_BATCH
            step = max(1, args.max_bytes // 110)  # ~ the records one fetch carries, so each reads new bytes
            for rnd in range(1, args.rounds + 1):
                cpu0, faults0 = proc_counters(broker.proc.pid)
                mine0 = time.process_time()
                offset = 0
                got = 0
                for _ in range(args.fetches):
                    answer = await rpc.call(broker.address, "fetch", {
                        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": args.max_bytes,
                        "topics": [{"topic": "t", "partitions": [
                            {"partition": 0, "fetch_offset": offset, "partition_max_bytes": args.max_bytes}]}]})
                    part = answer["topics"][0]["partitions"][0]
                    if part["error"]:
                        raise RuntimeError(f"fetch at {offset}: {part}")
                    got += len(part["records"])
                    offset = (offset + step) % max(1, end - step)
                cpu1, faults1 = proc_counters(broker.proc.pid)
                rows.append({"round": rnd, "broker_cpu_us": (cpu1 - cpu0) / args.fetches * 1e6,
                             "broker_faults": (faults1 - faults0) / args.fetches,
                             "client_cpu_us": (time.process_time() - mine0) / args.fetches * 1e6,
                             "kib": got / args.fetches / 1024})
        finally:
            await rpc.close()
            await asyncio.to_thread(stop_process, broker.proc)
    finally:
        await controller.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.fetch_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fetches", type=int, default=2000, help="sequential fetches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=400, help="batches in the partition before fetching")
    parser.add_argument("--max-bytes", type=int, default=256 * 1024, help="max_bytes of each fetch")
    args = parser.parse_args(argv)
    for name in ("fetches", "rounds", "batches", "max_bytes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    with tempfile.TemporaryDirectory(prefix="fetch-bench-") as tmp:
        rows = asyncio.run(run(args, Path(tmp)))
    print(f"consumer fetches of up to {args.max_bytes} bytes from 1 partition, 1 in flight")
    print(f"{'round':<7}{'KiB/fetch':>10}{'broker CPU us':>15}{'broker faults':>15}{'client CPU us':>15}")
    for r in rows:
        print(f"{r['round']:<7}{r['kib']:>10.0f}{r['broker_cpu_us']:>15.0f}{r['broker_faults']:>15.1f}"
              f"{r['client_cpu_us']:>15.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
