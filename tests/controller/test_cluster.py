"""Real processes on 127.0.0.1: a controller and brokers, killed with SIGKILL at the worst moments.

Scenarios from issue 6:
- kill -9 a leader while producing with acks=all: a new leader from the ISR, no acknowledged record lost;
- kill -9 the controller: leaders keep serving acks=all with a full ISR; restarted, it has the same
  metadata and controller_epoch + 1, brokers accept it and reject the old epoch;
- every ISR member dead: offline with unclean election off (produce fails clearly), a replica is
  elected with it on and that is visible in the log and the metrics.

Waits are bounded loops; no duration is asserted (failover times are printed).
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from common.errors import ErrorCode
from common.http import RpcClient, RpcError
from tests import procs as P

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("storage.log", "storage.log_manager", "broker.process")),
    reason="the broker process needs storage.log / storage.log_manager (not there yet)")



class Cluster:
    def __init__(self, root: Path, procs: P.Procs, rpc: RpcClient) -> None:
        self.root = root
        self.procs = procs
        self.rpc = rpc
        self.controller: P.Proc | None = None
        self.brokers: dict[int, P.Proc] = {}

    @property
    def ctl(self) -> str:
        assert self.controller is not None
        return self.controller.address

    def start_controller(self, address: str | None = None) -> P.Proc:
        data_dir = self.root / "controller"
        if address is None:
            self.controller = self.procs.controller(data_dir, sets=P.CONTROLLER_SETS)
        else:  # a restart on the same address, so the brokers find it again
            args = ["controller", "--listen", address, "--data-dir", str(data_dir), *P._settings(P.CONTROLLER_SETS)]
            self.controller = P.spawn("controller", args, data_dir)
            self.procs.all.append(self.controller)
        return self.controller

    def start_broker(self, node_id: int) -> P.Proc:
        proc = self.procs.broker(node_id, self.root / f"broker-{node_id}", self.ctl, sets=P.BROKER_SETS)
        self.brokers[node_id] = proc
        return proc

    async def wait_registered(self, ids: set[int]) -> None:
        async def ok() -> bool:
            status = await self.rpc.get_json(self.ctl, "/v1/status", timeout_s=2)
            live = {b["node_id"] for b in status["brokers"] if not b["fenced"]}
            return ids <= live
        await wait_until(ok, 30, f"brokers {sorted(ids)} registered")

    async def create(self, name: str, partitions: int, rf: int, configs: dict[str, Any]) -> None:
        resp = await self.rpc.call(self.ctl, "create_topics", {"topics": [
            {"name": name, "num_partitions": partitions, "replication_factor": rf, "configs": configs}]})
        assert resp["topics"][0]["error"] == 0, resp

    async def partition(self, topic: str, p: int = 0) -> dict[str, Any]:
        md = await self.rpc.call(self.ctl, "metadata", {"topics": [topic]}, timeout_s=3)
        return dict(next(x for x in md["topics"][0]["partitions"] if x["partition"] == p))

    def address(self, node_id: int) -> str:
        return self.brokers[node_id].address

    async def broker_partition(self, node_id: int, topic: str, p: int = 0) -> dict[str, Any] | None:
        status = await self.rpc.get_json(self.address(node_id), "/v1/status", timeout_s=2)
        for x in status.get("partitions") or []:
            if x["topic"] == topic and x["partition"] == p:
                return dict(x)
        return None

    async def wait_leading(self, topic: str, p: int = 0) -> dict[str, Any]:
        """The controller's view once its leader also says it leads (LeaderAndIsr arrived)."""
        result: dict[str, Any] = {}

        async def ok() -> bool:
            part = await self.partition(topic, p)
            if part["leader"] < 0 or part["leader"] not in self.brokers or not self.brokers[part["leader"]].alive():
                return False
            view = await self.broker_partition(part["leader"], topic, p)
            result.update(part)
            return view is not None and view["role"] == "leader" and view["leader_epoch"] == part["leader_epoch"]
        await wait_until(ok, 30, f"{topic}-{p} has a serving leader")
        return result


