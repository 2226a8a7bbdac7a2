"""``minibroker demo``: the README's main job, end to end with real processes.

Starts a 3-broker cluster (controller + brokers on 127.0.0.1), creates an
RF=3 topic with ``min.insync.replicas=2``, produces with ``acks=all``,
SIGKILLs the leader of partition 0 while producing, keeps producing, consumes
everything from the beginning, prints a summary (acknowledged, consumed,
missing, the new leader) and stops the cluster, brokers first. Exit status 0 only
when every acknowledged record was consumed. --data-dir must name an empty or new
directory (a second run there would find the first one's topic). Ctrl-C, SIGTERM
or SIGHUP stops the demo and its cluster (exit status 128 + the signal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from cli import cluster
from cli.main import CliError
from common import fsutil
from common.cli_args import port, positive

TOPIC = "demo"
PARTITIONS = 3
# Detect the killed broker in ~3 s instead of Kafka's default 9 s, so the demo does not sit idle.
FAILOVER = ("broker.session.timeout.ms=3000",)
BROKER_SETTINGS = (*FAILOVER, "broker.heartbeat.interval.ms=500", "replica.lag.time.max.ms=5000")


def say(text: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {text}", flush=True)


async def _leader_of(producer: Any, partition: int, *, other_than: int | None = None,
                     wait_s: float = 30.0) -> tuple[int, int]:
    """The partition's leader and leader epoch, from fresh metadata. Each refresh asks the next broker, and
    one may not know the topic yet (its UpdateMetadata still on the way) or may still name the killed
    leader, so this asks again (every 0.1 s, for at most ``wait_s``) until a leader other than
    ``other_than`` is named; then it gives what it last saw (-1: none)."""
    from common.wire import TopicPartition

    tp = TopicPartition(TOPIC, partition)
    deadline = time.monotonic() + wait_s
    while True:
        info = (await producer.metadata.refresh(force=True)).partitions.get(tp)
        if info is not None and info.leader >= 0 and info.leader != other_than:
            return info.leader, info.leader_epoch
        if time.monotonic() >= deadline:
            return (-1, -1) if info is None else (info.leader, info.leader_epoch)
        await asyncio.sleep(0.1)


async def run_demo(spec: cluster.ClusterSpec, records: int) -> int:
    from client import Admin, Producer, ProducerConfig

    async with Admin(spec.controller.address) as admin:
        await admin.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
    say(f"created topic {TOPIC!r}: {PARTITIONS} partitions, replication factor 3, min.insync.replicas=2")

    acked: dict[str, tuple[int, int]] = {}
    failed: dict[str, str] = {}
    producer = Producer(spec.bootstrap, ProducerConfig(acks=-1, linger_ms=5, delivery_timeout_ms=60_000))
    try:
        return await _produce_kill_consume(spec, records, producer, acked, failed)
    finally:  # on an early end too (Ctrl-C cancels this task): closed, bounded, its connections with it
        closing = asyncio.ensure_future(producer.close())
        await asyncio.wait([closing], timeout=5)
        if not closing.done():
            closing.cancel()
            await asyncio.wait([closing], timeout=5)
        if closing.done() and not closing.cancelled():
            closing.exception()


async def _produce_kill_consume(spec: cluster.ClusterSpec, records: int, producer: Any,
                                acked: dict[str, tuple[int, int]], failed: dict[str, str]) -> int:
    from client import Consumer
    from client.errors import error_name

    await producer.start()
    await producer.metadata.wait_for_topic(TOPIC, 30_000)
    old_leader, old_epoch = await _leader_of(producer, 0)
    if old_leader < 0:
        raise CliError(f"no broker named a leader of {TOPIC}-0 within 30 s")
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
    new_leader, new_epoch = await _leader_of(producer, 0, other_than=old_leader)
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


def check_data_dir(path: Path) -> None:
    """--data-dir is new or an empty directory: a second demo in one directory would find the first one's
    topic (TOPIC_ALREADY_EXISTS) after starting its cluster, so it is refused before anything starts."""
    if not os.path.lexists(path):
        return
    if not path.is_dir():
        raise CliError(f"--data-dir {path} exists and is not a directory")
    try:
        entries = os.listdir(path)
    except OSError as exc:
        raise CliError(f"cannot use --data-dir {path}: {exc.strerror or exc}") from None
    if entries:
        raise CliError(f"--data-dir {path} is not empty (an earlier demo's cluster?); the demo needs an empty "
                       "or new directory: remove it or name another")


STOPPING_NOTE = "[demo] already stopping the cluster; please wait"


def cmd_demo(args: argparse.Namespace) -> int:
    temp = args.data_dir is None
    if not temp:
        if not args.data_dir.strip():
            raise CliError("--data-dir must not be empty")
        check_data_dir(Path(args.data_dir))
    probe = cluster.plan(Path(args.data_dir or tempfile.gettempdir()), 3, args.base_port)
    for m in probe.members:  # a port in use: one line, before any directory is made
        if not cluster.port_free(m.host, m.port):
            raise CliError(f"port {m.port} ({m.name}) is already in use; pick another --base-port")
    data_dir = Path(tempfile.mkdtemp(prefix="minibroker-demo-")) if temp else Path(args.data_dir)
    spec = cluster.plan(data_dir, 3, args.base_port, settings=BROKER_SETTINGS, controller_settings=FAILOVER)
    say(f"starting a controller on {spec.controller.address} and 3 brokers ({spec.bootstrap}); "
        f"logs in {spec.data_dir}")
    from cli.clients import configure_client_logging

    configure_client_logging()
    with cluster.StopSignals(STOPPING_NOTE) as signals:
        try:
            spec = cluster.up(spec, timeout_s=60)  # a signal: up stops what it started
        except BaseException as exc:
            # a start that failed before any member wrote there leaves the temp dir empty: no trace of it;
            # once there are logs in the data dir (temp or not) it is kept, and named, as after a failed demo
            if temp:
                fsutil.remove_empty_dirs(data_dir, data_dir)
            with contextlib.suppress(OSError):
                if os.listdir(data_dir):
                    say(f"data and logs kept in {spec.data_dir}")
            if isinstance(exc, KeyboardInterrupt):
                say(f"stopped by {signals.name or 'a signal'} while starting the cluster")
                return signals.exit_status
            raise
        say("all 3 brokers registered with the controller")
        status = 1
        try:
            status = asyncio.run(_until_signal(run_demo(spec, args.records), signals))
        except Exception as exc:
            from common.errors import MinibrokerError
            if isinstance(exc, MinibrokerError):
                raise CliError(f"demo failed: {exc}; logs in {spec.data_dir}", status=1) from None
            raise
        finally:
            signals.raising = False  # a signal from here on only prints STOPPING_NOTE
            with contextlib.suppress(OSError):
                say("stopping the cluster")
            with cluster.cluster_lock(data_dir, required=False), contextlib.suppress(CliError):
                cluster.stop_cluster(cluster.load(data_dir))  # brokers first: their controlled shutdown
            if temp and not args.keep and status == 0 and signals.signum is None:
                shutil.rmtree(data_dir, ignore_errors=True)
            elif status != 0 or signals.signum is not None:
                with contextlib.suppress(OSError):
                    say(f"data and logs kept in {spec.data_dir}")
        if signals.signum is not None:
            say(f"stopped by {signals.name}")
            return signals.exit_status
    say("done" if status == 0 else "FAILED: acknowledged records are missing")
    return status


async def _until_signal(aw: Any, signals: cluster.StopSignals) -> int:
    """``await aw`` (the demo), cancelled by the first stop signal (Ctrl-C, SIGTERM, SIGHUP) so that it
    unwinds (its clients closed) instead of being cut anywhere by ``KeyboardInterrupt``."""
    task = asyncio.ensure_future(aw)
    loop = asyncio.get_running_loop()

    def wake() -> None:
        loop.call_soon_threadsafe(task.cancel)

    signals.raising = False
    signals.on_first = wake
    if signals.signum is not None:
        task.cancel()
    try:
        return int(await task)
    except asyncio.CancelledError:
        if signals.signum is None:
            raise
        return 1
    finally:
        signals.on_first = None


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("demo", help="3 brokers, RF=3, kill the leader while producing, check nothing is lost",
                       description=__doc__)
    p.add_argument("--records", type=positive("--records"), default=4000, help="records to produce (default 4000)")
    p.add_argument("--base-port", type=port("--base-port"), default=19090,
                   help="controller port; brokers on base+1..3 (default 19090, away from a dev cluster on 9090)")
    p.add_argument("--data-dir", default=None,
                   help="an empty or new directory to keep the cluster in (refused if not empty; default: a temp "
                        "dir, removed after a successful run)")
    p.add_argument("--keep", action="store_true", help="keep the temp data dir and logs")
    p.set_defaults(func=cmd_demo)
