"""``minibroker chaos run``: a workload under a seeded nemesis, recorded as a history.

    minibroker chaos run [--duration S] [--data-dir DIR] [--out DIR] [--seed N]
                         [--faults kill,term,pause,controller,partition] [--brokers 3] [--partitions 3]

Starts a local cluster in ``--data-dir`` (``cli.cluster``; or uses the one
running there), creates an RF=3, min.insync.replicas=2 topic and runs, for
``--duration`` seconds:

- producers sending unique values (``<process>-<n>``) with acks=all (so
  idempotent, the producer's default, when the brokers support it), every
  attempt recorded with its outcome (``audit.history``): ``ok`` with partition
  and offset, ``fail`` when the producer knows nothing was written (every
  attempt was refused before an append, or none was sent:
  ``client.errors.is_definite_failure``), else ``info`` (indeterminate: a
  timeout or lost connection may hide an append), as Jepsen records them.
- a consumer polling every partition from the beginning, recording each record.
- a nemesis on a schedule drawn from ``--seed`` (``schedule`` is pure):
  ``kill`` SIGKILL a random broker or the current leader of a partition, then
  restart it; ``term`` SIGTERM (graceful bounce) and restart; ``pause``
  SIGSTOP a broker longer than the session timeout (a zombie leader), then
  SIGCONT; ``controller`` SIGKILL the controller, then restart it; ``leaders``
  (not in the default list) SIGKILL a partition's leader, then each successor,
  until all its replicas are down, and restart them stalest first: with
  ``--unclean`` this is the scenario where Kafka loses acknowledged writes.
  ``partition`` (not in the default list; needs root and iproute2) cuts a random
  broker or the current leader of a partition off the network for 2 s to
  session timeout + 3 s, then reconnects it.

With ``partition`` the run builds Linux network namespaces (``cli.netns``):
one per member and one for the client workload, joined by a bridge in a hub
namespace, addresses in the private test subnet 10.213.0.0/24, nothing
attached to the root namespace. It starts a fresh cluster whose members run
under ``ip netns exec``, re-executes itself inside the client namespace for
the workload and nemesis, and removes every namespace at the end (also when
the run fails). A partition sets the target's port on the bridge down: it
reaches no one and no one reaches it (controller, brokers, clients alike).
Asking for it without root or ``ip netns`` is an error, not a silent no-op.

At the end it heals everything (SIGCONT, restart what is down), waits for
every ISR to be full, final-reads every partition (process ``final``), prints
a summary (acked, failed, indeterminate, faults, elections seen) and writes
``history.jsonl`` and ``summary.json`` into ``--out``. A cluster the run
started is stopped gracefully afterwards (exact HW checkpoints for the
export) unless ``--keep-running``.

Ctrl-C, SIGTERM or SIGHUP ends a run early: the producers and the consumer
stop (bounded; a send without an outcome is recorded ``info``), the fault in
progress is undone and everything healed as at the normal end, a cluster the
run started is stopped, the history is closed whole (no summary), and the exit
status is 128 + the signal (Ctrl-C: 130). A second signal only says that the
cleanup is under way. ``--duration`` is at most a week (the schedule is drawn
up front). Against a cluster running already, pauses are drawn from the
session timeout its cluster.json records for the controller.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from audit.history import HistoryWriter, NemesisEvent, Outcome, PollEvent, SendEvent
from cli import cluster as cl
from cli import netns
from cli.main import CliError
from common.cli_args import port, positive, positive_float
from common.config import ConfigError, controller_config, parse_assignments

FAULTS = ("kill", "term", "pause", "controller", "leaders", "partition")
DEFAULT_FAULTS = ("kill", "term", "pause", "controller")
TOPIC = "chaos"
# the fault schedule is drawn up front (a fault every few seconds): a week of it is ~10^5 faults
MAX_DURATION_S = 7 * 24 * 3600
DEFAULT_SESSION_TIMEOUT_MS = 6_000
SESSION_TIMEOUT = "broker.session.timeout.ms"


# ---------------------------------------------------------------- the schedule (pure)

@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float  # seconds after the workload starts
    kind: str
    target: str  # "broker-<i>", "leader" (resolved when it fires) or "controller"
    hold_s: float  # how long the member stays down / paused


def schedule(seed: int, duration_s: float, faults: tuple[str, ...], brokers: list[str], *,
             session_timeout_s: float, interval_s: tuple[float, float] = (3.0, 6.0),
             settle_s: float = 5.0) -> list[Fault]:
    """Faults from ``seed``: one at a time, each healed before the next; none in the last ``settle_s``."""
    rng = random.Random(seed)
    out: list[Fault] = []
    t = rng.uniform(*interval_s)
    while True:
        kind = rng.choice(faults)
        if kind == "controller":
            target, hold = "controller", rng.uniform(1.0, 3.0)
        elif kind == "pause":
            target, hold = rng.choice(brokers), session_timeout_s + rng.uniform(1.0, 3.0)
        elif kind == "leaders":
            target, hold = "leader", rng.uniform(2.0, 4.0)
        elif kind == "partition":
            target, hold = rng.choice([*brokers, "leader"]), rng.uniform(2.0, session_timeout_s + 3.0)
        else:
            target = rng.choice([*brokers, "leader"])
            hold = rng.uniform(1.0, 4.0)
        if t + hold > duration_s - settle_s:
            return out
        out.append(Fault(round(t, 2), kind, target, round(hold, 2)))
        t += hold + rng.uniform(*interval_s)


# ---------------------------------------------------------------- the run

@dataclass
class Stats:
    acked: int = 0
    failed: int = 0  # definite failures: the producer knows nothing of the send was written
    indeterminate: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    polled: int = 0
    final_read: int = 0
    faults: list[str] = field(default_factory=list)


class Recorder:
    """The history file plus per-process sequence numbers and counts."""

    def __init__(self, path: Path, stats: Stats) -> None:
        self.writer = HistoryWriter(path)
        self.stats = stats
        self._seq: Counter[str] = Counter()
        self.closed = False

    def close(self) -> None:
        """Close the file; a delivery callback that fires later is not written (the file stays whole)."""
        self.closed = True
        self.writer.close()

    def write(self, event: SendEvent | PollEvent | NemesisEvent) -> None:
        if not self.closed:
            self.writer.write(event)

    def seq(self, process: str) -> int:
        self._seq[process] += 1
        return self._seq[process] - 1

    def send(self, process: str, value: str, start_ms: int, fut: Any) -> None:
        now = int(time.time() * 1000)
        exc = fut.exception()
        if exc is None:
            md = fut.result()
            self.stats.acked += 1
            event = SendEvent(process, self.seq(process), TOPIC, None, value, start_ms, now, Outcome.OK,
                              md.partition, md.offset)
        else:
            from client.errors import error_name, is_definite_failure

            name = error_name(exc)
            definite = is_definite_failure(exc)
            if definite:
                self.stats.failed += 1
            else:
                self.stats.indeterminate += 1
            self.stats.errors[name] += 1
            event = SendEvent(process, self.seq(process), TOPIC, None, value, start_ms, now,
                              Outcome.FAIL if definite else Outcome.INFO, error=name)
        self.write(event)

    def indeterminate(self, process: str, value: str, start_ms: int, error: str) -> None:
        """A send whose outcome is unknown (``info``): it failed to queue, or the run ended before it did."""
        self.stats.indeterminate += 1
        self.write(SendEvent(process, self.seq(process), TOPIC, None, value, start_ms, int(time.time() * 1000),
                             Outcome.INFO, error=error))

    def poll(self, process: str, r: Any) -> None:
        self.write(PollEvent(process, self.seq(process), r.topic, r.partition, r.offset,
                                    None, r.value.decode("utf-8", "replace") if r.value is not None else None,
                                    int(time.time() * 1000)))

    def nemesis(self, fault: str, target: str, detail: str) -> None:
        self.write(NemesisEvent(int(time.time() * 1000), fault, target, detail))


# ---------------------------------------------------------------- bounded waits

async def _wait_event(event: asyncio.Event, seconds: float) -> None:
    """Until ``event`` is set, for at most ``seconds``."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=seconds)


