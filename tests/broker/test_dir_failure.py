"""A failed data dir halts the broker (Kafka's LogDirFailureChannel, then ``Exit.halt(1)``: no log dir is
left online, a broker having one).

It used to be handled per log, and nobody was told: a leader whose disk filled stayed leader answering
KAFKA_STORAGE_ERROR, its followers could never catch up, it shrank the ISR to itself and moved its HW to its
LEO, and after SIGTERM the partition was offline. A LeaderAndIsr whose epoch checkpoint could not be written
left a leader that answered NOT_LEADER_OR_FOLLOWER; a HW checkpoint that could not be written logged a
traceback every second.

In-process brokers get an ``on_dir_failure`` that records instead of halting the test runner; the real
process halts (disk faults without root: RLIMIT_FSIZE, see tests/procs.py, and a directory where a
checkpoint's temp file goes).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from common.clock import ManualClock
from common.errors import ErrorCode
from common.http import RpcClient, RpcError
from common.wire import TopicPartition
from storage.log import Log, LogConfig
from storage.record_batch import build_batch, decode_records, iter_batches
from tests import procs as P
from tests.broker.conftest import TP, StartBroker, batch, fetch_body, part, produce_body
from tests.fake_controller import FakeController

Failures = list[tuple[Path, str]]


def recorder(failures: Failures) -> Any:
    return lambda data_dir, error: failures.append((data_dir, error))


def refuse_writes(the_log: Log) -> None:
    """The active segment's descriptor now refers to a read-only open of its file: writes fail with EBADF
    (an OS-level fault, as tests/storage/test_log.py::test_write_failure_makes_the_log_unusable_not_torn)."""
    seg = the_log.segments[-1]
    ro = os.open(seg.dir / f"{seg.base_offset:020d}.log", os.O_RDONLY)
    os.dup2(ro, seg.fd)
    os.close(ro)


def fatal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == "CRITICAL" and r.getMessage().startswith("log_dir_failed")]


async def test_a_failed_append_on_a_leader_reaches_the_handler_once(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient,
        caplog: pytest.LogCaptureFixture) -> None:
    failures: Failures = []
    b = await start_broker(on_dir_failure=recorder(failures))
    await controller.elect(TP, leader=1, replicas=[1])
    assert part(await rpc.call(b.address, "produce", produce_body(batch())))["error"] == 0
    assert b.rm is not None
    refuse_writes(b.rm.partitions[TP].log)
    for _ in range(3):
        r = part(await rpc.call(b.address, "produce", produce_body(batch())))
        assert r["error"] == ErrorCode.KAFKA_STORAGE_ERROR
    assert len(failures) == 1, failures
    data_dir, error = failures[0]
    assert data_dir == b.opts.data_dir and error.startswith("t-0: OSError") and "Bad file descriptor" in error
    assert b.dir_failure == failures[0]
    [line] = fatal_lines(caplog)
    assert str(b.opts.data_dir) in line and "Bad file descriptor" in line and "action='halt'" in line


async def test_a_leader_and_isr_whose_epoch_checkpoint_cannot_be_written_fails_the_dir(
        start_broker: StartBroker, controller: FakeController) -> None:
    """The new leader records its epoch durably before it leads; when that write fails the partition's
    answer is KAFKA_STORAGE_ERROR and the dir has failed (the broker halts; the controller then fences it
    and elects elsewhere, rather than naming a leader that answers NOT_LEADER_OR_FOLLOWER forever)."""
    failures: Failures = []
    b = await start_broker(on_dir_failure=recorder(failures))
    follower = {"topic": TP.topic, "partition": TP.partition, "leader": 2, "leader_epoch": 0, "isr": [1, 2],
                "partition_epoch": 0, "replicas": [1, 2], "is_new": True}
    assert (await controller.send_leader_and_isr(b.address, [follower]))["partitions"][0]["error"] == 0
    (b.opts.data_dir / "t-0" / "leader-epoch-checkpoint.tmp").mkdir()  # the checkpoint write fails (EISDIR)
    leader = {**follower, "leader": 1, "leader_epoch": 1, "partition_epoch": 1, "is_new": False}
    resp = await controller.send_leader_and_isr(b.address, [leader])
    assert resp["partitions"][0]["error"] == ErrorCode.KAFKA_STORAGE_ERROR
    assert len(failures) == 1 and "leader-epoch-checkpoint" in failures[0][1], failures


async def put_a_directory_in_place_of(tmp: Path) -> None:
    """mkdir ``tmp``, a checkpoint's temp file name: a periodic checkpoint running meanwhile holds that name as a
    file for the moment between its create and its rename, so a collision is tried again once it is free."""
    deadline = time.monotonic() + 20
    while True:
        try:
            tmp.mkdir()
            break
        except FileExistsError:
            assert time.monotonic() < deadline, f"{tmp} never came free"
            await asyncio.sleep(0.005)
    assert tmp.is_dir()


async def test_a_hw_checkpoint_that_cannot_be_written_fails_the_dir_once(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """The periodic HW checkpoint logged a traceback every interval, forever; now the first failure is the
    dir's, and a broker whose handler does not halt (this test's) writes no further HW checkpoint."""
    failures: Failures = []
    b = await start_broker(on_dir_failure=recorder(failures),
                           sets={"replica.high.watermark.checkpoint.interval.ms": 50})
    await controller.elect(TP, leader=1, replicas=[1])
    assert part(await rpc.call(b.address, "produce", produce_body(batch())))["error"] == 0
    await put_a_directory_in_place_of(b.opts.data_dir / "replication-offset-checkpoint.tmp")
    deadline = time.monotonic() + 20
    while not failures:
        assert time.monotonic() < deadline, "the HW checkpoint failure never reached the handler"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # ten more intervals
    assert len(failures) == 1 and "replication-offset-checkpoint" in failures[0][1], failures
    periodic = [r for r in caplog.records if "periodic_task_failed" in r.getMessage()]
    assert len(periodic) <= 1 and not any(r.exc_info for r in periodic)  # the failing write itself, no traceback
    assert len(fatal_lines(caplog)) == 1


# ---- real processes ---------------------------------------------------------------------------------------

def stderr_lines(proc: P.Proc) -> tuple[list[dict[str, Any]], list[str]]:
    """(the JSON events, every other line) of a process's stderr."""
    events, other = [], []
    for line in proc.stderr_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            other.append(line)
    return events, other


