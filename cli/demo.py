"""``minibroker demo``: the README's main job, end to end with real processes.

Starts a 3-broker cluster (controller + brokers on 127.0.0.1), creates an
RF=3 topic with ``min.insync.replicas=2``, produces with ``acks=all``,
SIGKILLs the leader of partition 0 while producing, keeps producing, consumes
everything from the beginning, prints a summary (acknowledged, consumed,
missing, the new leader) and stops the cluster. Exit status 0 only when every
acknowledged record was consumed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from cli import cluster
from cli.main import CliError
from common.cli_args import port, positive

TOPIC = "demo"
PARTITIONS = 3
# Detect the killed broker in ~3 s instead of Kafka's default 9 s, so the demo does not sit idle.
FAILOVER = ("broker.session.timeout.ms=3000", "broker.heartbeat.interval.ms=500")
BROKER_SETTINGS = (*FAILOVER, "replica.lag.time.max.ms=5000")


def say(text: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {text}", flush=True)


async def _leader_of(producer: Any, partition: int) -> tuple[int, int]:
    from common.wire import TopicPartition

    md = await producer.metadata.refresh(force=True)
    info = md.partitions[TopicPartition(TOPIC, partition)]
    return info.leader, info.leader_epoch


async def run_demo(spec: cluster.ClusterSpec, records: int) -> int:
    from client import Admin, Consumer, Producer, ProducerConfig
    from client.errors import error_name

    async with Admin(spec.controller.address) as admin:
        await admin.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
    say(f"created topic {TOPIC!r}: {PARTITIONS} partitions, replication factor 3, min.insync.replicas=2")

    acked: dict[str, tuple[int, int]] = {}
    failed: dict[str, str] = {}
    producer = Producer(spec.bootstrap, ProducerConfig(acks=-1, linger_ms=5, delivery_timeout_ms=60_000))
    await producer.start()
    await producer.metadata.wait_for_topic(TOPIC, 30_000)
    old_leader, old_epoch = await _leader_of(producer, 0)
    victim = spec.member(str(old_leader))

    def done(value: str, fut: Any) -> None:
        exc = fut.exception()
        if exc is None:
            meta = fut.result()
            acked[value] = (meta.partition, meta.offset)
        else:
            failed[value] = error_name(exc)

    killed = False
    say(f"producing {records} records with acks=all; broker {old_leader} leads {TOPIC}-0 (epoch {old_epoch})")
    for i in range(records):
        value = f"record-{i:06d}"
        fut = await producer.send(TOPIC, value.encode(), key=str(i).encode())
        fut.add_done_callback(functools.partial(done, value))
        if i % 50 == 49:
            await asyncio.sleep(0.01)  # a steady stream, so the kill lands mid-flight
        if not killed and i == records // 2:
            await producer.flush()
            cluster.send_signal(victim, signal.SIGKILL)
            killed = True
            say(f"SIGKILL broker {old_leader} (leader of {TOPIC}-0) after {len(acked)} acknowledged records; "
                "still producing")
    await producer.flush()
    await asyncio.sleep(0)
    new_leader, new_epoch = await _leader_of(producer, 0)
    await producer.close()
    say(f"acknowledged {len(acked)} of {records} records ({len(failed)} failed"
        + (f", e.g. {next(iter(failed.values()))}" if failed else "") + ")")

    consumer = Consumer(spec.bootstrap, auto_offset_reset="earliest")
    consumed: list[Any] = []
    try:
        await consumer.assign_topic(TOPIC)
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 5.0:
            batch = await consumer.poll(timeout_ms=500)
            if batch:
                consumed.extend(batch)
                idle_since = time.monotonic()
            if len({r.value for r in consumed}) >= len(acked) and not batch:
                break
    finally:
        await consumer.close()
    values = [(r.value or b"").decode() for r in consumed]
    missing = sorted(set(acked) - set(values))
    say(f"consumed {len(values)} records from the beginning ({len(set(values))} distinct, "
        f"{len(values) - len(set(values))} duplicates from retries)")
    print()
    print("summary")
    print(f"  acknowledged (acks=all): {len(acked)}")
    print(f"  not acknowledged:        {len(failed)}")
    print(f"  consumed:                {len(values)}")
    print(f"  acknowledged but lost:   {len(missing)}")
    print(f"  {TOPIC + '-0 leader:':<25}broker {old_leader} (epoch {old_epoch}) -> SIGKILL -> "
          f"broker {new_leader} (epoch {new_epoch})")
    if missing:
        print(f"  first missing: {missing[:5]}")
        return 1
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    temp = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="minibroker-demo-")) if temp else Path(args.data_dir)
    spec = cluster.plan(data_dir, 3, args.base_port, settings=BROKER_SETTINGS, controller_settings=FAILOVER)
    say(f"starting a controller on {spec.controller.address} and 3 brokers ({spec.bootstrap}); "
        f"logs in {spec.data_dir}")
    from cli.clients import configure_client_logging

    configure_client_logging()
    spec = cluster.up(spec, timeout_s=60)
    say("all 3 brokers registered with the controller")
    status = 1
    try:
        status = asyncio.run(run_demo(spec, args.records))
    except Exception as exc:
        from common.errors import MinibrokerError
        if isinstance(exc, MinibrokerError):
            raise CliError(f"demo failed: {exc}; logs in {spec.data_dir}", status=1) from None
        raise
    finally:
        say("stopping the cluster")
        cluster.stop_members(list(reversed(cluster.load(Path(spec.data_dir)).members)))
        if temp and not args.keep and status == 0:
            shutil.rmtree(data_dir, ignore_errors=True)
        elif status != 0:
            say(f"data and logs kept in {spec.data_dir}")
    say("done" if status == 0 else "FAILED: acknowledged records are missing")
    return status


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("demo", help="3 brokers, RF=3, kill the leader while producing, check nothing is lost",
                       description=__doc__)
    p.add_argument("--records", type=positive("--records"), default=4000, help="records to produce (default 4000)")
    p.add_argument("--base-port", type=port("--base-port"), default=19090,
                   help="controller port; brokers on base+1..3 (default 19090, away from a dev cluster on 9090)")
    p.add_argument("--data-dir", default=None, help="keep the cluster here (default: a temp dir, removed after)")
    p.add_argument("--keep", action="store_true", help="keep the temp data dir and logs")
    p.set_defaults(func=cmd_demo)