def _retrieve(tasks: list[asyncio.Task[Any]]) -> None:
    """Mark the outcome of finished tasks as seen (no "exception was never retrieved" at exit)."""
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()


async def _finish(tasks: list[asyncio.Task[Any]], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``tasks``; cancel what is left and give it a few seconds to unwind."""
    pending = [t for t in tasks if not t.done()]
    if pending:
        _, left = await asyncio.wait(pending, timeout=timeout_s)
        for t in left:
            t.cancel()
        if left:
            await asyncio.wait(left, timeout=10)
    _retrieve(tasks)


class _Interrupted(Exception):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) ended the run early."""


async def _unless_interrupted(aw: Any, interrupted: asyncio.Event) -> Any:
    """``await aw``, unless ``interrupted`` is set first: then cancel it and raise ``_Interrupted``."""
    task = asyncio.ensure_future(aw)
    if not interrupted.is_set():
        waiter = asyncio.ensure_future(interrupted.wait())
        try:
            await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait([task], timeout=10)
    _retrieve([task])
    raise _Interrupted


async def producer(name: str, bootstrap: str, rec: Recorder, stop: asyncio.Event, inflight: int,
                   quit_sending: asyncio.Event | None = None) -> None:
    """Send until ``stop``, then wait (bounded) for the outcome of every send. ``quit_sending`` (the run was
    interrupted) cuts that wait short; a send still without an outcome then is recorded ``info``, so that the
    history holds an outcome for every attempt. Cancelling the task does the same."""
    from client.producer import Producer, ProducerConfig

    quit_sending = quit_sending or asyncio.Event()
    # enable.idempotence is left to its default: on with acks=all, so the audit holds these producers to no
    # duplicates (DESIGN.md invariant 6); against brokers without init_producer_id the producer warns and
    # goes on without it. The outcomes are recorded as before: the idempotent producer's own refusals
    # (OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH) are `info`, a send that waited in vain for a
    # producer id (never sent) is `fail`. The history's send events have no producer id field to record.
    cfg = ProducerConfig(acks=-1, linger_ms=5, request_timeout_ms=5_000, delivery_timeout_ms=20_000,
                         retry_backoff_ms=200)
    sem = asyncio.Semaphore(inflight)
    n = 0
    open_sends: dict[str, int] = {}  # value -> start_ms of each attempt with no outcome recorded yet
    p = Producer(bootstrap, cfg)
    try:
        await p.start()
        while not stop.is_set():
            await sem.acquire()
            value = f"{name}-{n}"
            n += 1
            start_ms = int(time.time() * 1000)
            open_sends[value] = start_ms  # before send: cancelled inside it, the record may be queued already
            try:
                fut = await asyncio.wait_for(p.send(TOPIC, value.encode()), timeout=30)
            except Exception as exc:  # recorded as an indeterminate attempt
                del open_sends[value]
                rec.indeterminate(name, value, start_ms, type(exc).__name__)
                sem.release()
                await asyncio.sleep(0.2)
                continue

            def done(f: Any, value: str = value, start_ms: int = start_ms) -> None:
                if open_sends.pop(value, None) is None:
                    return  # recorded as interrupted already
                rec.send(name, value, start_ms, f)
                sem.release()

            fut.add_done_callback(done)
        flush = asyncio.ensure_future(p.flush())
        quitting = asyncio.ensure_future(quit_sending.wait())
        await asyncio.wait([flush, quitting], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        quitting.cancel()
        flush.cancel()
        await asyncio.wait([flush])
        _retrieve([flush])
    finally:
        # close (bounded): queued sends fail, connections close; cancelled while it waits for sends in flight,
        # close stops the sender and fails what is left
        closing = asyncio.ensure_future(p.close())
        cancelled = False
        try:
            await asyncio.wait([closing], timeout=2 if quit_sending.is_set() else 30)
        except asyncio.CancelledError:  # cancelled while closing: close quickly, record, then stay cancelled
            cancelled = True
        if not closing.done():
            closing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([closing], timeout=10)
        _retrieve([closing])
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)  # the delivery callbacks close scheduled
        for value, start_ms in list(open_sends.items()):
            rec.indeterminate(name, value, start_ms, "Interrupted")
        open_sends.clear()
        if cancelled:
            raise asyncio.CancelledError


async def consumer(name: str, bootstrap: str, rec: Recorder, stop: asyncio.Event, *,
                   until: dict[int, int] | None = None, timeout_s: float = 3600) -> int:
    """Poll every partition from the beginning; with ``until``, stop when each position reaches it."""
    from client.consumer import Consumer

    count = 0
    deadline = time.monotonic() + timeout_s
    async with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200) as c:
        tps = await c.assign_topic(TOPIC)
        await c.seek_to_beginning(*tps)
        last: dict[int, int] = {}
        while not stop.is_set() and time.monotonic() < deadline:
            if until is not None and all(last.get(p, -1) + 1 >= end for p, end in until.items()):
                break
            try:
                records = await c.poll(timeout_ms=500)
            except Exception:  # a failed poll during faults: retry
                await asyncio.sleep(0.2)
                continue
            for r in records:
                rec.poll(name, r)
                last[r.partition] = r.offset
                count += 1
    return count