async def wait_until(cond: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if await cond():
                return
        except (RpcError, KeyError, StopIteration):
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting until {what}")


def batch(values: list[bytes]) -> bytes:
    from storage.record_batch import build_batch

    return build_batch([(None, v) for v in values], timestamp_ms=int(time.time() * 1000))


async def produce(rpc: RpcClient, address: str, topic: str, values: list[bytes], *, acks: int = -1,
                  p: int = 0) -> dict[str, Any]:
    resp = await rpc.call(address, "produce", {"acks": acks, "timeout_ms": 5000, "topics": [
        {"topic": topic, "partitions": [{"partition": p, "records": batch(values)}]}]}, timeout_s=8)
    return dict(resp["topics"][0]["partitions"][0])


async def read_all(rpc: RpcClient, address: str, topic: str, p: int = 0) -> list[bytes]:
    """Every committed value (up to the HW), in offset order."""
    from storage.record_batch import decode_records, iter_batches

    out: list[bytes] = []
    offset = 0
    for _ in range(1000):
        resp = await rpc.call(address, "fetch", {
            "replica_id": -1, "broker_epoch": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic": topic, "partitions": [{
                "partition": p, "fetch_offset": offset, "current_leader_epoch": -1, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]}, timeout_s=5)
        part = resp["topics"][0]["partitions"][0]
        assert part["error"] == 0, part
        records = part["records"]
        if not records:
            return out
        for pos, header in iter_batches(records):
            for r in decode_records(records, pos):
                if header.base_offset + r.offset_delta >= offset:
                    out.append(r.value or b"")
            offset = header.next_offset
    return out


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    procs = P.Procs()
    rpc = RpcClient(timeout_s=10)
    c = Cluster(tmp_path, procs, rpc)
    try:
        yield c
    finally:
        procs.close()  # the RpcClient is closed by each test, in its own event loop


async def _start(c: Cluster, n: int) -> None:
    c.start_controller()
    for b in range(1, n + 1):
        c.start_broker(b)
    await c.wait_registered(set(range(1, n + 1)))


async def test_kill_leader_while_producing_loses_no_acknowledged_record(cluster: Cluster) -> None:
    c = cluster
    try:
        await _start(c, 3)
        await c.create("orders", 1, 3, {"min.insync.replicas": 2})
        first = await c.wait_leading("orders")
        acked: list[bytes] = []
        killed_at: list[float] = []
        recovered_at: list[float] = []
        victim = first["leader"]

        async def producer() -> None:
            leader = first["leader"]
            for i in range(400):
                if time.monotonic() - start > 60:
                    return
                values = [f"v{i}-{j}".encode() for j in range(5)]
                try:
                    r = await produce(c.rpc, c.address(leader), "orders", values)
                except RpcError:
                    r = {"error": int(ErrorCode.NETWORK_EXCEPTION)}
                if r["error"] == 0:
                    if killed_at and not recovered_at:
                        recovered_at.append(time.monotonic())
                    acked.extend(values)
                    if len(acked) >= 100 and not killed_at:
                        P.kill(c.brokers[victim])
                        killed_at.append(time.monotonic())
                    continue
                await asyncio.sleep(0.05)
                try:
                    part = await c.partition("orders")
                except RpcError:
                    continue
                if part["leader"] >= 0 and part["leader"] != victim:
                    leader = part["leader"]
                if killed_at and len(acked) >= 300:
                    return

        start = time.monotonic()
        await producer()
        assert killed_at, "the leader was killed mid-stream"
        after = await c.wait_leading("orders")
        fenced = [e for e in c.controller.events("broker_fenced") if e["broker_id"] == victim] if c.controller else []
        print(f"\nfailover: leader {victim} -> {after['leader']}, leader_epoch {first['leader_epoch']} -> "
              f"{after['leader_epoch']}; {len(acked)} records acknowledged; fenced by {fenced[0]['reason']}; "
              f"kill -> first acks=all write acknowledged by the new leader: "
              f"{(recovered_at or [float('nan')])[0] - killed_at[0]:.2f} s (session timeout {P.SESSION_MS} ms)")
        assert after["leader"] != victim and after["leader"] in first["isr"]
        assert after["leader_epoch"] > first["leader_epoch"] and victim not in after["isr"]
        assert len(acked) > 100, "writes continued after the failover"
        committed: list[bytes] = []

        async def all_there() -> bool:
            committed[:] = await read_all(c.rpc, c.address(after["leader"]), "orders")
            return set(acked) <= set(committed)
        await wait_until(all_there, 20, "every acknowledged record is readable from the new leader")
        ctl_events = c.controller.events("broker_fenced") if c.controller else []
        assert any(e["broker_id"] == victim for e in ctl_events)
        elected = [e for e in c.controller.events("leader_elected") if e.get("topic") == "orders"] \
            if c.controller else []
        assert any(e["leader"] == after["leader"] and e["reason"] == "offline" for e in elected)
    finally:
        await c.rpc.close()


