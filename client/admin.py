"""Admin operations: topics on the controller, status from every process.

Topic creation and the authoritative partition view (leader, epoch, ISR) come
from the controller (``create_topics``, ``metadata``; docs/protocol.md
"Controller APIs"). The CLI finds it with ``--controller`` (env
``MINIBROKER_CONTROLLER``, default ``127.0.0.1:9090``, the base port of the
local cluster): brokers' metadata names a ``controller_id`` but not the
controller's address, so asking a broker would not help.
``describe`` merges that view with each replica's ``GET /v1/status``
(hw, leo, log_start_offset), marking replicas that do not answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from client.metadata import check_int, check_topic
from common.errors import ErrorCode, error_for
from common.http import RpcClient, RpcError

_INT32_MAX = 2**31 - 1


def _check_names(topics: object) -> list[str] | None:
    """``None`` (all topics) or a list of names; a bare str is refused (it would be read as its letters)."""
    if topics is None:
        return None
    if isinstance(topics, (str, bytes)) or not isinstance(topics, Iterable):
        raise TypeError(f"topics must be a list of str or None, got {type(topics).__name__} {topics!r}")
    return [check_topic(t, "topic name") for t in topics]


def _check_count(what: str, value: object) -> None:
    """An int32 count; -1 (None is turned into -1 by NewTopic) asks for the controller's default."""
    count = check_int(what, value)  # the type; the range has its own message, naming the default
    if not -1 <= count <= _INT32_MAX:
        raise ValueError(f"{what} must be -1 (the default) or 0..{_INT32_MAX}, got {count}")


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    num_partitions: int
    replication_factor: int
    configs: Mapping[str, str]

    def __post_init__(self) -> None:
        check_topic(self.name, "topic name")
        for field_name in ("num_partitions", "replication_factor"):
            if getattr(self, field_name) is None:
                object.__setattr__(self, field_name, -1)
            _check_count(field_name.replace("_", " "), getattr(self, field_name))
        if self.configs is None:
            object.__setattr__(self, "configs", {})
        if not isinstance(self.configs, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.configs.items()):
            raise TypeError(f"configs must be a mapping of str to str, got {self.configs!r}")


