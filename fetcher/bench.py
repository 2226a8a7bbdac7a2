"""Replication benchmark (issue 5): ``python -m fetcher.bench [--batches N]``. Prints figures, asserts nothing.

In one run, with real broker processes on 127.0.0.1 and this process acting as
the controller (LeaderAndIsr by hand, AlterPartition accepted as asked):

1. baseline: 1 broker, RF=1, acks=1;
2. replicated: 3 brokers, RF=3, acks=all, min.insync.replicas=2;

both with batches of 1000 x 100-byte records, the same partitions, in
alternating rounds (so background load hits both). The replication ratio is
(2) / (1) in records/s over all rounds; each round's own ratio is printed too.
Kafka's published ratio for synchronous 3x replication is 0.51. The brokers'
CPU time and minor page faults per batch come from ``/proc/<pid>/stat``.
On this machine the 3 brokers share 2 cores with the producer, so the run also
prints an estimate for brokers with a core each, bound by their CPU (Kafka's
figure comes from separate machines): the single broker's CPU per batch over
the busiest replicated broker's. ``--cpu-per-broker CORES`` measures that case
instead of estimating it: every broker process, the single one included, is held
to the same cgroup CPU quota (``common/cpu_quota.py``; needs root), small enough
that the 3 replicated brokers and the producer fit into the machine's cores.

Requests in flight: as a Kafka producer (max.in.flight.requests.per.connection,
default 5, one connection per broker), ``--in-flight-per-broker`` requests per
leader broker: 5 to the single broker, 5 to each of the 3 replicated leaders.
With acks=all a request is answered only after both followers fetched its batch,
so a producer keeps more bytes in flight to the same throughput; the follower
fetches then carry several batches each. ``--in-flight N`` instead keeps N in
flight in all, for both setups (the earlier default: 6).

Follower fetch size: the brokers run Kafka's defaults (replica.fetch.min.bytes
1, replica.fetch.wait.max.ms 500), so a follower's fetch returns as soon as one
batch is there and carries ~2.3 of the 5 in flight; each fetch round trip costs
the two brokers ~0.4 ms of CPU. Kafka's throughput setting for this is a larger
replica.fetch.min.bytes with a short wait: ``--set
replica.fetch.min.bytes=430000 --fetch-wait-ms 10`` makes each fetch wait for 4
of the producer's 5 batches in flight (more than 5 would stall every round trip
for the whole wait). Its price is latency under light load (``minibroker perf
e2e`` at 100 records/s, acks=all: p50 2.4 ms at the defaults, 18.5 ms with it)
and idle followers polling every 10 ms, so the brokers' defaults stay Kafka's.

Logs: bounded as at a broker's steady state (``--retained-mb``, as ``minibroker
perf broker``: 64 MiB segments, retention checked every second), or one growing
segment (``--retained-mb 0``). The produce requests are sent with the brokers'
own client (``common.http.RpcClient``).

3. leader moves while producing: after each LeaderAndIsr that turns the old
   leader into a follower, that broker logs ``follower_first_append`` with the
   time from adding the partition to its fetcher to its first appended batch;
   the median is reported (plus the client-side time from sending the
   LeaderAndIsr to that first append, read from the same event's timestamp).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from broker.bench import _log_settings, proc_counters, stop_process, wait_for_endpoint
from common.cli_args import non_negative, non_negative_float, positive
from common.config import ConfigError, broker_config, parse_assignments
from common.cpu_quota import CGROUP_ROOT, CpuQuotaError, CpuQuotas, cpu_cgroup_of, quota_us
from common.http import RpcClient
from common.wire import CONTENT_TYPE, decode, encode

REPO = Path(__file__).resolve().parent.parent
VALUE_BYTES = 100
PER_BATCH = 1000


@dataclass
class StubController:
    """Registration, heartbeats, AlterPartition (always accepted) and controlled shutdown."""

    isr: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    next_epoch: int = 100
    address: str = ""
    runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        for api in ("broker_registration", "broker_heartbeat", "controlled_shutdown", "alter_partition"):
            app.router.add_post(f"/v1/{api}", self._handler(api))
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.address = f"127.0.0.1:{self.runner.addresses[0][1]}"

    def _handler(self, api: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            body = decode(await request.read())
            return web.Response(body=encode(self._answer(api, body)), content_type=CONTENT_TYPE)
        return handle

    def _answer(self, api: str, body: dict[str, Any]) -> dict[str, Any]:
        if api == "broker_registration":
            self.next_epoch += 1
            return {"error": 0, "broker_epoch": self.next_epoch}
        if api == "broker_heartbeat":
            return {"error": 0, "is_fenced": False, "should_shutdown": False}
        if api == "controlled_shutdown":
            return {"error": 0, "remaining_partitions": []}
        topics = []
        for t in body.get("topics", []):
            parts = []
            for p in t["partitions"]:
                state = self.isr.setdefault((t["topic"], p["partition"]), {"partition_epoch": p["partition_epoch"]})
                state["partition_epoch"] = p["partition_epoch"] + 1
                parts.append({"partition": p["partition"], "error": 0, "leader": body["broker_id"],
                              "leader_epoch": p["leader_epoch"], "isr": p["new_isr"],
                              "partition_epoch": state["partition_epoch"]})
            topics.append({"topic": t["topic"], "partitions": parts})
        return {"error": 0, "topics": topics}

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@dataclass
class Broker:
    node_id: int
    proc: subprocess.Popen[bytes]
    address: str
    stderr: Path

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.stderr.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict) and obj.get("event") == name:
                    out.append(obj)
        return out


def spawn_broker(node_id: int, work: Path, controller: str, sets: dict[str, Any],
                 extra_args: list[str] | None = None) -> Broker:
    data_dir = work / f"broker{node_id}"
    data_dir.mkdir(parents=True)
    stderr = work / f"broker{node_id}.stderr.log"
    args = [sys.executable, "-m", "cli.main", "broker", "--node-id", str(node_id), "--listen", "127.0.0.1:0",
            "--controller", controller, "--data-dir", str(data_dir)]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    args += extra_args or []
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(args, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    address = wait_for_endpoint(proc, data_dir, f"broker {node_id} did not start; see {stderr}")
    return Broker(node_id, proc, address, stderr)


async def fetch_requests(session: aiohttp.ClientSession, brokers: dict[int, Broker]) -> float:
    """Fetch requests answered by every broker so far (only followers fetch in this benchmark)."""
    total = 0.0
    for b in brokers.values():
        async with session.get(f"http://{b.address}/metrics") as resp:
            for line in (await resp.text()).splitlines():
                if line.startswith("minibroker_requests_total{") and 'api="fetch"' in line:
                    total += float(line.rsplit(" ", 1)[1])
    return total


def counters(brokers: dict[int, Broker]) -> dict[int, tuple[float, int]]:
    """Per broker node id: user + system CPU seconds and minor page faults so far (Linux /proc).
    A broker whose process is gone is left out."""
    out = {}
    for node, b in brokers.items():
        cpu, faults = proc_counters(b.proc.pid)
        if not math.isnan(cpu):
            out[node] = (cpu, faults)
    return out


def spent(before: dict[int, tuple[float, int]], after: dict[int, tuple[float, int]]) -> dict[int, tuple[float, int]]:
    """Per broker: (CPU seconds, page faults) between two ``counters`` readings."""
    return {n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in after if n in before}


class Bench:
    def __init__(self, rpc: RpcClient, controller: StubController, brokers: dict[int, Broker]) -> None:
        self.rpc = rpc  # the brokers' own client: the benchmark process shares the 2 cores with the brokers
        self.controller = controller
        self.brokers = brokers
        self.leader_epochs: dict[tuple[str, int], int] = {}
        self.leaders: dict[tuple[str, int], int] = {}

    async def call(self, node_id: int, api: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.rpc.call(self.brokers[node_id].address, api, body, timeout_s=60.0)

    async def elect(self, topic: str, partition: int, leader: int, replicas: list[int], min_isr: int) -> float:
        """LeaderAndIsr to every replica (the new leader first); returns the send time of the last one."""
        key = (topic, partition)
        epoch = self.leader_epochs.get(key, -1) + 1
        self.leader_epochs[key] = epoch
        self.leaders[key] = leader
        state = self.controller.isr.setdefault(key, {"partition_epoch": 0})
        state["partition_epoch"] += 1
        ps = {"topic": topic, "partition": partition, "leader": leader, "leader_epoch": epoch, "isr": replicas,
              "partition_epoch": state["partition_epoch"], "replicas": replicas, "is_new": epoch == 0}
        live = [{"node_id": b.node_id, "host": b.address.split(":")[0], "port": int(b.address.split(":")[1])}
                for b in self.brokers.values()]
        sent = 0.0
        for r in sorted(replicas, key=lambda r: r != leader):
            body = {"controller_id": 100, "controller_epoch": 1, "broker_epoch": -1, "partition_states": [ps],
                    "live_leaders": live, "topic_configs": {topic: {"min.insync.replicas": min_isr}}}
            sent = time.time()
            answer = await self.call(r, "leader_and_isr", body)
            if answer.get("error"):
                raise RuntimeError(f"leader_and_isr to {r}: {answer}")
        return sent

    async def produce(self, topic: str, partitions: int, batches: int, acks: int, in_flight: int,
                      per_broker: bool = False) -> float:
        """Send ``batches`` batches round-robin over partitions; returns elapsed seconds.

        ``per_broker``: ``in_flight`` requests in flight to each leader broker (a Kafka producer's
        max.in.flight.requests.per.connection, one connection per broker); else ``in_flight`` in all.
        """
        from storage.record_batch import build_batch

        payload = build_batch([(None, b"v" * VALUE_BYTES)] * PER_BATCH, timestamp_ms=int(time.time() * 1000))
        queues: dict[int, asyncio.Queue[int]] = {}
        for i in range(batches):
            p = i % partitions
            queues.setdefault(self.leaders[(topic, p)] if per_broker else 0, asyncio.Queue()).put_nowait(p)

        async def worker(queue: asyncio.Queue[int]) -> None:
            while not queue.empty():
                p = queue.get_nowait()
                body = {"acks": acks, "timeout_ms": 30_000,
                        "topics": [{"topic": topic, "partitions": [{"partition": p, "records": payload}]}]}
                for _ in range(200):
                    answer = await self.call(self.leaders[(topic, p)], "produce", body)
                    if answer["topics"][0]["partitions"][0]["error"] == 0:
                        break
                    await asyncio.sleep(0.02)
                else:
                    raise RuntimeError(f"produce to {topic}-{p} kept failing: {answer}")

        start = time.perf_counter()
        await asyncio.gather(*(worker(q) for q in queues.values() for _ in range(in_flight)))
        return time.perf_counter() - start


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    controller = StubController()
    await controller.start()
    sets = {"replica.fetch.wait.max.ms": args.fetch_wait_ms, "replica.lag.time.max.ms": 30_000}
    overrides = [flag for key, value in args.set.items() for flag in ("--set", f"{key}={value}")]
    brokers: dict[int, Broker] = {}
    quotas: CpuQuotas | None = None
    try:
        if args.cpu_per_broker:
            quotas = CpuQuotas.create(f"minibroker-bench-{os.getpid()}", root=args.cgroup_root)
        for n in (1, 2, 3, 4):
            brokers[n] = await asyncio.to_thread(spawn_broker, n, work, controller.address, sets,
                                                 _log_settings(args.retained_mb) + overrides)
            if quotas is not None:
                quotas.limit(brokers[n].proc.pid, args.cpu_per_broker, f"broker{n}")
        rpc = RpcClient(limit_per_host=64, timeout_s=60.0)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(rpc.close)
            session = await stack.enter_async_context(aiohttp.ClientSession())
            bench = Bench(rpc, controller, brokers)
            for p in range(args.partitions):
                await bench.elect("single", p, 4, [4], 1)
                await bench.elect("replicated", p, 1 + p % 3, [1, 2, 3], 2)
            await asyncio.sleep(1.0)  # followers start fetching
            flight = (args.in_flight, False) if args.in_flight else (args.in_flight_per_broker, True)
            await bench.produce("single", args.partitions, 10, 1, *flight)  # warm-up
            await bench.produce("replicated", args.partitions, 10, -1, *flight)
            # Rounds alternate the two setups so that drifting background load (a shared 2-core
            # machine) weighs on both alike.
            single_s = repl_s = 0.0
            single_use: dict[int, list[float]] = {n: [0.0, 0.0] for n in brokers}  # node -> [CPU s, faults]
            repl_use: dict[int, list[float]] = {n: [0.0, 0.0] for n in brokers}
            round_ratios: list[float] = []
            per_round = max(1, args.batches // args.rounds)
            for _ in range(args.rounds):
                before = counters(brokers)
                one_single = await bench.produce("single", args.partitions, per_round, 1, *flight)
                middle = counters(brokers)
                one_repl = await bench.produce("replicated", args.partitions, per_round, -1, *flight)
                after = counters(brokers)
                single_s += one_single
                repl_s += one_repl
                round_ratios.append(one_single / one_repl)
                for use, (start, end) in ((single_use, (before, middle)), (repl_use, (middle, after))):
                    for node, (cpu, faults) in spent(start, end).items():
                        use[node][0] += cpu
                        use[node][1] += faults
            fetches = await fetch_requests(session, brokers)
            moves = await leader_moves(bench, args)
        records = max(1, args.batches // args.rounds) * args.rounds * PER_BATCH
        result = {
            "cpu_per_broker": args.cpu_per_broker or "unlimited",
            **({"broker_cgroups": {n: cpu_cgroup_of(b.proc.pid) for n, b in brokers.items()}} if quotas else {}),
            "in_flight": (f"{args.in_flight} in all" if args.in_flight
                          else f"{args.in_flight_per_broker} per leader broker"),
            "log": f"bounded at {args.retained_mb} MiB" if args.retained_mb > 0 else "unbounded (one growing segment)",
            "records_per_phase": records,
            "single_rf1_acks1_records_per_s": round(records / single_s),
            "replicated_rf3_acksall_records_per_s": round(records / repl_s),
            "replication_ratio": round(single_s / repl_s, 3),
            # each round's own ratio, lowest first: a single-broker round lasts ~0.1 s and its rate swings
            "replication_ratio_per_round": [round(r, 3) for r in sorted(round_ratios)],
            **cpu_figures(single_use, repl_use, records / PER_BATCH),
            "follower_fetches_per_replicated_batch": round(fetches / ((args.rounds * per_round + 10) * 2), 2),
            "single_mb_per_s": round(records * VALUE_BYTES / single_s / 1e6, 1),
            "replicated_mb_per_s": round(records * VALUE_BYTES / repl_s / 1e6, 1),
            **moves,
        }
        return result
    finally:
        for b in brokers.values():
            await asyncio.to_thread(stop_process, b.proc)
        await controller.close()
        if quotas is not None:
            for left in quotas.remove():
                print(f"fetcher.bench: could not remove cgroup {left}", file=sys.stderr)


def cpu_figures(single_use: dict[int, list[float]], repl_use: dict[int, list[float]],
                batches: float) -> dict[str, Any]:
    """The CPU and page-fault figures from each broker's ``[CPU seconds, faults]`` in the single phase
    (broker 4 alone leads) and the replicated phase (brokers 1-3).

    The single broker's figures are broker 4's own. What brokers 1-3 spend meanwhile is reported apart: their
    followers' fetches still expire and are sent again every ``replica.fetch.wait.max.ms``, which costs
    something when that wait is short (e.g. 10 ms with a large ``replica.fetch.min.bytes``)."""
    single_cpu, single_faults = single_use[4]
    idle_cpu = sum(single_use[n][0] for n in (1, 2, 3))
    repl_cpu, repl_faults = (sum(u[i] for u in repl_use.values()) for i in (0, 1))
    busiest = max(repl_use[n][0] for n in (1, 2, 3))
    return {
        "single_broker_cpu_ms_per_batch": round(single_cpu * 1000 / batches, 2),
        "idle_replicated_brokers_cpu_ms_per_single_batch": round(idle_cpu * 1000 / batches, 2),
        "replicated_brokers_cpu_ms_per_batch": round(repl_cpu * 1000 / batches, 2),
        "busiest_replicated_broker_cpu_ms_per_batch": round(busiest * 1000 / batches, 2),
        # Not the goal's figure, which is measured: what the ratio would be if each broker had a core of its
        # own and were bound by its CPU (as on Kafka's three machines), i.e. the single broker's CPU per
        # batch over the busiest replicated broker's. Here 3 brokers share 2 cores with the producer.
        # CPU time moves in 10 ms ticks: None when a short run shows none.
        "replication_ratio_estimate_one_core_per_broker": round(single_cpu / busiest, 3) if busiest else None,
        "single_broker_page_faults_per_batch": round(single_faults / batches, 1),
        "replicated_brokers_page_faults_per_batch": round(repl_faults / batches, 1),
    }


async def leader_moves(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """Move leadership of replicated-0 around while producing to it; collect first-append delays."""
    key = ("replicated", 0)
    stop = asyncio.Event()

    async def producer() -> None:
        while not stop.is_set():
            await bench.produce("replicated", 1, 1, -1, 1)

    task = asyncio.create_task(producer())
    sent_at: list[tuple[int, float]] = []
    try:
        for _ in range(args.moves):
            old = bench.leaders[key]
            new = 1 + old % 3
            sent_at.append((old, await bench.elect("replicated", 0, new, [1, 2, 3], 2)))
            await asyncio.sleep(args.move_interval_s)
    finally:
        stop.set()
        await task
    internal: list[float] = []
    external: list[float] = []
    for old, sent in sent_at:
        events = [e for e in bench.brokers[old].events("follower_first_append")
                  if e.get("topic") == "replicated" and e.get("partition") == 0]
        after = [e for e in events if _ts(e) >= sent - 0.001]
        if after:
            first = min(after, key=_ts)
            internal.append(float(first["since_added_ms"]))
            external.append((_ts(first) - sent) * 1000)
    return {
        "leader_moves": len(sent_at),
        "first_append_samples": len(internal),
        "median_added_to_first_append_ms": round(statistics.median(internal), 1) if internal else None,
        "median_leader_and_isr_sent_to_first_append_ms": round(statistics.median(external), 1) if external else None,
    }


def _ts(event: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fetcher.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=positive("--batches"), default=2000,
                        help="batches per phase (1000 records each); fewer make rounds of a few ms, "
                             "below the 10 ms tick of the CPU figures")
    parser.add_argument("--rounds", type=positive("--rounds"), default=5, help="alternating single/replicated rounds")
    parser.add_argument("--partitions", type=positive("--partitions"), default=3)
    parser.add_argument("--in-flight-per-broker", type=positive("--in-flight-per-broker"), default=5,
                        help="produce requests in flight to each leader broker (Kafka's producer default "
                             "max.in.flight.requests.per.connection: 5): 5 for the single broker, 15 for 3 leaders")
    parser.add_argument("--in-flight", type=non_negative("--in-flight"), default=0,
                        help="instead: this many produce requests in flight in all, for both setups "
                             "(the earlier default: 6)")
    parser.add_argument("--moves", type=non_negative("--moves"), default=10, help="leader moves in phase 3")
    parser.add_argument("--move-interval-s", type=non_negative_float("--move-interval-s"), default=0.5)
    parser.add_argument("--fetch-wait-ms", type=non_negative("--fetch-wait-ms"), default=500,
                        help="replica.fetch.wait.max.ms")
    parser.add_argument("--retained-mb", type=non_negative("--retained-mb"), default=256,
                        help="log.retention.bytes per partition in MiB, with segments of a quarter of it, at "
                             "most 64 MiB, as broker.bench (a broker's steady state); 0: one growing 1 GiB segment")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker config for every broker (repeatable), e.g. --set "
                             "replica.fetch.min.bytes=200000; applied last, so it wins over --fetch-wait-ms "
                             "and --retained-mb")
    parser.add_argument("--cpu-per-broker", type=non_negative_float("--cpu-per-broker"), default=0.0, metavar="CORES",
                        help="limit every broker process to this many CPUs (e.g. 0.5) with a cgroup CPU quota "
                             "(needs root, or a delegated cgroup: --cgroup-root): the same CPU for each broker in both "
                             "setups, as brokers on equal "
                             "machines of their own; 3 x CORES plus the producer should fit into the machine's "
                             "cores. Default: no limit")
    parser.add_argument("--cgroup-root", type=Path, default=CGROUP_ROOT, metavar="DIR",
                        help="where --cpu-per-broker makes its cgroups: cgroup v2, a cgroup whose cpu controller this "
                             "user may enable (root, or a subtree delegated to the user); v1, the directory "
                             "holding the cpu hierarchy (default: %(default)s)")
    parser.add_argument("--work-dir", type=Path, help="keep data dirs and broker logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    try:
        args.set = parse_assignments(args.set)
        broker_config(args.set)  # a typo or a bad value stops here, not in four broker processes
        if args.cpu_per_broker:
            quota_us(args.cpu_per_broker)
    except (ConfigError, ValueError) as exc:
        parser.error(str(exc))
    try:
        if args.work_dir is not None:
            args.work_dir.mkdir(parents=True, exist_ok=False)
            result = asyncio.run(run(args, args.work_dir))
        else:
            with tempfile.TemporaryDirectory(prefix="fetcher-bench-") as tmp:
                result = asyncio.run(run(args, Path(tmp)))
    except CpuQuotaError as exc:
        print(f"fetcher.bench: --cpu-per-broker: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