async def describe(controller: str) -> list[dict[str, Any]]:
    from client.admin import Admin

    async with Admin(controller, timeout_ms=3_000) as a:
        doc = await a.describe([TOPIC])
    return list(doc["topics"][0]["partitions"]) if doc.get("topics") else []


def _spec(data_dir: Path) -> cl.ClusterSpec:
    return cl.load(data_dir)


def _restart(data_dir: Path, name: str) -> None:
    """Start ``name`` again unless it runs: under the cluster lock (no `cluster start` racing it for
    cluster.json), recorded there before a Ctrl-C is handled (``cl.start_member``)."""
    with contextlib.suppress(CliError), cl.cluster_lock(data_dir):
        spec = _spec(data_dir)
        m = spec.member(name)
        if not cl.is_running(m):
            cl.start_member(spec, m)


async def _resolve(fault: Fault, controller: str, rng: random.Random) -> str:
    if fault.target != "leader":
        return fault.target
    with contextlib.suppress(Exception):
        parts = [p for p in await describe(controller) if p["leader"] >= 0]
        if parts:
            return f"broker-{rng.choice(parts)['leader']}"
    return "broker-1"


def _say(line: str) -> None:
    """A progress line; a closed stdout (the terminal went away: SIGHUP) does not stop the run's cleanup."""
    with contextlib.suppress(OSError, ValueError):
        print(line, flush=True)


async def nemesis(data_dir: Path, plan: list[Fault], rec: Recorder, stop: asyncio.Event, seed: int,
                  end_faults: asyncio.Event | None = None) -> None:
    """Inject ``plan`` until ``stop``; each fault is undone after its hold, at once when ``end_faults`` is set
    (the run was interrupted: a paused broker gets SIGCONT, a stopped one is restarted)."""
    end_faults = end_faults or asyncio.Event()
    rng = random.Random(seed + 1)
    t0 = time.monotonic()
    for fault in plan:
        delay = t0 + fault.at_s - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
        if stop.is_set():
            return
        if fault.kind == "leaders":
            await kill_leaders(data_dir, fault, rec, t0, rng, end_faults)
            continue
        if fault.kind == "partition":
            await partition_fault(data_dir, fault, rec, t0, rng, end_faults)
            continue
        spec = _spec(data_dir)
        target = await _resolve(fault, spec.controller.address, rng)
        m = spec.member(target)
        sig = {"kill": signal.SIGKILL, "controller": signal.SIGKILL, "term": signal.SIGTERM,
               "pause": signal.SIGSTOP}[fault.kind]
        sent = cl.send_signal(m, sig)
        line = f"[{time.monotonic() - t0:6.1f}s] {fault.kind:<10} {m.name} ({sig.name}, hold {fault.hold_s:.1f}s)"
        _say(line + ("" if sent else " -- not running"))
        rec.nemesis(fault.kind, m.name, f"{sig.name} hold_s={fault.hold_s}")
        rec.stats.faults.append(f"{fault.kind}:{m.name}")
        await _wait_event(end_faults, fault.hold_s)
        if fault.kind == "pause":
            cl.send_signal(m, signal.SIGCONT)
        elif fault.kind == "term":
            began = time.monotonic()  # controlled shutdown may take a while; less patience once interrupted
            while cl.is_running(m) and time.monotonic() - began < (10 if end_faults.is_set() else 40):
                cl.reap()
                await asyncio.sleep(0.2)
            if cl.is_running(m):
                cl.send_signal(m, signal.SIGKILL)
                await asyncio.sleep(0.5)
        if fault.kind != "pause":
            cl.reap()
            _restart(data_dir, m.name)
        rec.nemesis("heal", m.name, "SIGCONT" if fault.kind == "pause" else "restarted")