async def test_controller_kill_and_restart(cluster: Cluster) -> None:
    c = cluster
    try:
        await _start(c, 3)
        await c.create("events", 2, 3, {"min.insync.replicas": 3})
        leaders = [await c.wait_leading("events", p) for p in (0, 1)]
        before = await c.rpc.call(c.ctl, "metadata", {"topics": None})
        epoch = before["controller_epoch"]
        address = c.ctl
        assert c.controller is not None
        P.kill(c.controller)
        # the leaders keep serving acks=all writes with a full ISR while the controller is gone
        for i in range(10):
            for p, part in enumerate(leaders):
                r = await produce(c.rpc, c.address(part["leader"]), "events", [f"p{p}-{i}".encode()], p=p)
                assert r["error"] == 0, r
        for p, part in enumerate(leaders):
            view = await c.broker_partition(part["leader"], "events", p)
            assert view is not None and sorted(view["isr"]) == [1, 2, 3]
        c.start_controller(address)
        after = await c.rpc.call(c.ctl, "metadata", {"topics": None})
        assert after["controller_epoch"] == epoch + 1
        assert after["topics"] == before["topics"]
        assert [b["node_id"] for b in after["brokers"]] == [1, 2, 3]

        async def brokers_follow() -> bool:
            for b in (1, 2, 3):
                st = await c.rpc.get_json(c.address(b), "/v1/status", timeout_s=2)
                if st["controller_epoch"] != epoch + 1:
                    return False
            return True
        await wait_until(brokers_follow, 20, "every broker accepted the new controller epoch")
        # brokers now reject the old controller epoch
        part = leaders[0]
        old = {"controller_id": 3000, "controller_epoch": epoch, "broker_epoch": -1,
               "partition_states": [{"topic": "events", "partition": 0, "leader": part["leader"],
                                     "leader_epoch": part["leader_epoch"] + 5, "isr": part["isr"],
                                     "partition_epoch": part["partition_epoch"] + 5, "replicas": part["replicas"],
                                     "is_new": False}],
               "live_leaders": [], "topic_configs": {}}
        resp = await c.rpc.call(c.address(part["leader"]), "leader_and_isr", old)
        assert resp["error"] == ErrorCode.STALE_CONTROLLER_EPOCH
        # the brokers stay registered past the session timeout (they heartbeat the new controller)
        await asyncio.sleep(P.SESSION_MS / 1000 * 1.5)
        status = await c.rpc.get_json(c.ctl, "/v1/status")
        assert not any(b["fenced"] for b in status["brokers"])
        r = await produce(c.rpc, c.address(part["leader"]), "events", [b"after-restart"])
        assert r["error"] == 0, r
        values = await read_all(c.rpc, c.address(part["leader"]), "events")
        assert [f"p0-{i}".encode() for i in range(10)] + [b"after-restart"] == values
    finally:
        await c.rpc.close()


