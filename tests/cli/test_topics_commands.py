"""``minibroker topics`` as subprocesses against a stand-in controller and broker status endpoints
(real HTTP, the shapes of docs/protocol.md "Controller APIs" and ``GET /v1/status``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from common.errors import ErrorCode
from common.wire import CONTENT_TYPE, decode_body, encode
from tests.cli.helpers import run


class FakeController:
    def __init__(self) -> None:
        self.topics: dict[str, dict[str, Any]] = {}
        self.runners: list[web.AppRunner] = []
        self.broker_ports: dict[int, int] = {}
        self.address = ""
        # set: every request is answered with this as a top-level UNKNOWN_SERVER_ERROR, as the real controller's
        # guard answers one it could not serve (a journal write that failed on a full disk)
        self.failing: str | None = None

    def _failed(self) -> web.Response | None:
        if self.failing is None:
            return None
        return web.Response(body=encode({"error": int(ErrorCode.UNKNOWN_SERVER_ERROR), "error_message": self.failing}),
                            content_type=CONTENT_TYPE)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/create_topics", self.create_topics)
        app.router.add_post("/v1/metadata", self.metadata)
        app.router.add_post("/v1/delete_topics", self.delete_topics)
        self.address = await self._serve(app)
        # broker 1 answers /v1/status; broker 2 is registered but down (port of a closed server)
        status_app = web.Application()
        status_app.router.add_get("/v1/status", self.status)
        self.broker_ports[1] = int((await self._serve(status_app)).rsplit(":", 1)[1])
        dead = web.AppRunner(web.Application())
        await dead.setup()
        site = web.TCPSite(dead, "127.0.0.1", 0)
        await site.start()
        self.broker_ports[2] = dead.addresses[0][1]
        await dead.cleanup()

    async def _serve(self, app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.runners.append(runner)
        return f"127.0.0.1:{runner.addresses[0][1]}"

    async def close(self) -> None:
        for r in self.runners:
            await r.cleanup()

    async def create_topics(self, request: web.Request) -> web.Response:
        body = decode_body(await request.read())
        if (failed := self._failed()) is not None:
            return failed
        out = []
        for t in body["topics"]:
            code = ErrorCode.NONE
            if t["name"] in self.topics:
                code = ErrorCode.TOPIC_ALREADY_EXISTS
            elif t["replication_factor"] > 2:
                code = ErrorCode.INVALID_REPLICATION_FACTOR
            else:
                self.topics[t["name"]] = t
            out.append({"name": t["name"], "error": int(code),
                        "error_message": "" if code is ErrorCode.NONE else f"{code.name.lower()}"})
        return web.Response(body=encode({"topics": out}), content_type=CONTENT_TYPE)

    async def delete_topics(self, request: web.Request) -> web.Response:
        body = decode_body(await request.read())
        if (failed := self._failed()) is not None:
            return failed
        out = []
        for name in body["topics"]:
            code = ErrorCode.NONE if self.topics.pop(name, None) else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            out.append({"name": name, "error": int(code), "error_message": ""})
        return web.Response(body=encode({"topics": out}), content_type=CONTENT_TYPE)

    async def metadata(self, request: web.Request) -> web.Response:
        body = decode_body(await request.read())
        names = body.get("topics") or sorted(self.topics)
        topics = []
        for name in names:
            t = self.topics.get(name)
            if t is None:
                topics.append({"topic": name, "error": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), "partitions": []})
                continue
            replicas = [1, 2][: t["replication_factor"]]
            topics.append({"topic": name, "error": 0, "configs": t["configs"], "partitions": [
                {"partition": p, "error": 0, "leader": 1, "leader_epoch": 2, "partition_epoch": 3,
                 "replicas": replicas, "isr": replicas[:1], "offline_replicas": []}
                for p in range(t["num_partitions"])]})
        return web.Response(body=encode({
            "cluster_id": "x", "controller_id": 0, "controller_epoch": 1, "topics": topics,
            "brokers": [{"node_id": b, "host": "127.0.0.1", "port": port} for b, port in self.broker_ports.items()]}),
            content_type=CONTENT_TYPE)

    async def status(self, _request: web.Request) -> web.Response:
        parts = [{"topic": name, "partition": p, "role": "leader", "leader": 1, "leader_epoch": 2,
                  "partition_epoch": 3, "isr": [1], "replicas": [1, 2], "high_watermark": 10 + p,
                  "log_end_offset": 12 + p, "log_start_offset": 0, "followers": []}
                 for name, t in self.topics.items() for p in range(t["num_partitions"])]
        return web.json_response({"node_id": 1, "role": "broker", "broker_epoch": 5, "controller_epoch": 1,
                                  "partitions": parts})


@pytest.fixture
async def controller() -> AsyncIterator[FakeController]:
    c = FakeController()
    await c.start()
    try:
        yield c
    finally:
        await c.close()


async def test_create_list_describe(controller: FakeController) -> None:
    ctl = ["--controller", controller.address]
    code, out, err = await run("topics", "create", "orders", "--partitions", "2", "--replication-factor", "2",
                               "--config", "min.insync.replicas=2", *ctl)
    assert code == 0, err
    assert out.strip() == "Created topic orders."
    assert controller.topics["orders"]["configs"] == {"min.insync.replicas": "2"}
    code, _, err = await run("topics", "create", "orders", "--partitions", "2", "--replication-factor", "2", *ctl)
    assert code == 1 and "TOPIC_ALREADY_EXISTS" in err and len(err.strip().splitlines()) == 1
    code, _, err = await run("topics", "create", "big", "--partitions", "1", "--replication-factor", "3", *ctl)
    assert code == 1 and "INVALID_REPLICATION_FACTOR" in err
    await run("topics", "create", "audit", "--partitions", "1", "--replication-factor", "1", *ctl)

    code, out, err = await run("topics", "list", *ctl)
    assert code == 0, err
    assert out.splitlines() == ["audit", "orders"]

    code, out, err = await run("topics", "describe", "orders", "--json", *ctl)
    assert code == 0, err
    doc = json.loads(out)
    (topic,) = doc["topics"]
    assert topic["topic"] == "orders"
    p1 = topic["partitions"][1]
    assert {k: p1[k] for k in ("partition", "leader", "leader_epoch", "replicas", "isr")} == {
        "partition": 1, "leader": 1, "leader_epoch": 2, "replicas": [1, 2], "isr": [1]}
    assert p1["replica_states"][0] == {"broker": 1, "hw": 11, "leo": 13, "log_start_offset": 0, "reachable": True}
    assert p1["replica_states"][1]["broker"] == 2 and p1["replica_states"][1]["reachable"] is False

    code, out, err = await run("topics", "describe", *ctl)
    assert code == 0, err
    assert "Topic: orders\tPartitionCount: 2\tReplicationFactor: 2\tConfigs: min.insync.replicas=2" in out
    assert "Partition: 1\tLeader: 1\tLeaderEpoch: 2\tReplicas: 1,2\tIsr: 1\tHW/LEO: 1:11/13 2:?/?" in out
    assert out.rstrip().endswith("(HW/LEO ?/?: that replica's broker did not answer)")

    code, _, err = await run("topics", "describe", "nope", *ctl)
    assert code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err

    code, out, err = await run("topics", "delete", "audit", *ctl)
    assert code == 0 and out.strip() == "Deleted topic audit.", err
    code, _, err = await run("topics", "delete", "audit", *ctl)
    assert code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err
    code, out, _ = await run("topics", "list", *ctl)
    assert out.splitlines() == ["orders"]


async def test_controller_from_the_environment(controller: FakeController, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIBROKER_CONTROLLER", controller.address)
    code, out, err = await run("topics", "list")
    assert code == 0 and out == "", err


def test_describe_text_writes_configs_as_they_are_given() -> None:
    from cli.topics import describe_text

    doc = {"topics": [{"topic": "t", "configs": {"unclean.leader.election.enable": False, "min.insync.replicas": 2},
                       "partitions": [{"partition": 0, "leader": 1, "leader_epoch": 0, "replicas": [1], "isr": [1],
                                       "replica_states": [{"broker": 1, "hw": 3, "leo": 3}]}]}]}
    text = describe_text(doc)
    assert "Configs: min.insync.replicas=2,unclean.leader.election.enable=false" in text
    assert "HW/LEO: 1:3/3" in text and "did not answer" not in text  # the note only when a replica is silent



async def test_a_request_the_controller_could_not_serve_is_an_error_not_a_success(controller: FakeController) -> None:
    # the answer's top-level error was not read: a delete whose journal write failed printed "Deleted topic"
    # and exited 0, and the topic was still there (found by a disk-full review)
    ctl = ["--controller", controller.address]
    await run("topics", "create", "audit", "--partitions", "1", "--replication-factor", "1", *ctl)
    controller.failing = "JournalBrokenError: journal append failed: OSError: [Errno 28] No space left on device"
    code, out, err = await run("topics", "delete", "audit", *ctl)
    assert code == 1 and "Deleted" not in out, (out, err)
    assert "UNKNOWN_SERVER_ERROR: delete_topics: JournalBrokenError" in err and "No space left" in err, err
    code, out, err = await run("topics", "create", "other", "--partitions", "1", "--replication-factor", "1", *ctl)
    assert code == 1 and "create_topics: JournalBrokenError" in err, (out, err)