async def kill_leaders(data_dir: Path, fault: Fault, rec: Recorder, t0: float, rng: random.Random,
                       end_faults: asyncio.Event | None = None) -> None:
    """Aggressive: SIGKILL one partition's leader, then its successor, until every replica is down;
    restart them stalest first. With unclean.leader.election.enable the first one back may be elected
    out of sync, and acknowledged writes held only by the others are truncated away. ``end_faults`` ends the
    chain and the hold at once."""
    end_faults = end_faults or asyncio.Event()
    spec = _spec(data_dir)
    victims: list[str] = []
    partition: int | None = None
    for _ in range(len(spec.brokers)):
        # the controller moves leadership only once it fences the dead broker (session timeout): wait for it
        leader = -1
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not end_faults.is_set():
            with contextlib.suppress(Exception):
                parts = [p for p in await describe(spec.controller.address) if p["leader"] >= 0]
                if partition is None and parts:
                    partition = rng.choice(parts)["partition"]
                leader = next((p["leader"] for p in parts if p["partition"] == partition), -1)
                if leader >= 0 and f"broker-{leader}" not in victims:
                    break
            leader = -1
            await _wait_event(end_faults, 0.5)
        if leader < 0:
            break  # offline (no eligible replica left) or no answer: stop the chain here
        m = spec.member(f"broker-{leader}")
        cl.send_signal(m, signal.SIGKILL)
        victims.append(m.name)
        _say(f"[{time.monotonic() - t0:6.1f}s] leaders    {m.name} (SIGKILL, leader of {TOPIC}-{partition})")
        rec.nemesis("leaders", m.name, f"SIGKILL leader of partition {partition}")
        rec.stats.faults.append(f"leaders:{m.name}")
    await _wait_event(end_faults, fault.hold_s)
    cl.reap()
    for name in victims:  # the stalest first
        _restart(data_dir, name)
        rec.nemesis("heal", name, "restarted")
        await _wait_event(end_faults, 2.0)


_NET: netns.NetPlan | None = None  # set when this run executes inside the client namespace


async def partition_fault(data_dir: Path, fault: Fault, rec: Recorder, t0: float, rng: random.Random,
                          end_faults: asyncio.Event | None = None) -> None:
    """Cut one broker off the hub bridge for ``hold_s`` (less once ``end_faults`` is set), then reconnect it."""
    end_faults = end_faults or asyncio.Event()
    if _NET is None:
        raise CliError("a partition fault needs the network namespaces of `chaos run --faults partition`")
    spec = _spec(data_dir)
    m = spec.member(await _resolve(fault, spec.controller.address, rng))
    try:
        await asyncio.to_thread(netns.partition, _NET, m.name)
    except CliError as exc:
        _say(f"[{time.monotonic() - t0:6.1f}s] partition  {m.name} -- failed: {exc}")
        return
    _say(f"[{time.monotonic() - t0:6.1f}s] partition  {m.name} (isolated {m.host}, hold {fault.hold_s:.1f}s)")
    rec.nemesis("partition", m.name, f"isolated {m.host} from every namespace hold_s={fault.hold_s}")
    rec.stats.faults.append(f"partition:{m.name}")
    try:
        await _wait_event(end_faults, fault.hold_s)
    finally:
        await asyncio.to_thread(netns.heal, _NET, m.name)
    rec.nemesis("heal", m.name, "reconnected")


def heal(data_dir: Path) -> None:
    if _NET is not None:
        netns.heal(_NET)
    for m in _spec(data_dir).members:
        cl.send_signal(m, signal.SIGCONT)
    cl.reap()
    for m in _spec(data_dir).members:
        _restart(data_dir, m.name)