def read_values(data_dir: Path, tp: TopicPartition) -> list[bytes]:
    """Every record value in the partition's log, opened (and recovered) from its files."""
    the_log = Log.open(data_dir / str(tp), LogConfig(), ManualClock(0))
    try:
        out: list[bytes] = []
        offset = the_log.log_start_offset
        while offset < the_log.log_end_offset:
            data = the_log.read(offset, 1 << 20).records
            for pos, header in iter_batches(data):
                out += [r.value or b"" for r in decode_records(data, pos)]
                offset = header.next_offset
        return out
    finally:
        the_log.close()


async def test_a_broker_process_whose_disk_write_fails_halts_with_one_fatal_line(
        tmp_path: Path, procs: P.Procs, fc: FakeController) -> None:
    """EFBIG (RLIMIT_FSIZE) on a leader's append: one ``log_dir_failed`` line at level critical naming the
    dir and the error, then exit 1 at once (no controlled shutdown, no ``broker_stopped``). The failed
    append left nothing behind: every acknowledged record is in the log, which opens cleanly."""
    d = tmp_path / "b1"
    b = await asyncio.to_thread(procs.broker_piped, 1, d, fc.address, fsize_limit=64 * 1024,
                                sets={"broker.heartbeat.interval.ms": 200})
    await fc.wait_registered([1])
    await fc.elect(TP, leader=1, replicas=[1])
    rpc = RpcClient(timeout_s=10)
    acked: list[bytes] = []
    try:
        for i in range(40):  # 8 KiB batches: the 64 KiB limit is reached within 9
            values = [f"{i}-{j}-".encode().ljust(2000, b"v") for j in range(4)]
            records = build_batch([(None, v) for v in values], timestamp_ms=1_700_000_000_000)
            try:
                r = part(await rpc.call(b.address, "produce", produce_body(records), timeout_s=10))
            except RpcError:
                break  # the broker halted during the request
            if r["error"] != 0:
                assert r["error"] == ErrorCode.KAFKA_STORAGE_ERROR
                continue  # answered before the halt: the next request finds no broker
            acked += values
    finally:
        await rpc.close()
    assert await asyncio.to_thread(P.wait_exit, b, 20) == 1
    events, other = stderr_lines(b)
    assert other == [], other  # no traceback, nothing unstructured
    [fatal] = [e for e in events if e.get("event") == "log_dir_failed"]
    assert fatal["level"] == "critical" and fatal["data_dir"] == str(d) and fatal["action"] == "halt"
    assert "t-0" in fatal["error"] and "File too large" in fatal["error"]
    assert not [e for e in events if e.get("event") in ("broker_stopped", "controlled_shutdown_done")]
    assert not fc.shutdown_requests
    assert len(acked) >= 4
    assert read_values(d, TP) == acked