class Admin:
    def __init__(self, controller: str, *, timeout_ms: int = 10_000) -> None:
        if not isinstance(controller, str):
            raise TypeError(f"controller must be a str HOST:PORT, got {type(controller).__name__} {controller!r}")
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool):
            raise TypeError(f"timeout_ms must be an int, got {type(timeout_ms).__name__} {timeout_ms!r}")
        if timeout_ms <= 0:
            raise ValueError(f"timeout_ms must be > 0, got {timeout_ms}")
        self.controller = controller
        self._timeout_s = timeout_ms / 1000
        self._rpc = RpcClient(limit_per_host=8, timeout_s=self._timeout_s)

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._rpc.close()

    async def create_topics(self, topics: Sequence[NewTopic]) -> dict[str, tuple[ErrorCode, str]]:
        """Per topic: (error code, message). Nothing is raised for per-topic errors."""
        if isinstance(topics, (str, bytes, NewTopic)) or not isinstance(topics, Iterable):
            raise TypeError(f"topics must be a list of NewTopic, got {type(topics).__name__} {topics!r}")
        topics = list(topics)
        for t in topics:
            if not isinstance(t, NewTopic):
                raise TypeError(f"topics must be a list of NewTopic, got an item {t!r}")
        body = {"topics": [{"name": t.name, "num_partitions": t.num_partitions,
                            "replication_factor": t.replication_factor, "configs": dict(t.configs)}
                           for t in topics]}
        resp = await self._call("create_topics", body)
        out: dict[str, tuple[ErrorCode, str]] = {}
        for t in resp.get("topics") or []:
            out[str(t.get("name"))] = (ErrorCode.of(int(t.get("error", 0))), str(t.get("error_message") or ""))
        return out

    async def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                           configs: Mapping[str, str] | None = None) -> None:
        result = await self.create_topics([NewTopic(name, num_partitions, replication_factor, configs or {})])
        code, message = result.get(name, (ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for the topic"))
        if code is not ErrorCode.NONE:
            raise error_for(code, f"{code.name}: {message}" if message else code.name)

    async def delete_topic(self, name: str) -> None:
        check_topic(name, "topic name")
        resp = await self._call("delete_topics", {"topics": [name]})
        for t in resp.get("topics") or []:
            if str(t.get("name")) != name:
                continue
            code = ErrorCode.of(int(t.get("error", 0)))
            if code is not ErrorCode.NONE:
                message = str(t.get("error_message") or "")
                raise error_for(code, f"{code.name}: {message}" if message else code.name)
            return
        raise error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"UNKNOWN_SERVER_ERROR: no answer for topic {name!r}")

    async def metadata(self, topics: Sequence[str] | None = None) -> dict[str, Any]:
        names = _check_names(topics)
        return await self._call("metadata", {"topics": names if names else None})

    async def _call(self, api: str, body: dict[str, Any]) -> dict[str, Any]:
        """A controller call whose answer has no top-level error; one (the controller could not serve the
        request, e.g. its journal write failed) is raised. Read as having no topics, it made a failed delete
        look done."""
        resp = await self._rpc.call(self.controller, api, body)
        code = ErrorCode.of(int(resp.get("error", 0) or 0))
        if code is not ErrorCode.NONE:
            message = str(resp.get("error_message") or "")
            raise error_for(code, f"{code.name}: {api}: {message}" if message else f"{code.name}: {api}")
        return resp

    async def controller_status(self) -> dict[str, Any]:
        status = await self._rpc.get_json(self.controller, "/v1/status")
        if not isinstance(status, dict):
            raise RpcError(f"status from {self.controller} is not an object")
        return status

    async def broker_status(self, address: str) -> dict[str, Any] | None:
        """A broker's /v1/status, or None when it does not answer."""
        try:
            status = await self._rpc.get_json(address, "/v1/status", timeout_s=min(self._timeout_s, 3.0))
        except RpcError:
            return None
        return status if isinstance(status, dict) else None

    async def describe(self, topics: Sequence[str] | None = None) -> dict[str, Any]:
        """The ``topics describe --json`` document (see the issue / README)."""
        md = await self.metadata(topics)
        brokers = {int(b["node_id"]): f"{b['host']}:{int(b['port'])}" for b in md.get("brokers") or []}
        statuses = dict(zip(brokers, await asyncio.gather(*(self.broker_status(a) for a in brokers.values())),
                            strict=True))
        return describe_document(md, statuses)


def _replica_view(status: Mapping[str, Any] | None) -> dict[tuple[str, int], Mapping[str, Any]]:
    if not status:
        return {}
    return {(str(p.get("topic")), int(p.get("partition", -1))): p for p in status.get("partitions") or []}


def describe_document(md: Mapping[str, Any], statuses: Mapping[int, Mapping[str, Any] | None]) -> dict[str, Any]:
    """Merge controller metadata with broker statuses (pure)."""
    views = {b: _replica_view(s) for b, s in statuses.items()}
    topics: list[dict[str, Any]] = []
    for t in sorted(md.get("topics") or [], key=lambda t: str(t.get("topic"))):
        name = str(t.get("topic"))
        if int(t.get("error", 0)) != 0:
            topics.append({"topic": name, "error": ErrorCode.of(int(t["error"])).name, "partitions": []})
            continue
        parts: list[dict[str, Any]] = []
        for p in sorted(t.get("partitions") or [], key=lambda p: int(p.get("partition", -1))):
            pid = int(p.get("partition", -1))
            replicas = [int(r) for r in p.get("replicas") or []]
            states: list[dict[str, Any]] = []
            for r in replicas:
                view = views.get(r, {}).get((name, pid))
                if view is None:
                    states.append({"broker": r, "hw": None, "leo": None, "log_start_offset": None,
                                   "reachable": statuses.get(r) is not None})
                else:
                    states.append({"broker": r, "hw": view.get("high_watermark"), "leo": view.get("log_end_offset"),
                                   "log_start_offset": view.get("log_start_offset"), "reachable": True})
            entry = {"partition": pid, "leader": int(p.get("leader", -1)),
                     "leader_epoch": int(p.get("leader_epoch", -1)), "replicas": replicas,
                     "isr": [int(r) for r in p.get("isr") or []], "replica_states": states}
            if "partition_epoch" in p:
                entry["partition_epoch"] = int(p["partition_epoch"])
            parts.append(entry)
        topic_entry: dict[str, Any] = {"topic": name, "partitions": parts}
        configs = (md.get("configs") or {}).get(name) if isinstance(md.get("configs"), dict) else t.get("configs")
        if configs:
            topic_entry["configs"] = configs
        topics.append(topic_entry)
    return {"topics": topics}
