"""The controller's aiohttp app: thin handlers over ``Controller`` (docs/protocol.md "Controller APIs").

Each handler decodes the body into typed values (``common.wire`` helpers; a
malformed body is HTTP 400 and changes nothing), calls the controller, and
encodes the answer. ``_guard`` is the one boundary that maps an unexpected
exception to UNKNOWN_SERVER_ERROR, so no request ever gets an HTTP 500.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest

from common import serving
from common.errors import ErrorCode
from common.logging import get_logger
from common.wire import (
    CONTENT_TYPE,
    MAX_INT32,
    BadRequest,
    TopicPartition,
    decode_body,
    encode,
    field,
    host_field,
    int_field,
    int_list,
    is_cluster_id,
    list_field,
    map_items,
)
from controller import ops
from controller.controller import Controller
from controller.journal import JournalBrokenError
from controller.propagator import CONTROLLER_ID
from controller.state import NO_LEADER, MetadataImage

log = get_logger("controller.server")

CONTROLLER_KEY = web.AppKey("controller", Controller)
MAX_BODY_BYTES = 16 * 1024 * 1024

Handler = Callable[[Controller, dict[str, Any]], Awaitable[dict[str, Any]]]


def _msgpack(body: dict[str, Any]) -> web.Response:
    return web.Response(body=encode(body), content_type=CONTENT_TYPE)


def _guard(api: str, handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        try:
            body = decode_body(await serving.read_body(request, MAX_BODY_BYTES))
            return _msgpack(await handler(request.app[CONTROLLER_KEY], body))
        except BadRequest as exc:
            return web.Response(status=400, text=f"{api}: {exc}")
        except serving.BodyStalled as exc:
            return exc.response()
        except web.HTTPException:
            raise  # aiohttp's own answers, e.g. 413 for a body over client_max_size
        except JournalBrokenError as exc:  # logged as journal_failed (critical) already; the process exits
            log.error("request_failed", api=api, error=f"{exc.__class__.__name__}: {exc}")
            return _msgpack({"error": int(ErrorCode.UNKNOWN_SERVER_ERROR),
                             "error_message": f"{exc.__class__.__name__}: {exc}"})
        except Exception as exc:
            log.exception("request_failed", api=api)
            return _msgpack({"error": int(ErrorCode.UNKNOWN_SERVER_ERROR),
                             "error_message": f"{exc.__class__.__name__}: {exc}"})
    return handle


async def broker_registration(c: Controller, body: dict[str, Any]) -> dict[str, Any]:
    node_id = int_field(body, "node_id", lo=0, hi=MAX_INT32)
    host = host_field(body)  # it becomes part of every URL other brokers and clients build for this broker
    port = int_field(body, "port", lo=1, hi=65535)
    incarnation = _incarnation_id(body)
    cluster_id = body.get("cluster_id")  # the broker's meta.properties; absent or nil for a new data dir
    if cluster_id is not None and not is_cluster_id(cluster_id):
        raise BadRequest(f"field 'cluster_id' must be 1-64 ASCII letters, digits, '_' or '-', "
                         f"got {str(cluster_id)[:80]!r}")
    error = c.check_cluster_id(node_id, cluster_id)
    epoch = -1
    if error is ErrorCode.NONE:
        error, epoch = await c.register_broker(node_id, host, port, incarnation)
    return {"error": int(error), "broker_epoch": epoch, "cluster_id": c.cluster_id}


MAX_INCARNATION_ID_LENGTH = 64


def _incarnation_id(body: dict[str, Any]) -> str:
    """1-64 printable ASCII characters (a broker sends a UUID, 36): it is journalled with every registration.
    Required, as Kafka's: registrations without one (or with "") would all be one incarnation, and two
    processes configured with one node id would take the registration from each other."""
    value = field(body, "incarnation_id", str)
    if not 1 <= len(value) <= MAX_INCARNATION_ID_LENGTH or not value.isascii() or not value.isprintable():
        raise BadRequest(f"field 'incarnation_id' must be 1-{MAX_INCARNATION_ID_LENGTH} printable ASCII "
                         f"characters, got {value[:80]!r}" + (f" ({len(value)} characters)" if len(value) > 80 else ""))
    return value


async def broker_heartbeat(c: Controller, body: dict[str, Any]) -> dict[str, Any]:
    node_id = int_field(body, "node_id", lo=0, hi=MAX_INT32)
    epoch = int_field(body, "broker_epoch")
    want_shutdown = field(body, "want_shutdown", bool, False)
    return await c.heartbeat(node_id, epoch, want_shutdown)


async def controlled_shutdown(c: Controller, body: dict[str, Any]) -> dict[str, Any]:
    node_id = int_field(body, "node_id", lo=0, hi=MAX_INT32)
    epoch = int_field(body, "broker_epoch")
    error, remaining = await c.controlled_shutdown(node_id, epoch)
    return {"error": int(error),
            "remaining_partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in remaining]}


async def allocate_producer_ids(c: Controller, body: dict[str, Any]) -> dict[str, Any]:
    broker_id = int_field(body, "broker_id", lo=0, hi=MAX_INT32)
    epoch = int_field(body, "broker_epoch")
    error, start, length = await c.allocate_producer_ids(broker_id, epoch)
    return {"error": int(error), "producer_id_start": start, "producer_id_len": length}


def _alter_items(body: dict[str, Any]) -> list[ops.AlterItem]:
    items: list[ops.AlterItem] = []
    for t in map_items(list_field(body, "topics"), "topics"):
        topic = field(t, "topic", str)
        for p in map_items(list_field(t, "partitions"), "partitions"):
            epochs: dict[int, int] = {}
            for e in map_items(list_field(p, "new_isr_broker_epochs", []), "new_isr_broker_epochs"):
                epochs[int_field(e, "broker_id")] = int_field(e, "broker_epoch")
            items.append(ops.AlterItem(TopicPartition(topic, int_field(p, "partition", lo=0, hi=MAX_INT32)),
                                       int_field(p, "leader_epoch"), int_field(p, "partition_epoch"),
                                       tuple(int_list(p, "new_isr")), epochs))
    # each item is checked against the image before the request, so two for one partition would both pass at
    # its partition epoch and be answered with different ISRs while only the last is committed
    seen: set[TopicPartition] = set()
    for item in items:
        if item.tp in seen:
            raise BadRequest(f"partition {item.tp} appears more than once")
        seen.add(item.tp)
    return items


async def alter_partition(c: Controller, body: dict[str, Any]) -> dict[str, Any]:
    broker_id = int_field(body, "broker_id", lo=0, hi=MAX_INT32)
    epoch = int_field(body, "broker_epoch")
    items = _alter_items(body)
    error, results = await c.alter_partition(broker_id, epoch, items)
    topics: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        st = r.state
        topics.setdefault(r.tp.topic, []).append({
            "partition": r.tp.partition, "error": int(r.error),
            "leader": st.leader if st else NO_LEADER, "leader_epoch": st.leader_epoch if st else -1,
            "isr": list(st.isr) if st else [], "partition_epoch": st.partition_epoch if st else -1})
    return {"error": int(error), "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}


async def create_topics(c: Controller, body: dict[str, Any]) -> dict[str, Any]:
    # configs as sent: nil (or left out) is no configs; anything but a map is INVALID_CONFIG for that topic
    # (ops._check_topic), never read as {} (``[]`` and ``False`` were)
    topics = [ops.NewTopic(t.get("name"), t.get("num_partitions"), t.get("replication_factor"), t.get("configs"))
              for t in map_items(list_field(body, "topics"), "topics")]
    results = await c.create_topics(topics)
    return {"topics": [_topic_result(r) for r in results]}


def _topic_result(r: ops.TopicResult) -> dict[str, Any]:
    return {"name": r.name, "error": int(r.error), "error_message": r.message}


async def delete_topics(c: Controller, body: dict[str, Any]) -> dict[str, Any]:
    """A name listed more than once is not deleted and is answered INVALID_REQUEST, once (Kafka's
    ControllerApis.deleteTopics: "Duplicate topic name."); the other names are deleted as asked."""
    names = list_field(body, "topics")
    duplicated = {n for n, k in Counter(n for n in names if isinstance(n, str)).items() if k > 1}
    results = iter(await c.delete_topics([n for n in names if not (isinstance(n, str) and n in duplicated)]))
    answered: set[str] = set()
    out = []
    for name in names:
        if not (isinstance(name, str) and name in duplicated):
            out.append(_topic_result(next(results)))
        elif name not in answered:
            answered.add(name)
            out.append(_topic_result(ops.TopicResult(name, ErrorCode.INVALID_REQUEST,
                                                     f"topic {name!r} is listed more than once: not deleted")))
    return {"topics": out}


async def metadata(c: Controller, body: dict[str, Any]) -> dict[str, Any]:
    topics = body.get("topics")
    if topics is not None and (not isinstance(topics, list) or not all(isinstance(t, str) for t in topics)):
        raise BadRequest("field 'topics' must be a list of strings or nil")
    return metadata_document(c.image, topics)


def metadata_document(image: MetadataImage, topics: list[str] | None) -> dict[str, Any]:
    live = {b for b, reg in image.brokers.items() if not reg.fenced}
    names = sorted(image.topics) if topics is None else topics
    out = []
    for name in names:
        if name not in image.topics:
            out.append({"topic": name, "error": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), "partitions": []})
            continue
        parts = []
        for tp in image.topic_partitions(name):
            st = image.partitions[tp]
            parts.append({"partition": tp.partition,
                          "error": int(ErrorCode.LEADER_NOT_AVAILABLE if st.leader == NO_LEADER else ErrorCode.NONE),
                          "leader": st.leader, "leader_epoch": st.leader_epoch, "partition_epoch": st.partition_epoch,
                          "replicas": list(st.replicas), "isr": list(st.isr),
                          "offline_replicas": [r for r in st.replicas if r not in live]})
        out.append({"topic": name, "error": 0, "configs": dict(image.topics[name]), "partitions": parts})
    return {"cluster_id": image.cluster_id, "controller_id": CONTROLLER_ID,
            "controller_epoch": image.controller_epoch,
            "brokers": [image.brokers[b].endpoint() for b in sorted(live)], "topics": out}


async def status(request: web.Request) -> web.Response:
    c = request.app[CONTROLLER_KEY]
    doc = metadata_document(c.image, None)
    brokers = [{"node_id": reg.node_id, "host": reg.host, "port": reg.port, "broker_epoch": reg.broker_epoch,
                "fenced": reg.fenced, "shutting_down": reg.node_id in c.shutting_down}
               for _, reg in sorted(c.image.brokers.items())]
    senders = {str(b): {"pending": not s.pending.empty(), "sent": s.sent_ok, "failures": s.failures}
               for b, s in sorted(c.propagator.senders().items())}
    return web.json_response({"role": "controller", "controller_id": CONTROLLER_ID,
                              "controller_epoch": c.image.controller_epoch, "brokers": brokers,
                              "topics": doc["topics"], "propagation": senders,
                              "deleting": {t: sorted(p) for t, p in sorted(c.image.deleting.items())}})


async def metrics(request: web.Request) -> web.Response:
    c = request.app[CONTROLLER_KEY]
    return web.Response(body=generate_latest(c.metrics.registry),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


APIS: dict[str, Handler] = {
    "broker_registration": broker_registration,
    "broker_heartbeat": broker_heartbeat,
    "controlled_shutdown": controlled_shutdown,
    "alter_partition": alter_partition,
    "allocate_producer_ids": allocate_producer_ids,
    "create_topics": create_topics,
    "delete_topics": delete_topics,
    "metadata": metadata,
}


def make_app(controller: Controller) -> web.Application:
    """The app; the controller is started on app startup and closed on cleanup."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[CONTROLLER_KEY] = controller

    async def lifecycle(app: web.Application) -> Any:
        await controller.start()
        yield
        await controller.close()

    app.cleanup_ctx.append(lifecycle)
    for api, handler in APIS.items():
        app.router.add_post(f"/v1/{api}", _guard(api, handler))
    app.router.add_get("/v1/status", status)
    app.router.add_get("/metrics", metrics)
    return app