async def test_sigterm_with_a_failing_hw_checkpoint_still_closes_the_logs_then_exits_non_zero(
        tmp_path: Path, procs: P.Procs, fc: FakeController) -> None:
    """A full disk at SIGTERM: the HW checkpoint write raised out of the shutdown, so the logs were never
    flushed or closed (no recovery-point checkpoint) and a traceback ended the process. Every step runs
    now; the failure is the dir's (the fatal line), and the exit status says so once the logs are closed."""
    d = tmp_path / "b1"
    b = await asyncio.to_thread(procs.broker, 1, d, fc.address, sets={
        "broker.heartbeat.interval.ms": 200, "replica.high.watermark.checkpoint.interval.ms": 3_600_000})
    await fc.wait_registered([1])
    await fc.elect(TP, leader=1, replicas=[1])
    rpc = RpcClient(timeout_s=10)
    try:
        for _ in range(3):
            assert part(await rpc.call(b.address, "produce", produce_body(batch(4))))["error"] == 0
    finally:
        await rpc.close()
    (d / "replication-offset-checkpoint.tmp").mkdir()  # the HW checkpoint write fails (EISDIR), even as root
    assert await asyncio.to_thread(P.stop, b) == 1
    events, other = stderr_lines(b)
    assert other == [], other
    [fatal] = [e for e in events if e.get("event") == "log_dir_failed"]
    assert fatal["level"] == "critical" and fatal["data_dir"] == str(d)
    assert "replication-offset-checkpoint" in fatal["error"] and fatal["action"] == "exit after closing the logs"
    names = [e.get("event") for e in events]
    assert names.index("log_dir_failed") < names.index("logs_closed") < names.index("broker_stopped")
    assert fc.shutdown_requests  # the controlled shutdown ran first
    recovery = (d / "recovery-point-offset-checkpoint").read_text().split("\n")
    assert "t 0 12" in recovery


# ---- a real cluster: the leader's disk fails, a follower takes over -----------------------------------------