async def wait_full_isr(controller: str, rf: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            parts = await describe(controller)
            if parts and all(len(p["isr"]) == rf and p["leader"] >= 0 for p in parts):
                return True
        await asyncio.sleep(0.5)
    return False


async def final_offsets(bootstrap: str) -> dict[int, int]:
    from client.consumer import Consumer

    async with Consumer(bootstrap) as c:
        tps = await c.assign_topic(TOPIC)
        ends = await c.end_offsets(tps)
    return {tp.partition: off for tp, off in ends.items()}


async def create_topic(controller: str, partitions: int, unclean: bool) -> None:
    from client.admin import Admin, NewTopic
    from common.errors import ErrorCode

    configs = {"min.insync.replicas": "2", "unclean.leader.election.enable": str(unclean).lower()}
    deadline = time.monotonic() + 30
    async with Admin(controller) as a:
        while True:
            result = await a.create_topics([NewTopic(TOPIC, partitions, 3, configs)])
            code, msg = result.get(TOPIC, (ErrorCode.UNKNOWN_SERVER_ERROR, "no answer"))
            if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                return
            if time.monotonic() > deadline:
                raise CliError(f"cannot create topic {TOPIC}: {code.name} {msg}")
            await asyncio.sleep(0.5)


async def workload(args: argparse.Namespace, data_dir: Path, out: Path, plan: list[Fault],
                   signals: cl.StopSignals | None = None) -> dict[str, Any] | None:
    """The run: the summary, or None when a stop signal (``signals``: Ctrl-C, SIGTERM, SIGHUP) ended it early.
    Then, in order and each step bounded: the producers and the consumer stop (a send with no outcome yet is
    recorded ``info``), the nemesis undoes its fault, everything is healed (SIGCONT, restart what is down, as
    at a normal end), and the history file is closed whole."""
    spec = _spec(data_dir)
    stats = Stats()
    try:
        rec = Recorder(out / "history.jsonl", stats)
    except OSError as exc:
        raise CliError(f"cannot write {out / 'history.jsonl'}: {exc.strerror or exc}") from None
    interrupted = asyncio.Event()
    stop = asyncio.Event()  # producers send no more, the nemesis injects no more
    consumer_stop = asyncio.Event()
    quit_sending = asyncio.Event()  # producers wait no longer for the outcome of their last sends
    end_faults = asyncio.Event()  # the nemesis ends its hold now and undoes its fault

    def on_interrupt() -> None:
        for event in (interrupted, stop, consumer_stop, quit_sending):
            event.set()

    if signals is not None:  # from here on a signal sets `interrupted` instead of raising KeyboardInterrupt
        loop = asyncio.get_running_loop()

        def wake() -> None:  # called in the signal handler: schedule, do not run, the loop's work
            loop.call_soon_threadsafe(on_interrupt)

        signals.raising = False
        signals.on_first = wake
        if signals.signum is not None:
            on_interrupt()
    tasks: list[asyncio.Task[None]] = []
    reader: asyncio.Task[int] | None = None
    nem: asyncio.Task[None] | None = None
    faults_healed = False
    try:
        await _unless_interrupted(create_topic(spec.controller.address, args.partitions, args.unclean), interrupted)
        await _unless_interrupted(wait_full_isr(spec.controller.address, 3, 30), interrupted)
        before = {p["partition"]: p["leader_epoch"]
                  for p in await _unless_interrupted(describe(spec.controller.address), interrupted)}
        tasks = [asyncio.create_task(producer(f"p{i}", spec.bootstrap, rec, stop, args.inflight, quit_sending))
                 for i in range(args.producers)]
        reader = asyncio.create_task(consumer("c0", spec.bootstrap, rec, consumer_stop))
        nem = asyncio.create_task(nemesis(data_dir, plan, rec, stop, args.seed, end_faults))
        await _wait_event(interrupted, args.duration)
        stop.set()
        if interrupted.is_set():
            raise _Interrupted
        await _unless_interrupted(asyncio.wait([nem]), interrupted)  # its last fault undone
        _retrieve([nem])
        heal(data_dir)
        faults_healed = True
        await _unless_interrupted(asyncio.wait(tasks), interrupted)  # their sends drained (bounded in producer)
        _retrieve(tasks)
        healed = await _unless_interrupted(wait_full_isr(spec.controller.address, 3, args.heal_timeout), interrupted)
        ends = await _unless_interrupted(final_offsets(spec.bootstrap), interrupted)
        consumer_stop.set()
        stats.polled = await _unless_interrupted(asyncio.shield(reader), interrupted)
        stats.final_read = await _unless_interrupted(
            consumer("final", spec.bootstrap, rec, interrupted, until=ends, timeout_s=args.heal_timeout), interrupted)
        after = await _unless_interrupted(describe(spec.controller.address), interrupted)
    except _Interrupted:
        return None
    finally:
        try:
            stop.set()
            consumer_stop.set()
            quit_sending.set()  # after a normal end every producer is done already
            # the workload first (producers, consumer), then the faults: the order of a normal end
            await _finish([*tasks, *([reader] if reader else [])], 5 if interrupted.is_set() else 60)
            end_faults.set()
            if nem is not None:
                await _finish([nem], 30)
                if not faults_healed:
                    heal(data_dir)
        finally:
            if signals is not None:
                signals.on_first = None
            rec.close()
    elections = sum(max(0, p["leader_epoch"] - before.get(p["partition"], 0)) for p in after)
    return {"seed": args.seed, "duration_s": args.duration, "faults_requested": args.faults,
            "session_timeout_ms": args.session_timeout_ms,
            "acked": stats.acked, "failed": stats.failed, "indeterminate": stats.indeterminate,
            "errors": dict(stats.errors), "faults_injected": len(stats.faults), "faults": stats.faults,
            "elections_seen": elections, "isr_full_at_end": healed, "end_offsets": ends,
            "polled": stats.polled, "final_read": stats.final_read,
            "schedule": [asdict(f) for f in plan], "history": str(out / "history.jsonl")}


# ---------------------------------------------------------------- command

def _faults(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in FAULTS]
    if bad or not kinds:
        raise CliError(f"--faults takes a comma list of {', '.join(FAULTS)}; got {text!r}")
    return kinds


# what a run writes into --out
OUT_FILES = ("history.jsonl", "summary.json")


def _check_creatable(path: Path, flag: str) -> None:
    """``path`` is a directory, or one can be made there (checked without creating anything)."""
    for p in (path, *path.parents):
        try:
            st = os.stat(p)
        except (FileNotFoundError, NotADirectoryError):
            if not os.path.lexists(p):  # else a dangling symlink: no directory can be made there
                continue
            is_dir = False
        except OSError as exc:
            raise CliError(f"cannot use {flag} {path}: {p}: {exc.strerror or exc}") from None
        else:
            is_dir = stat.S_ISDIR(st.st_mode)
        if p == path:
            if not is_dir:
                raise CliError(f"{flag} {path} exists and is not a directory")
        elif not is_dir:
            raise CliError(f"cannot create {flag} {path}: {p} is not a directory")
        elif not os.access(p, os.W_OK | os.X_OK):
            raise CliError(f"cannot create {flag} {path}: no permission to write in {p}")
        return


def check_out(out: Path) -> None:
    """``--out`` is a directory or can be made one, and the files the run writes there can be written: all
    checked before any cluster starts (once a summary.json that was a directory failed only after the run)."""
    _check_creatable(out, "--out")
    if not out.is_dir():
        return
    if not os.access(out, os.W_OK | os.X_OK):
        raise CliError(f"cannot write into --out {out}: permission denied")
    for name in OUT_FILES:
        f = out / name
        if f.is_dir():
            raise CliError(f"--out {out}: {name} there is a directory; choose another --out")
        if f.is_symlink() and not f.exists():
            raise CliError(f"--out {out}: {name} there is a dangling symlink; choose another --out")
    if (out / "history.jsonl").exists():
        raise CliError(f"{out} already holds a history.jsonl; choose another --out")
    summary = out / "summary.json"
    if summary.exists() and not os.access(summary, os.W_OK):
        raise CliError(f"cannot write {summary}: permission denied")


def _broker_settings(args: argparse.Namespace) -> list[str]:
    # A bounded controlled shutdown keeps SIGTERM bounces and the final stop short: when every broker
    # stops at once leadership has nowhere to go and Kafka's 30 s default would be waited out.
    # Heartbeats at most a third of the session timeout apart (Kafka's defaults: 2 s against 9 s): with a short
    # --session-timeout-ms the brokers' default interval would let every session lapse between heartbeats.
    # Also the brokers' own session timeout, which bounds how long they wait for a heartbeat's answer.
    session_ms = args.session_timeout_ms
    heartbeat = [f"broker.heartbeat.interval.ms={max(1, min(2_000, session_ms // 3))}",
                 f"broker.session.timeout.ms={session_ms}"]
    return ["controlled.shutdown.max.wait.ms=5000", *heartbeat, *args.set]


def _cluster_to_start(args: argparse.Namespace, data_dir: Path) -> cl.ClusterSpec | None:
    """The cluster this run would start in ``data_dir``, checked (settings, data dir, commands, ports) but
    not started; None when a cluster is running there already and is to be used."""
    if (data_dir / cl.CLUSTER_FILE).exists():
        spec = cl.load(data_dir)
        if all(cl.is_running(m) for m in spec.members):
            return None
        if any(cl.is_running(m) for m in spec.members):
            raise CliError(f"the cluster in {data_dir} is partly running; `minibroker cluster down` first")
    controller_settings = [f"broker.session.timeout.ms={args.session_timeout_ms}"]
    spec = cl.plan(data_dir, args.brokers, args.base_port, settings=_broker_settings(args),
                   controller_settings=controller_settings)
    if _NET is not None:  # every member in its own namespace, on its address there
        net = _NET
        spec = replace(spec, host=net.node("controller").address,
                       members=tuple(replace(m, host=net.node(m.name).address, netns=net.node(m.name).ns)
                                     for m in spec.members))
    _check_creatable(data_dir, "--data-dir")
    cl.preflight(spec)
    return spec


def _ensure_cluster(data_dir: Path, spec: cl.ClusterSpec | None) -> bool:
    """Use the cluster running in ``data_dir`` (``spec`` None), or start ``spec``; True if this run started it."""
    if spec is None:
        print(f"using the cluster running in {data_dir}", flush=True)
        return False
    print(f"starting a cluster of {len(spec.brokers)} brokers in {data_dir}", flush=True)
    cl.up(spec, timeout_s=60)
    return True


def _inner_argv(args: argparse.Namespace, data_dir: Path, out: Path) -> list[str]:
    """This run's options, for re-executing it inside the client namespace."""
    argv = ["chaos", "run", "--duration", str(args.duration), "--data-dir", str(data_dir), "--out", str(out),
            "--seed", str(args.seed), "--faults", args.faults, "--brokers", str(args.brokers),
            "--partitions", str(args.partitions), "--producers", str(args.producers),
            "--inflight", str(args.inflight), "--base-port", str(args.base_port),
            "--session-timeout-ms", str(args.session_timeout_ms), "--heal-timeout", str(args.heal_timeout)]
    if args.unclean:
        argv.append("--unclean")
    for item in args.set:
        argv += ["--set", item]
    return argv


def _check_namespaced_run(args: argparse.Namespace, data_dir: Path) -> None:
    """What the outer run of ``--faults partition`` checks before it creates anything."""
    if args.keep_running:
        raise CliError("--keep-running cannot be combined with --faults partition (the namespaces are removed)")
    _check_creatable(data_dir, "--data-dir")
    if (data_dir / cl.CLUSTER_FILE).exists() and any(cl.is_running(m) for m in cl.load(data_dir).members):
        raise CliError(f"--faults partition starts its own cluster, but one is running in {data_dir}")
    cl.check_settings(_broker_settings(args), [])


def _run_in_namespaces(args: argparse.Namespace, data_dir: Path, out: Path) -> int:
    """Create the namespaces, run this command again inside the client one, always remove them."""
    _check_namespaced_run(args, data_dir)
    net = netns.plan(str(os.getpid()), netns.chaos_roles(args.brokers))
    print(f"network namespaces {net.hub}, {', '.join(n.ns for n in net.nodes)} (10.213.0.0/24)", flush=True)

    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    proc: subprocess.Popen[bytes] | None = None
    try:
        netns.create(net)
        argv = [*netns.exec_prefix(net.node("client").ns), *cl.minibroker_argv(), *_inner_argv(args, data_dir, out)]
        proc = subprocess.Popen(argv, env={**os.environ, netns.ENV: net.to_json()})
        return proc.wait()
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if (data_dir / cl.CLUSTER_FILE).exists():  # whatever the inner run left running (by recorded pid)
            cl.stop_cluster(cl.load(data_dir), timeout_s=20, controller_timeout_s=10)
        left = netns.destroy(net)
        signal.signal(signal.SIGTERM, previous)
        if left:
            print(f"warning: could not remove network namespaces {', '.join(left)}", file=sys.stderr)


def _session_timeout_ms(args: argparse.Namespace, data_dir: Path, starting: bool, explicit: bool) -> int:
    """The controller's broker.session.timeout.ms, which a pause must outlast to fence the paused broker: the
    one this run starts the controller with, or, for a cluster running already, the one its cluster.json
    records (the controller takes its settings from those flags only; its /v1/status does not show them).
    When that cannot be told, --session-timeout-ms, with a warning that pauses may not fence."""
    if starting:
        return int(args.session_timeout_ms)
    spec = cl.load(data_dir)
    try:
        ms = controller_config(parse_assignments(spec.controller_settings)).get_int(SESSION_TIMEOUT)
    except ConfigError as exc:
        print(f"warning: cannot tell the running controller's {SESSION_TIMEOUT} ({exc}); pauses hold a broker "
              f"{args.session_timeout_ms} ms + 1-3 s, which may not outlast it: a paused broker may never be "
              "fenced", file=sys.stderr, flush=True)
        return int(args.session_timeout_ms)
    if spec.exec_argv:
        print(f"warning: the cluster in {data_dir} runs a command of its own (--exec); pauses assume its "
              f"controller uses the {SESSION_TIMEOUT}={ms} its cluster.json records, and may not fence a broker "
              "if it does not", file=sys.stderr, flush=True)
    ignored = (f"; --session-timeout-ms {args.session_timeout_ms} applies only to a cluster this run starts"
               if explicit and args.session_timeout_ms != ms else "")
    print(f"the running controller fences a silent broker after {SESSION_TIMEOUT}={ms} (its cluster.json): "
          f"pauses hold a broker longer{ignored}", flush=True)
    return ms


def run(args: argparse.Namespace) -> int:
    global _NET
    from common.logging import configure

    # client retries during faults are expected: keep them out of the progress lines unless asked for
    configure("chaos", level=os.environ.get("MINIBROKER_LOG_LEVEL", "WARNING"))
    faults = _faults(args.faults)
    if args.duration <= 0 or args.brokers < 3:
        raise CliError("--duration must be > 0 and --brokers >= 3 (the topic has RF=3)")
    if args.duration > MAX_DURATION_S:  # the schedule is built up front: bound it before anything starts
        raise CliError(f"--duration must be at most {MAX_DURATION_S} s (7 days), got {args.duration:g}")
    explicit_session = args.session_timeout_ms is not None
    if args.session_timeout_ms is None:
        args.session_timeout_ms = DEFAULT_SESSION_TIMEOUT_MS
    for flag, value in (("--data-dir", args.data_dir), ("--out", args.out)):
        if not value.strip():
            raise CliError(f"{flag} must not be empty")
    data_dir = Path(args.data_dir).resolve()
    out = Path(args.out).resolve()
    outer = "partition" in faults and netns.ENV not in os.environ
    # every check of --data-dir and --out before either is created
    if outer:
        netns.require()
        _check_namespaced_run(args, data_dir)
    spec: cl.ClusterSpec | None = None
    if not outer:
        if "partition" in faults:
            _NET = netns.NetPlan.from_json(os.environ[netns.ENV])
        spec = _cluster_to_start(args, data_dir)
    check_out(out)
    created_out = cl.make_dirs(out, "--out")
    if outer:
        try:
            status = _run_in_namespaces(args, data_dir, out)
        except BaseException:  # the run did not start: leave no --out behind that it created
            cl.remove_empty_dirs(out, created_out)
            raise
        if status != 0:
            cl.remove_empty_dirs(out, created_out)
        return status
    return _run_here(args, data_dir, out, created_out, faults, spec, explicit_session)


STOPPING_NOTE = "chaos: already stopping (workload, faults, then the cluster, each bounded); please wait"


def _run_here(args: argparse.Namespace, data_dir: Path, out: Path, created_out: Path | None,
              faults: tuple[str, ...], spec: cl.ClusterSpec | None, explicit_session: bool) -> int:
    """Start the cluster (``spec``) or use the running one, run the workload, stop a cluster it started.
    Ctrl-C, SIGTERM and SIGHUP end the run early the same way: workload stopped, faults healed, a cluster the
    run started stopped, the history kept; exit status 128 + the signal (Ctrl-C: 130) and one line on stderr."""
    starting = spec is not None
    summary: dict[str, Any] | None = None
    with cl.StopSignals(STOPPING_NOTE) as signals:
        try:
            try:
                _ensure_cluster(data_dir, spec)  # interrupted, up stops what it started
            except BaseException:  # the run did not start: leave no --out behind that it created
                cl.remove_empty_dirs(out, created_out)
                raise
            args.session_timeout_ms = _session_timeout_ms(args, data_dir, starting, explicit_session)
            brokers = [m.name for m in cl.load(data_dir).brokers]
            plan = schedule(args.seed, args.duration, faults, brokers,
                            session_timeout_s=args.session_timeout_ms / 1000)
            _say(f"chaos: {args.duration:.0f}s, seed {args.seed}, {len(plan)} faults planned ({', '.join(faults)})")
            summary = asyncio.run(workload(args, data_dir, out, plan, signals))
        except KeyboardInterrupt:  # a signal before the workload ran (it handles its own): cleaned up below
            pass
        finally:
            signals.raising = False  # a signal from here on only prints STOPPING_NOTE
            if starting and not args.keep_running and (data_dir / cl.CLUSTER_FILE).exists():
                with cl.cluster_lock(data_dir, required=False), contextlib.suppress(CliError):
                    cl.stop_cluster(cl.load(data_dir), timeout_s=40, controller_timeout_s=10)
        if summary is None:
            cl.remove_empty_dirs(out, created_out)  # only if the run wrote nothing there
            history = out / "history.jsonl"
            kept = (f": faults healed, {{}}; history so far in {history} (no summary)" if history.exists()
                    else " before the workload began: {}")
            cluster = ("cluster stopped" if starting and not args.keep_running
                       else f"cluster in {data_dir} left running")
            with contextlib.suppress(OSError):
                print(f"minibroker: chaos run stopped by {signals.name or 'a signal'}{kept.format(cluster)}",
                      file=sys.stderr, flush=True)
            return signals.exit_status
    try:
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    except OSError as exc:  # checked up front; only something changed during the run gets here
        raise CliError(f"cannot write {out / 'summary.json'}: {exc.strerror or exc}") from None
    print(f"summary: acked {summary['acked']}, failed {summary['failed']}, indeterminate {summary['indeterminate']}, "
          f"faults injected {summary['faults_injected']}, elections seen {summary['elections_seen']}, "
          f"ISR full at end: {summary['isr_full_at_end']}, final read {summary['final_read']} records")
    print(f"history: {summary['history']}; summary: {out / 'summary.json'}")
    print(f"next: minibroker export --data-dir {data_dir} --history {out} --out {out / 'export'} && "
          f"minibroker audit {out / 'export'}")
    return 0 if summary["isr_full_at_end"] else 1


def _duration(text: str) -> float:
    value = positive_float("--duration")(text)
    if value > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"--duration must be at most {MAX_DURATION_S} s (7 days), got {text}")
    return value


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("chaos", help="fault injection with a recorded workload history",
                       description="Fault injection on a local cluster, with the workload's history recorded for "
                                   "`minibroker export` and `minibroker audit`.")
    cs = p.add_subparsers(dest="chaos_command", metavar="ACTION")
    p.set_defaults(func=lambda _a: (p.print_help(sys.stderr), 2)[1])
    r = cs.add_parser("run", help="run a workload under a seeded nemesis; write history + summary",
                      description="Run producers and a consumer on an RF=3 topic of a local cluster (started if "
                                  "none runs in --data-dir) while a nemesis injects faults on a seeded schedule; "
                                  "write history.jsonl and summary.json into --out.")
    r.add_argument("--duration", type=_duration, default=60.0,
                   help=f"seconds of workload, at most {MAX_DURATION_S} (7 days) (default 60)")
    r.add_argument("--data-dir", default="./minibroker-chaos",
                   help="cluster dir, started if not running (default ./minibroker-chaos)")
    r.add_argument("--out", default="./minibroker-chaos-out",
                   help="where history.jsonl and summary.json go (default ./minibroker-chaos-out)")
    r.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    r.add_argument("--faults", default=",".join(DEFAULT_FAULTS), help=f"comma list of {', '.join(FAULTS)}")
    r.add_argument("--brokers", type=positive("--brokers"), default=3,
                   help="brokers of a cluster this run starts, at least 3 (default 3)")
    r.add_argument("--partitions", type=positive("--partitions"), default=3,
                   help="partitions of the topic 'chaos' when this run creates it (default 3)")
    r.add_argument("--producers", type=positive("--producers"), default=2,
                   help="concurrent producers, acks=all (default 2)")
    r.add_argument("--inflight", type=positive("--inflight"), default=64,
                   help="unacknowledged sends per producer (default 64)")
    r.add_argument("--base-port", type=port("--base-port"), default=19190,
                   help="controller port of a cluster this run starts; broker i listens on base+i (default 19190)")
    r.add_argument("--session-timeout-ms", type=positive("--session-timeout-ms"), default=None,
                   help=f"broker.session.timeout.ms of the controller of a cluster this run starts (default "
                        f"{DEFAULT_SESSION_TIMEOUT_MS}); with a running cluster, the one its cluster.json "
                        "records is used. Pauses hold a broker 1-3 s longer, so that it is fenced")
    r.add_argument("--heal-timeout", type=positive_float("--heal-timeout"), default=90.0,
                   help="seconds to wait for full ISRs at the end (default 90)")
    r.add_argument("--unclean", action="store_true", help="topic with unclean.leader.election.enable=true")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="broker setting for a cluster this run starts (repeatable)")
    r.add_argument("--keep-running", action="store_true", help="leave a cluster this run started running")
    r.set_defaults(func=run)