async def test_all_isr_dead_offline_or_unclean(cluster: Cluster) -> None:
    c = cluster
    try:
        await _start(c, 2)
        await c.create("clean", 1, 2, {"unclean.leader.election.enable": "false"})
        await c.create("dirty", 1, 2, {"unclean.leader.election.enable": "true"})
        for t in ("clean", "dirty"):
            await c.wait_leading(t)
        P.kill(c.brokers[2])

        async def shrunk() -> bool:
            return [(await c.partition(t))["isr"] for t in ("clean", "dirty")] == [[1], [1]]
        await wait_until(shrunk, 30, "broker 2 fenced and out of both ISRs")
        for t in ("clean", "dirty"):
            await c.wait_leading(t)
            r = await produce(c.rpc, c.address(1), t, [f"{t}-only-on-1".encode()])
            assert r["error"] == 0, r
        P.kill(c.brokers[1])

        async def offline() -> bool:
            return [(await c.partition(t))["leader"] for t in ("clean", "dirty")] == [-1, -1]
        await wait_until(offline, 30, "both partitions offline (no live replica at all)")
        c.start_broker(2)  # the out-of-sync replica comes back
        await c.wait_registered({2})
        dirty = await c.wait_leading("dirty")
        assert dirty["leader"] == 2 and dirty["isr"] == [2]
        clean = await c.partition("clean")
        assert clean["leader"] == -1 and clean["error"] == ErrorCode.LEADER_NOT_AVAILABLE
        r = await produce(c.rpc, c.address(2), "clean", [b"nope"])
        assert r["error"] == ErrorCode.NOT_LEADER_OR_FOLLOWER, r
        r = await produce(c.rpc, c.address(2), "dirty", [b"after-unclean"])
        assert r["error"] == 0, r
        assert c.controller is not None
        unclean = [e for e in c.controller.events("leader_elected") if e.get("unclean")]
        assert [(e["topic"], e["leader"]) for e in unclean] == [("dirty", 2)]
        async with aiohttp.ClientSession() as s, s.get(f"http://{c.ctl}/metrics") as resp:
            metrics = await resp.text()
        assert 'minibroker_controller_elections_total{reason="unclean"} 1.0' in metrics
        assert "minibroker_controller_offline_partitions 1.0" in metrics
    finally:
        await c.rpc.close()


async def test_sigterm_moves_leadership_before_the_broker_exits(cluster: Cluster) -> None:
    c = cluster
    try:
        await _start(c, 3)
        await c.create("logs", 1, 3, {"min.insync.replicas": 2})
        first = await c.wait_leading("logs")
        values = [f"before-{i}".encode() for i in range(10)]
        assert (await produce(c.rpc, c.address(first["leader"]), "logs", values))["error"] == 0
        victim = first["leader"]
        assert P.stop(c.brokers[victim]) == 0
        assert c.controller is not None
        moved = [e for e in c.controller.events("leader_elected")
                 if e.get("topic") == "logs" and e["reason"] == "controlled_shutdown"]
        assert moved and moved[0]["leader"] != victim, "leadership moved by the controlled shutdown"
        status = await c.rpc.get_json(c.ctl, "/v1/status")
        assert {b["node_id"]: b["fenced"] for b in status["brokers"]}[victim], "fenced once it led nothing"
        # the orderly end of a stop, not a warning (operators alerting on WARN were paged for every restart)
        assert [(e["reason"], e["level"]) for e in c.controller.events("broker_fenced")
                if e["broker_id"] == victim] == [("controlled_shutdown", "info")]
        after = await c.wait_leading("logs")
        assert after["leader"] == moved[0]["leader"] and victim not in after["isr"]
        r = await produce(c.rpc, c.address(after["leader"]), "logs", [b"after"])
        assert r["error"] == 0, r
        assert await read_all(c.rpc, c.address(after["leader"]), "logs") == [*values, b"after"]
    finally:
        await c.rpc.close()


async def test_restarted_broker_rejoins_the_isr_with_its_new_epoch(cluster: Cluster) -> None:
    c = cluster
    try:
        await _start(c, 3)
        await c.create("jobs", 1, 3, {"min.insync.replicas": 2})
        first = await c.wait_leading("jobs")
        follower = next(r for r in first["replicas"] if r != first["leader"])
        values = [f"j{i}".encode() for i in range(20)]
        assert (await produce(c.rpc, c.address(first["leader"]), "jobs", values))["error"] == 0
        P.kill(c.brokers[follower])
        c.start_broker(follower)  # a new incarnation, before the old one's session times out

        async def rejoined() -> bool:
            part = await c.partition("jobs")
            return sorted(part["isr"]) == sorted(first["replicas"]) and part["partition_epoch"] >= 2
        await wait_until(rejoined, 30, "the restarted follower is back in the ISR")
        assert c.controller is not None
        regs = [e for e in c.controller.events("broker_registered") if e["broker_id"] == follower]
        assert len(regs) == 2 and regs[1]["broker_epoch"] > regs[0]["broker_epoch"]
        # refused (DUPLICATE_BROKER_REGISTRATION) while the killed incarnation's session lasted, then fenced
        # at its end, which took it out of the ISR; only then registered (Kafka's ClusterControlManager)
        assert [e for e in c.controller.events("broker_registration_refused") if e["broker_id"] == follower]
        assert [e["reason"] for e in c.controller.events("broker_fenced") if e["broker_id"] == follower] == \
            ["session_timeout"]
        shrinks = [e for e in c.controller.events("isr_changed")
                   if e.get("topic") == "jobs" and follower not in e["isr"]]
        assert shrinks and shrinks[0]["reason"] == "offline", "left the ISR when fenced"
        part = await c.partition("jobs")
        assert part["leader"] == first["leader"] and part["leader_epoch"] == first["leader_epoch"]
        view = await c.broker_partition(follower, "jobs")
        assert view is not None and view["log_end_offset"] >= len(values)
    finally:
        await c.rpc.close()