async def wait_for(what: str, timeout_s: float, probe: Any) -> Any:
    """Poll ``probe()`` (async) until it returns something truthy; RPC failures count as not yet."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = await probe()
        except (RpcError, KeyError, IndexError, StopIteration):
            result = None
        if result:
            return result
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting until {what}")


async def consume_all(rpc: RpcClient, address: str, tp: TopicPartition) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    for _ in range(1000):
        resp = await rpc.call(address, "fetch", {
            "replica_id": -1, "broker_epoch": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic": tp.topic, "partitions": [{
                "partition": tp.partition, "fetch_offset": offset, "current_leader_epoch": -1,
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]}, timeout_s=5)
        p = resp["topics"][0]["partitions"][0]
        assert p["error"] == 0, p
        if not p["records"]:
            break
        for pos, header in iter_batches(p["records"]):
            out += [r.value or b"" for r in decode_records(p["records"], pos)
                    if header.base_offset + r.offset_delta >= offset]
            offset = header.next_offset
    return out


async def test_a_leader_whose_disk_fails_halts_and_a_follower_takes_over_with_every_acked_record(
        tmp_path: Path, procs: P.Procs) -> None:
    """A real controller and 3 brokers; the leader's segment stops growing (RLIMIT_FSIZE set on the running
    process) while acks=all writes go on. The leader halts at its first failed append; the controller fences
    it after the session timeout and elects a follower from the ISR; every record acknowledged with acks=all,
    before and after, is readable from the new leader."""
    topic = "disk"
    tp = TopicPartition(topic, 0)
    ctl = await asyncio.to_thread(procs.controller, tmp_path / "controller", sets=P.CONTROLLER_SETS)
    brokers = {}
    for n in (1, 2, 3):
        brokers[n] = await asyncio.to_thread(procs.broker_piped, n, tmp_path / f"broker-{n}", ctl.address,
                                             sets=P.BROKER_SETS)
    rpc = RpcClient(timeout_s=10)
    try:
        async def all_live() -> bool:
            status = await rpc.get_json(ctl.address, "/v1/status", timeout_s=2)
            return {b["node_id"] for b in status["brokers"] if not b["fenced"]} >= {1, 2, 3}
        await wait_for("3 brokers registered", 30, all_live)
        resp = await rpc.call(ctl.address, "create_topics", {"topics": [
            {"name": topic, "num_partitions": 1, "replication_factor": 3, "configs": {"min.insync.replicas": 2}}]})
        assert resp["topics"][0]["error"] == 0, resp

        async def partition() -> dict[str, Any]:
            md = await rpc.call(ctl.address, "metadata", {"topics": [topic]}, timeout_s=3)
            return dict(md["topics"][0]["partitions"][0])

        async def leading(exclude: int = -1) -> dict[str, Any] | None:
            p = await partition()
            if p["leader"] < 0 or p["leader"] == exclude or not brokers[p["leader"]].alive():
                return None
            status = await rpc.get_json(brokers[p["leader"]].address, "/v1/status", timeout_s=2)
            mine = [x for x in status["partitions"] if x["topic"] == topic and x["role"] == "leader"
                    and x["leader_epoch"] == p["leader_epoch"]]
            return p if mine else None

        first = await wait_for("a serving leader", 30, leading)
        victim = first["leader"]
        acked: list[bytes] = []

        async def produce(leader: int, i: int) -> bool:
            values = [f"r{i}-{j}".encode() for j in range(5)]
            records = build_batch([(None, v) for v in values], timestamp_ms=int(time.time() * 1000))
            body = produce_body(records, acks=-1, timeout_ms=5000, tp=tp)
            try:
                r = part(await rpc.call(brokers[leader].address, "produce", body, timeout_s=8))
            except RpcError:
                return False
            if r["error"] == 0:
                acked.extend(values)
                return True
            return False

        i = 0
        while len(acked) < 100:
            assert await produce(victim, i), "the healthy leader refused a write"
            i += 1
        segment = tmp_path / f"broker-{victim}" / f"{topic}-0" / "00000000000000000000.log"
        P.limit_file_size(brokers[victim], segment.stat().st_size + 600)  # a few more batches fit, then EFBIG
        for _ in range(200):
            if not await produce(victim, i):
                break
            i += 1
        assert await asyncio.to_thread(P.wait_exit, brokers[victim], 20) == 1
        events, other = stderr_lines(brokers[victim])
        assert other == [], other
        [fatal] = [e for e in events if e.get("event") == "log_dir_failed"]
        assert "File too large" in fatal["error"] and fatal["data_dir"] == str(tmp_path / f"broker-{victim}")

        after = await wait_for("a new leader", 30, lambda: leading(exclude=victim))
        assert after["leader"] in first["isr"] and after["leader_epoch"] > first["leader_epoch"]
        before_failover = len(acked)
        while len(acked) < before_failover + 50:  # writes go on at the new leader
            if not await produce(after["leader"], i):
                await asyncio.sleep(0.1)
            i += 1
            assert i < 2000
        committed = await wait_for("every acknowledged record readable", 20, lambda: _superset(
            consume_all(rpc, brokers[after["leader"]].address, tp), acked))
        assert len(set(committed)) == len(committed)
    finally:
        await rpc.close()
        for proc in brokers.values():  # before the controller (procs.close stops all at once)
            await asyncio.to_thread(P.stop, proc)


async def _superset(read: Any, acked: list[bytes]) -> list[bytes] | None:
    got: list[bytes] = await read
    return got if set(acked) <= set(got) else None


def refuse_reads(the_log: Log) -> None:
    """The active segment's descriptor now refers to a write-only open of its file: appends still work,
    reads fail with EBADF."""
    seg = the_log.segments[-1]
    wo = os.open(seg.dir / f"{seg.base_offset:020d}.log", os.O_WRONLY | os.O_APPEND)
    os.dup2(wo, seg.fd)
    os.close(wo)


async def test_a_read_failing_while_a_waiting_fetch_is_checked_answers_that_fetch_not_the_append(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> None:
    """An append checks the fetches waiting on its partition (Kafka's DelayedFetch.tryComplete); a read that
    failed there escaped into the produce, which was answered UNKNOWN_SERVER_ERROR though its records were
    appended (a retry would write them twice), and the waiting fetch was left to its max_wait."""
    failures: Failures = []
    b = await start_broker(on_dir_failure=recorder(failures))
    await controller.elect(TP, leader=1, replicas=[1])
    assert part(await rpc.call(b.address, "produce", produce_body(batch())))["error"] == 0
    waiting = asyncio.ensure_future(rpc.call(b.address, "fetch", fetch_body(0, max_wait_ms=120_000,
                                                                            min_bytes=1 << 30)))
    assert b.rm is not None
    for _ in range(500):
        if len(b.rm.fetch_purgatory):
            break
        await asyncio.sleep(0.01)
    refuse_reads(b.rm.partitions[TP].log)
    produced = await rpc.call(b.address, "produce", produce_body(batch()))
    assert part(produced)["error"] == 0 and part(produced)["base_offset"] == 3
    answer = await asyncio.wait_for(waiting, 30)
    assert part(answer)["error"] == ErrorCode.KAFKA_STORAGE_ERROR
    assert len(failures) == 1 and "Bad file descriptor" in failures[0][1], failures
