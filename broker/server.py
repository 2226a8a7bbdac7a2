"""The broker's aiohttp server: thin handlers over the replica manager.

Each handler decodes the body (HTTP 400 on a malformed one, nothing changed),
calls the replica manager and encodes the answer. One boundary function maps
any unexpected exception to UNKNOWN_SERVER_ERROR (never HTTP 500) and logs it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from broker import requests as rq
from broker.replica_manager import ReplicaManager, nest
from common import serving
from common.errors import ErrorCode
from common.logging import get_logger
from common.wire import CONTENT_TYPE, BadRequest, decode_body, encode

log = get_logger("broker")

MAX_BODY_BYTES = 64 * 1024 * 1024

Handler = Callable[[ReplicaManager, dict[str, Any]], Awaitable[dict[str, Any]]]


async def _produce(rm: ReplicaManager, body: dict[str, Any]) -> dict[str, Any]:
    req = rq.parse_produce(body)
    return {"topics": nest(await rm.produce(req))}


async def _fetch(rm: ReplicaManager, body: dict[str, Any]) -> dict[str, Any]:
    return await rm.fetch(rq.parse_fetch(body))


async def _list_offsets(rm: ReplicaManager, body: dict[str, Any]) -> dict[str, Any]:
    replica_id, parts = rq.parse_list_offsets(body)
    return {"topics": nest(rm.list_offsets(replica_id, parts))}


async def _offsets_for_leader_epoch(rm: ReplicaManager, body: dict[str, Any]) -> dict[str, Any]:
    _, parts = rq.parse_offsets_for_leader_epoch(body)
    return {"topics": nest(rm.offsets_for_leader_epoch(parts))}


async def _metadata(rm: ReplicaManager, body: dict[str, Any]) -> dict[str, Any]:
    return rm.metadata.metadata_response(rq.parse_metadata(body))


async def _leader_and_isr(rm: ReplicaManager, body: dict[str, Any]) -> dict[str, Any]:
    return await rm.leader_and_isr(rq.parse_leader_and_isr(body))


async def _stop_replica(rm: ReplicaManager, body: dict[str, Any]) -> dict[str, Any]:
    header, parts = rq.parse_stop_replica(body)
    return await rm.stop_replica(header, parts)


async def _update_metadata(rm: ReplicaManager, body: dict[str, Any]) -> dict[str, Any]:
    return await rm.update_metadata(rq.parse_update_metadata(body))


async def _init_producer_id(rm: ReplicaManager, body: dict[str, Any]) -> dict[str, Any]:
    rq.parse_init_producer_id(body)  # its ids and timeout are ignored: every call gets a new id, epoch 0
    pid = rm.producer_ids.generate() if rm.producer_ids is not None else None
    if pid is None:
        return {"error": int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), "producer_id": -1, "producer_epoch": -1}
    return {"error": 0, "producer_id": pid, "producer_epoch": 0}


HANDLERS: dict[str, Handler] = {
    "produce": _produce,
    "fetch": _fetch,
    "list_offsets": _list_offsets,
    "offsets_for_leader_epoch": _offsets_for_leader_epoch,
    "metadata": _metadata,
    "leader_and_isr": _leader_and_isr,
    "stop_replica": _stop_replica,
    "update_metadata": _update_metadata,
    "init_producer_id": _init_producer_id,
}


def _fetch_kind(body: dict[str, Any]) -> str:
    """``fetch_follower`` for a fetch naming a broker as its replica_id, else ``fetch_consumer``."""
    replica_id = body.get("replica_id", -1)
    return "fetch_follower" if type(replica_id) is int and replica_id >= 0 else "fetch_consumer"


def _endpoint(rm: ReplicaManager, api: str,
              handler: Handler) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    stats = rm.metrics.requests[api]
    requests = rm.metrics.requests
    by_kind = _fetch_kind if api == "fetch" else None  # fetches are counted once more by sender

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter()
        status = 200
        kind = None
        try:
            body = decode_body(await serving.read_body(request, MAX_BODY_BYTES))
            if by_kind is not None:
                kind = requests[by_kind(body)]
            result = await handler(rm, body)
            response = web.Response(body=encode(result), content_type=CONTENT_TYPE)
        except BadRequest as exc:
            status = 400
            response = web.Response(status=400, text=f"{api}: {exc}")
        except serving.BodyStalled as exc:
            status = 408
            response = exc.response()
        except web.HTTPException as exc:  # a body over MAX_BODY_BYTES (413): counted, then aiohttp answers it
            stats.observe(exc.status, time.perf_counter() - started)
            raise
        except Exception as exc:
            log.exception("request_failed", api=api, broker_id=rm.broker_id, error=str(exc))
            stats.errors += 1
            if kind is not None:
                kind.errors += 1
            response = web.Response(body=encode({"error": int(ErrorCode.UNKNOWN_SERVER_ERROR),
                                                 "error_message": f"{type(exc).__name__}: {exc}"}),
                                    content_type=CONTENT_TYPE)
        seconds = time.perf_counter() - started
        stats.observe(status, seconds)
        if kind is not None:
            kind.observe(status, seconds)
        return response
    return handle


def _status(rm: ReplicaManager) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    async def status(request: web.BaseRequest) -> web.StreamResponse:
        return web.json_response(rm.status())
    return status


def _metrics(rm: ReplicaManager) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    async def metrics(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(body=rm.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
    return metrics


def build_server(rm: ReplicaManager, **kwargs: Any) -> web.Server:
    """aiohttp's low-level server with a dict of (method, path) -> handler.

    Not ``web.Application``: the broker has a dozen fixed paths and no middleware, and the
    application's routing and middleware machinery cost ~10-20 us per request (measured with
    the produce benchmark), a tenth of a produce request's whole server-side cost. ``kwargs``
    go to aiohttp's request handler (e.g. ``access_log``)."""
    routes: dict[tuple[str, str], Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]] = {
        ("POST", f"/v1/{api}"): _endpoint(rm, api, handler) for api, handler in HANDLERS.items()}
    routes[("GET", "/v1/status")] = _status(rm)
    routes[("GET", "/metrics")] = _metrics(rm)
    for method, path in list(routes):  # HEAD wherever GET, as aiohttp's router (the controller's) allows it
        if method == "GET":
            routes[("HEAD", path)] = routes[(method, path)]
    paths = {path for _, path in routes}
    rm.metrics.bind(rm.under_replicated_count, rm.offline_count, lambda: len(rm.produce_purgatory),
                    lambda: len(rm.fetch_purgatory))

    def dispatch(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        """The route's own coroutine, for aiohttp to await: no coroutine wrapped around it per request."""
        handler = routes.get((request.method, request.path))
        return handler(request) if handler is not None else no_route(request)

    async def no_route(request: web.BaseRequest) -> web.StreamResponse:
        if request.path in paths:
            allowed = sorted(m for m, p in routes if p == request.path)
            return web.Response(status=405, text=f"{request.method} {request.path}: use {', '.join(allowed)}",
                                headers={"Allow": ", ".join(allowed)})
        return web.Response(status=404, text=f"no such path: {request.path}")

    return low_level_server(dispatch, **kwargs)


def low_level_server(handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
                     **kwargs: Any) -> web.Server:
    """``web.Server(handler)`` taking bodies up to ``MAX_BODY_BYTES`` (aiohttp's request default is 1 MiB).
    Call it with the event loop running."""
    loop = asyncio.get_running_loop()

    def make_request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY_BYTES)

    return web.Server(handler, request_factory=make_request, **kwargs)
