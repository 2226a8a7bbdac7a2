"""A stand-in controller: a real aiohttp server on 127.0.0.1 port 0 with the controller's
broker-facing APIs (docs/protocol.md), plus helpers to act as the controller towards brokers.

Served: ``broker_registration`` (a new, larger broker epoch per call),
``broker_heartbeat``, ``alter_partition`` (checked like the controller: broker
epoch, leader and leader epoch, partition epoch; accepted changes bump
``partition_epoch`` and are recorded in ``alter_requests``),
``controlled_shutdown`` (recorded; answers with no remaining partitions),
``allocate_producer_ids`` (blocks of ``producer_id_block_len`` from an in-memory
counter, broker epoch checked; ``refuse_producer_ids`` makes it answer an error).

Tests may hold AlterPartition answers (``hold_alter``) or refuse them
(``reject_alter``), and send ``leader_and_isr`` / ``update_metadata`` /
``stop_replica`` to brokers with ``send_*`` or the higher-level ``elect``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from common.errors import ErrorCode
from common.http import RpcClient
from common.wire import CONTENT_TYPE, TopicPartition, decode_body, encode
from controller.rules import same_isr


@dataclass
class FakeBroker:
    node_id: int
    host: str
    port: int
    broker_epoch: int
    incarnation_id: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class FakePartition:
    replicas: list[int]
    leader: int
    leader_epoch: int
    isr: list[int]
    partition_epoch: int = 0

    def state(self, tp: TopicPartition, is_new: bool = False) -> dict[str, Any]:
        return {"topic": tp.topic, "partition": tp.partition, "leader": self.leader,
                "leader_epoch": self.leader_epoch, "isr": list(self.isr), "partition_epoch": self.partition_epoch,
                "replicas": list(self.replicas), "is_new": is_new}


@dataclass
class FakeController:
    controller_id: int = 100
    controller_epoch: int = 1
    brokers: dict[int, FakeBroker] = field(default_factory=dict)
    partitions: dict[TopicPartition, FakePartition] = field(default_factory=dict)
    alter_requests: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: list[dict[str, Any]] = field(default_factory=list)
    shutdown_remaining_answers: int = 0  # this many controlled_shutdown answers still name a partition
    shutdown_requests: list[dict[str, Any]] = field(default_factory=list)
    reject_alter: ErrorCode | None = None
    lose_alter_answers: int = 0  # apply this many AlterPartitions, then answer 503 as if the answer were lost
    address: str = ""
    next_producer_id: int = 0
    producer_id_block_len: int = 1000
    refuse_producer_ids: bool = False
    producer_id_requests: list[dict[str, Any]] = field(default_factory=list)
    also_live: list[int] = field(default_factory=list)  # listed as live in UpdateMetadata (see broker_list)
    _next_epoch: int = 10
    _runner: web.AppRunner | None = None
    _rpc: RpcClient = field(default_factory=lambda: RpcClient(timeout_s=10.0))
    hold_alter: asyncio.Event = field(default_factory=asyncio.Event)
    alter_seen: asyncio.Condition = field(default_factory=asyncio.Condition)

    def __post_init__(self) -> None:
        self.hold_alter.set()  # set = answer at once; clear() to hold answers

    async def start(self) -> FakeController:
        app = web.Application()
        for api in ("broker_registration", "broker_heartbeat", "alter_partition", "controlled_shutdown",
                    "allocate_producer_ids"):
            app.router.add_post(f"/v1/{api}", self._handler(api))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.address = f"127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def close(self) -> None:
        self.hold_alter.set()
        await self._rpc.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _handler(self, api: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            try:
                body = decode_body(await request.read())
            except ValueError as exc:
                return web.Response(status=400, text=str(exc))
            result = await getattr(self, f"_{api}")(body)
            return web.Response(body=encode(result), content_type=CONTENT_TYPE)
        return handle

    # ---- served APIs ----------------------------------------------------------------------------
    async def _broker_registration(self, body: dict[str, Any]) -> dict[str, Any]:
        self._next_epoch += 1
        b = FakeBroker(body["node_id"], body["host"], body["port"], self._next_epoch, body["incarnation_id"])
        self.brokers[b.node_id] = b
        return {"error": 0, "broker_epoch": b.broker_epoch}

    async def _broker_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        self.heartbeats.append(body)
        b = self.brokers.get(body["node_id"])
        if b is None or b.broker_epoch != body["broker_epoch"]:
            return {"error": int(ErrorCode.STALE_BROKER_EPOCH), "is_fenced": True, "should_shutdown": False}
        return {"error": 0, "is_fenced": False, "should_shutdown": False}

    async def _allocate_producer_ids(self, body: dict[str, Any]) -> dict[str, Any]:
        self.producer_id_requests.append(body)
        b = self.brokers.get(body["broker_id"])
        if self.refuse_producer_ids:
            return {"error": int(ErrorCode.UNKNOWN_SERVER_ERROR), "producer_id_start": -1, "producer_id_len": 0}
        if b is None or b.broker_epoch != body["broker_epoch"]:
            return {"error": int(ErrorCode.STALE_BROKER_EPOCH), "producer_id_start": -1, "producer_id_len": 0}
        start = self.next_producer_id
        self.next_producer_id += self.producer_id_block_len
        return {"error": 0, "producer_id_start": start, "producer_id_len": self.producer_id_block_len}

    async def _controlled_shutdown(self, body: dict[str, Any]) -> dict[str, Any]:
        self.shutdown_requests.append(body)
        if len(self.shutdown_requests) <= self.shutdown_remaining_answers:
            return {"error": 0, "remaining_partitions": [{"topic": "t", "partition": 0}]}
        return {"error": 0, "remaining_partitions": []}

    async def _alter_partition(self, body: dict[str, Any]) -> dict[str, Any]:
        async with self.alter_seen:
            self.alter_requests.append(body)
            self.alter_seen.notify_all()
        await self.hold_alter.wait()
        b = self.brokers.get(body["broker_id"])
        if b is None or b.broker_epoch != body["broker_epoch"]:
            return {"error": int(ErrorCode.STALE_BROKER_EPOCH), "topics": []}
        topics = []
        for t in body["topics"]:
            parts = [self._alter_one(body["broker_id"], TopicPartition(t["topic"], p["partition"]), p)
                     for p in t["partitions"]]
            topics.append({"topic": t["topic"], "partitions": parts})
        if self.lose_alter_answers > 0:
            self.lose_alter_answers -= 1
            raise web.HTTPServiceUnavailable(text="the answer was lost (test)")
        return {"error": 0, "topics": topics}

    def _alter_one(self, broker_id: int, tp: TopicPartition, p: dict[str, Any]) -> dict[str, Any]:
        part = self.partitions.get(tp)
        out: dict[str, Any] = {"partition": tp.partition, "error": 0, "leader": -1, "leader_epoch": -1,
                               "isr": [], "partition_epoch": -1}
        if part is None:
            return {**out, "error": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)}
        cur = {"leader": part.leader, "leader_epoch": part.leader_epoch, "isr": list(part.isr),
               "partition_epoch": part.partition_epoch}
        if self.reject_alter is not None:
            return {**out, **cur, "error": int(self.reject_alter)}
        if part.leader != broker_id:
            return {**out, **cur, "error": int(ErrorCode.NOT_LEADER_OR_FOLLOWER)}
        if p["leader_epoch"] != part.leader_epoch:
            return {**out, **cur, "error": int(ErrorCode.FENCED_LEADER_EPOCH)}
        if p["partition_epoch"] != part.partition_epoch:  # the controller's rule, a resend of an applied change
            return {**out, **cur} if same_isr(p["new_isr"], part.isr) else {
                **out, **cur, "error": int(ErrorCode.INVALID_UPDATE_VERSION)}
        part.isr = list(p["new_isr"])
        part.partition_epoch += 1
        return {**out, "leader": part.leader, "leader_epoch": part.leader_epoch, "isr": list(part.isr),
                "partition_epoch": part.partition_epoch}

    async def wait_alter(self, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Wait until ``count`` AlterPartition requests have arrived."""
        async def _wait() -> None:
            async with self.alter_seen:
                await self.alter_seen.wait_for(lambda: len(self.alter_requests) >= count)
        await asyncio.wait_for(_wait(), timeout_s)
        return self.alter_requests

    async def wait_registered(self, node_ids: list[int], timeout_s: float = 30.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not all(n in self.brokers for n in node_ids):
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"brokers {node_ids} did not register; have {sorted(self.brokers)}")
            await asyncio.sleep(0.05)

    # ---- controller -> broker ---------------------------------------------------------------------
    def broker_list(self) -> list[dict[str, Any]]:
        """The live brokers UpdateMetadata names: the registered ones and ``also_live`` (followers a test plays
        itself over HTTP, never sent anything: their address is a placeholder)."""
        listed = [{"node_id": b.node_id, "host": b.host, "port": b.port} for b in self.brokers.values()]
        return listed + [{"node_id": b, "host": "127.0.0.1", "port": 9} for b in self.also_live
                         if b not in self.brokers]

    async def send_leader_and_isr(self, address: str, states: list[dict[str, Any]], *,
                                  controller_epoch: int | None = None, broker_epoch: int = -1,
                                  topic_configs: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        body = {"controller_id": self.controller_id,
                "controller_epoch": self.controller_epoch if controller_epoch is None else controller_epoch,
                "broker_epoch": broker_epoch, "partition_states": states, "live_leaders": self.broker_list(),
                "topic_configs": topic_configs or {}}
        return await self._rpc.call(address, "leader_and_isr", body)

    async def send_update_metadata(self, address: str, *, deleted_topics: list[str] | None = None,
                                   full: bool = False) -> dict[str, Any]:
        body = {"controller_id": self.controller_id, "controller_epoch": self.controller_epoch, "broker_epoch": -1,
                "brokers": self.broker_list(),
                "partition_states": [p.state(tp) for tp, p in self.partitions.items()],
                "topic_configs": {}, "deleted_topics": deleted_topics or [], "full": full}
        return await self._rpc.call(address, "update_metadata", body)

    async def send_stop_replica(self, address: str, tp: TopicPartition, *, delete: bool = False,
                                leader_epoch: int = -1) -> dict[str, Any]:
        body = {"controller_id": self.controller_id, "controller_epoch": self.controller_epoch, "broker_epoch": -1,
                "partitions": [{"topic": tp.topic, "partition": tp.partition, "leader_epoch": leader_epoch,
                                "delete": delete}]}
        return await self._rpc.call(address, "stop_replica", body)

    async def elect(self, tp: TopicPartition, *, leader: int, replicas: list[int], isr: list[int] | None = None,
                    addresses: dict[int, str] | None = None,
                    topic_configs: dict[str, dict[str, Any]] | None = None) -> FakePartition:
        """Set the partition's leader (bumping the leader epoch) and tell every replica (LeaderAndIsr)
        and every registered broker (UpdateMetadata). ``addresses`` overrides registered addresses."""
        old = self.partitions.get(tp)
        part = FakePartition(replicas=list(replicas), leader=leader,
                             leader_epoch=(old.leader_epoch + 1) if old else 0,
                             isr=list(isr if isr is not None else replicas),
                             partition_epoch=(old.partition_epoch + 1) if old else 0)
        self.partitions[tp] = part
        where = dict(addresses or {})
        for b in self.brokers.values():
            where.setdefault(b.node_id, b.address)
        for r in replicas:
            if r in where:
                await self.send_leader_and_isr(where[r], [part.state(tp, is_new=old is None)],
                                               topic_configs=topic_configs)
        for addr in where.values():
            await self.send_update_metadata(addr)
        return part