async def test_delete_topic_removes_replicas_and_the_name_is_reusable(cluster: Cluster) -> None:
    c = cluster
    try:
        await _start(c, 2)
        await c.create("old", 2, 2, {})
        for p in (0, 1):
            part = await c.wait_leading("old", p)
            assert (await produce(c.rpc, c.address(part["leader"]), "old", [b"stale"], p=p))["error"] == 0
        resp = await c.rpc.call(c.ctl, "delete_topics", {"topics": ["old"]})
        assert resp["topics"][0]["error"] == 0

        async def deleted() -> bool:
            status = await c.rpc.get_json(c.ctl, "/v1/status")
            dirs = [d for b in (1, 2) for d in (c.root / f"broker-{b}").glob("old-*")]
            return not status["deleting"] and not dirs
        await wait_until(deleted, 30, "every replica deleted on disk and confirmed")
        await c.create("old", 1, 2, {})
        part = await c.wait_leading("old")
        assert await read_all(c.rpc, c.address(part["leader"]), "old") == []
    finally:
        await c.rpc.close()


async def test_a_broker_that_missed_a_deletion_forgets_the_topic_at_its_full_sync(cluster: Cluster) -> None:
    # Found by review: a broker only forgot a topic when an UpdateMetadata named it deleted, which a fenced
    # broker does not get (its queue is dropped) and a restarted controller does not resend. The sync after
    # the broker is unfenced is a full UpdateMetadata now, and the broker drops what it does not list.
    c = cluster
    try:
        await _start(c, 2)
        await c.create("gone", 1, 1, {})
        part = await c.wait_leading("gone")
        other = 2 if part["leader"] == 1 else 1  # not a replica: the deletion completes without it

        async def known_to_other() -> bool:
            md = await c.rpc.call(c.address(other), "metadata", {"topics": ["gone"]}, timeout_s=3)
            return bool(md["topics"][0]["error"] == 0)
        await wait_until(known_to_other, 20, "the other broker knows the topic")

        async def other_fenced(fenced: bool) -> bool:
            status = await c.rpc.get_json(c.ctl, "/v1/status", timeout_s=2)
            return any(b["node_id"] == other and b["fenced"] is fenced for b in status["brokers"])
        P.pause(c.brokers[other])
        await wait_until(lambda: other_fenced(True), 30, "the paused broker fenced")
        resp = await c.rpc.call(c.ctl, "delete_topics", {"topics": ["gone"]})
        assert resp["topics"][0]["error"] == 0

        async def deleted() -> bool:
            return "gone" not in (await c.rpc.get_json(c.ctl, "/v1/status"))["deleting"]
        await wait_until(deleted, 30, "the deletion completed")
        P.resume(c.brokers[other])
        await wait_until(lambda: other_fenced(False), 30, "the broker unfenced")
        await wait_until(lambda: _not(known_to_other), 30, "the broker forgot the deleted topic")
        md = await c.rpc.call(c.address(other), "metadata", {"topics": ["gone"]}, timeout_s=3)
        assert md["topics"][0]["error"] == int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    finally:
        await c.rpc.close()


async def _not(cond: Callable[[], Awaitable[bool]]) -> bool:
    return not await cond()
