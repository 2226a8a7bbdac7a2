"""A fake cluster of brokers behind the real HTTP interface (docs/protocol.md), for client tests.

Each fake broker is a real aiohttp server on 127.0.0.1 port 0; all share one
``FakeCluster`` state: per partition a leader, a leader epoch, and an
in-memory log of stamped batches (``storage.record_batch``). The HW equals the
LEO unless a test holds it back (``hw_lag``). Tests move leaders, inject
per-partition errors and stop servers to drive the client's error handling.

Idempotent producers (SPEC: KIP-98 without transactions): ``init_producer_id``
hands out distinct ids (after the injected ``init_errors``; a 404 when
``supports_idempotence`` is False, as a broker from before idempotence), and a
produce whose batches carry ``producer_id >= 0`` goes through the leader's
checks of ``check_sequences`` (Kafka's ProducerStateManager: the last 5
batches per producer id, duplicates answered with their original offset,
gaps refused with OUT_OF_ORDER_SEQUENCE_NUMBER). The state is per partition,
shared by every fake broker, as if followers rebuilt it from the replicated
batches. ``lose_answers[tp] = n``: the next ``n`` produce requests that append
to ``tp`` append, then lose their answer (the connection is cut), so the
client retries what was written.

Metadata answers can be stale: ``frozen_metadata[node]`` is what that broker
keeps answering (it missed UpdateMetadata since ``freeze_metadata``), and
``metadata_script`` scripts the next answers whoever is asked: ``"unknown"``
(a broker just restarted, that knows no topic yet) or a node id (answered as
that node would, ``stale_leaders`` included). List offsets, like fetches,
check ``current_leader_epoch`` against ``stale_leaders``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from common.errors import ErrorCode
from common.wire import CONTENT_TYPE, TopicPartition, decode_body, encode
from storage.record_batch import BatchHeader, iter_batches, set_timestamp_type, stamp

SEQUENCE_MASK = 2**31 - 1
CACHED_BATCHES = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN


def last_sequence(h: BatchHeader) -> int:
    return (h.base_sequence + h.record_count - 1) & SEQUENCE_MASK


@dataclass
class ProducerEntry:
    """One producer id's state on a partition: its epoch and its last batches
    (first sequence, last sequence, first offset, last offset)."""

    epoch: int
    batches: deque[tuple[int, int, int, int]] = field(default_factory=lambda: deque(maxlen=CACHED_BATCHES))


def check_sequences(producers: dict[int, ProducerEntry], headers: Sequence[BatchHeader]) -> tuple[ErrorCode, int]:
    """The leader's checks (SPEC "Produce with producer ids") of one partition's batches of one request, as a
    unit: ``(NONE, base_offset)`` when every idempotent batch duplicates consecutive cached batches (nothing
    to append; answer with the first one's original offset), ``(NONE, -1)`` to append them all, else the
    error and -1 (nothing appended)."""
    idempotent = [h for h in headers if h.producer_id >= 0]
    if not idempotent:
        return ErrorCode.NONE, -1
    if any(h.producer_epoch < 0 or h.base_sequence < 0 for h in idempotent):
        return ErrorCode.INVALID_RECORD, -1
    duplicates = []
    for h in idempotent:
        entry = producers.get(h.producer_id)
        found = None
        if entry is not None and entry.epoch == h.producer_epoch:
            for i, (first, last, first_offset, _) in enumerate(entry.batches):
                if (first, last) == (h.base_sequence, last_sequence(h)):
                    found = (h.producer_id, i, first_offset)
        duplicates.append(found)
    if all(d is not None for d in duplicates):
        consecutive = all(a is not None and b is not None and a[0] == b[0] and b[1] == a[1] + 1
                          for a, b in itertools.pairwise(duplicates))
        first_dup = duplicates[0]
        assert first_dup is not None
        return (ErrorCode.NONE, first_dup[2]) if consecutive else (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    if any(d is not None for d in duplicates):
        return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
    # each batch against the state the previous one leaves: (epoch, last sequence) per producer id
    state = {pid: (e.epoch, e.batches[-1][1] if e.batches else None) for pid, e in producers.items()}
    for h in idempotent:
        epoch, last = state.get(h.producer_id, (None, None))
        if epoch is not None and h.producer_epoch < epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH, -1
        if epoch is not None and h.producer_epoch > epoch and h.base_sequence != 0:
            return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
        if epoch == h.producer_epoch and last is not None and h.base_sequence != (last + 1) & SEQUENCE_MASK:
            return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
        state[h.producer_id] = (h.producer_epoch, last_sequence(h))  # an unknown id: any sequence
    return ErrorCode.NONE, -1


def remember(producers: dict[int, ProducerEntry], h: BatchHeader, base_offset: int) -> None:
    """Record an appended idempotent batch (a new epoch starts a fresh entry)."""
    entry = producers.get(h.producer_id)
    if entry is None or entry.epoch != h.producer_epoch:
        entry = producers[h.producer_id] = ProducerEntry(h.producer_epoch)
    entry.batches.append((h.base_sequence, last_sequence(h), base_offset, base_offset + h.last_offset_delta))


@dataclass
class FakePartition:
    leader: int
    replicas: list[int]
    leader_epoch: int = 0
    batches: list[tuple[int, int, bytes]] = field(default_factory=list)  # (base, next, bytes)
    log_start_offset: int = 0
    log_end_offset: int = 0
    hw_lag: int = 0
    producers: dict[int, ProducerEntry] = field(default_factory=dict)  # idempotent producers' state
    max_message_bytes: int | None = None  # the topic's max.message.bytes: a larger batch is MESSAGE_TOO_LARGE
    log_append_time_ms: int | None = None  # set: message.timestamp.type=LogAppendTime, appended at this time

    @property
    def high_watermark(self) -> int:
        return max(self.log_start_offset, self.log_end_offset - self.hw_lag)

    def epoch_end(self, epoch: int) -> tuple[int, int]:
        """The real broker's end_offset_for_epoch, from the batches' stamped epochs: the largest epoch at or
        below ``epoch`` and where it ends; (-1, -1) when there is none."""
        starts: list[tuple[int, int]] = []  # (epoch, start offset), as a leader-epoch cache
        for start, _, data in self.batches:
            e = next(iter_batches(data))[1].partition_leader_epoch
            if not starts or e != starts[-1][0]:
                starts.append((e, start))
        below = [i for i, (e, _) in enumerate(starts) if e <= epoch]
        if not below:
            return -1, -1
        i = below[-1]
        return starts[i][0], starts[i + 1][1] if i + 1 < len(starts) else self.log_end_offset

    def cut_and_bump_epoch(self, offset: int) -> None:
        """An unclean election's new leader: its log ends at ``offset`` (a batch boundary) and it leads a newer
        epoch; what the old leader had from ``offset`` on is gone."""
        assert any(start == offset for start, _, _ in self.batches) or offset == self.log_end_offset
        self.batches = [b for b in self.batches if b[0] < offset]
        self.log_end_offset = offset
        self.leader_epoch += 1


class FakeCluster:
    def __init__(self) -> None:
        self.partitions: dict[TopicPartition, FakePartition] = {}
        self.addresses: dict[int, str] = {}
        self.runners: dict[int, web.AppRunner] = {}
        self.errors: dict[TopicPartition, deque[ErrorCode]] = defaultdict(deque)
        self.produce_requests = 0
        self.fetch_requests = 0
        self.fetch_offsets: list[tuple[TopicPartition, int]] = []  # each partition's fetch_offset, as asked
        self.base_offset_in_answers = True  # False: successful produce answers leave base_offset out
        self.changed = asyncio.Condition()
        self.supports_idempotence = True  # False: init_producer_id is an unknown path (HTTP 404)
        self.init_errors: deque[ErrorCode] = deque()  # answered by init_producer_id before it succeeds
        self.init_requests = 0
        self.next_producer_id = 1000
        self.lose_answers: Counter[TopicPartition] = Counter()
        # tp -> n: the next request carrying more than n batches of tp appends only its first n and loses the
        # answer (what a new leader holds when its follower fetch, or recovery, kept a prefix of a request)
        self.append_prefix_and_lose: dict[TopicPartition, int] = {}
        # (node, tp) -> (leader epoch, log end): that broker was cut off while it led tp at that epoch with that
        # shorter log; it still answers metadata naming itself leader, and fetches as that leader would
        self.stale_leaders: dict[tuple[int, TopicPartition], tuple[int, int]] = {}
        self.lost_answers = 0
        self.duplicates_answered = 0  # produce answers that were a duplicate's original offset
        self.batches_per_partition: list[int] = []  # batches of one partition in each produce request
        # brokers stopped by kill_broker: no longer answering, still in the metadata (as a killed broker is
        # until the controller notices its silence)
        self.dead_but_listed: set[int] = set()
        self.metadata_requests: Counter[str] = Counter()  # per topic asked for
        self.metadata_requests_by_node: Counter[int] = Counter()
        self.frozen_metadata: dict[int, dict[str, Any]] = {}  # node -> the answer it keeps giving
        self.metadata_script: deque[str | int] = deque()  # the next answers: "unknown", or as node n would
        self.malformed_list_offsets = 0  # the next n list_offsets answers carry offset None
        self.hold_produce = asyncio.Event()  # cleared: produce requests wait (unanswered) until it is set
        self.hold_produce.set()
        # each list_offsets request takes the next gate, if any, and is answered once that gate is set
        self.list_offsets_gates: deque[asyncio.Event] = deque()
        self.list_offsets_held = 0  # requests that took a gate

    def headers(self, tp: TopicPartition) -> list[BatchHeader]:
        """The headers of ``tp``'s stored batches, in log order."""
        return [h for _, _, data in self.partitions[tp].batches for _, h in iter_batches(data)]

    def create_topic(self, topic: str, partitions: int, leaders: list[int] | None = None) -> None:
        ids = sorted(self.addresses)
        for p in range(partitions):
            leader = leaders[p] if leaders else ids[p % len(ids)]
            self.partitions[TopicPartition(topic, p)] = FakePartition(leader=leader, replicas=ids)

    def move_leader(self, tp: TopicPartition, leader: int) -> None:
        part = self.partitions[tp]
        part.leader = leader
        part.leader_epoch += 1

    @property
    def bootstrap(self) -> str:
        return ",".join(self.addresses[i] for i in sorted(self.addresses))

    async def start(self, brokers: int) -> None:
        for node_id in range(1, brokers + 1):
            await self.start_broker(node_id)

    async def start_broker(self, node_id: int) -> None:
        """Start broker ``node_id``'s server: on a free port the first time, on its own port again after
        ``stop_broker`` (a broker restarted)."""
        app = web.Application()
        for api in ("metadata", "produce", "fetch", "list_offsets", "init_producer_id"):
            app.router.add_post(f"/v1/{api}", self._handler(node_id, api))
        runner = web.AppRunner(app)
        await runner.setup()
        known = self.addresses.get(node_id)
        site = web.TCPSite(runner, "127.0.0.1", int(known.rsplit(":", 1)[1]) if known else 0)
        await site.start()
        port = runner.addresses[0][1]
        self.addresses[node_id] = f"127.0.0.1:{port}"
        self.runners[node_id] = runner
        self.dead_but_listed.discard(node_id)

    async def stop_broker(self, node_id: int) -> None:
        runner = self.runners.pop(node_id, None)
        if runner is not None:
            await runner.cleanup()

    async def kill_broker(self, node_id: int) -> None:
        """Stop a broker's server but keep it in the metadata, leading what it led: a broker killed a moment
        ago, before the controller noticed."""
        self.dead_but_listed.add(node_id)
        await self.stop_broker(node_id)

    async def close(self) -> None:
        self.hold_produce.set()  # held requests are answered, not left for the server's shutdown timeout
        for node_id in list(self.runners):
            await self.stop_broker(node_id)

    def _handler(self, node_id: int, api: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            if api == "init_producer_id" and not self.supports_idempotence:
                return web.Response(status=404, text=f"no such path: {request.path}")  # as broker/server.py
            body = decode_body(await request.read())
            result = await getattr(self, f"_{api}")(node_id, body)
            if result.pop("lose_answer", False):
                assert request.transport is not None
                request.transport.abort()  # appended, but the client never hears of it
            return web.Response(body=encode(result), content_type=CONTENT_TYPE)
        return handle

    def freeze_metadata(self, node_id: int, topics: list[str] | None = None) -> None:
        """From now on ``node_id`` answers metadata as it would now, whatever changes (it missed UpdateMetadata)."""
        self.frozen_metadata[node_id] = self._metadata_answer(node_id, topics)

    async def _metadata(self, node_id: int, body: dict[str, Any]) -> dict[str, Any]:
        wanted = body.get("topics")
        self.metadata_requests.update(wanted or [])
        self.metadata_requests_by_node[node_id] += 1
        if node_id in self.frozen_metadata:
            return copy.deepcopy(self.frozen_metadata[node_id])
        if self.metadata_script:
            mode = self.metadata_script.popleft()
            if mode == "unknown":
                answer = self._metadata_answer(node_id, [])
                answer["topics"] = [{"topic": t, "error": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), "partitions": []}
                                    for t in wanted or []]
                return answer
            assert isinstance(mode, int)
            node_id = mode
        return self._metadata_answer(node_id, wanted)

    def _metadata_answer(self, node_id: int, wanted: list[str] | None) -> dict[str, Any]:
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, part in sorted(self.partitions.items()):
            if wanted is None or tp.topic in wanted:
                stale = self.stale_leaders.get((node_id, tp))
                leader, epoch = (node_id, stale[0]) if stale is not None else (part.leader, part.leader_epoch)
                topics.setdefault(tp.topic, []).append({
                    "partition": tp.partition, "error": 0, "leader": leader,
                    "leader_epoch": epoch, "replicas": part.replicas, "isr": part.replicas,
                    "offline_replicas": []})
        out = [{"topic": t, "error": 0, "partitions": ps} for t, ps in topics.items()]
        out += [{"topic": t, "error": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), "partitions": []}
                for t in wanted or [] if t not in topics]
        brokers = [{"node_id": i, "host": a.split(":")[0], "port": int(a.split(":")[1])}
                   for i, a in self.addresses.items() if i in self.runners or i in self.dead_but_listed]
        return {"cluster_id": "fake", "controller_id": 0, "brokers": brokers, "topics": out}

    def _check(self, node_id: int, tp: TopicPartition) -> ErrorCode:
        part = self.partitions.get(tp)
        if part is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if part.leader != node_id:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    async def _init_producer_id(self, node_id: int, body: dict[str, Any]) -> dict[str, Any]:
        self.init_requests += 1
        assert body["transactional_id"] is None and body["producer_id"] == -1 and body["producer_epoch"] == -1
        if self.init_errors:
            return {"error": int(self.init_errors.popleft()), "producer_id": -1, "producer_epoch": -1}
        self.next_producer_id += 1
        return {"error": 0, "producer_id": self.next_producer_id - 1, "producer_epoch": 0}

    async def _produce(self, node_id: int, body: dict[str, Any]) -> dict[str, Any]:
        self.produce_requests += 1
        await self.hold_produce.wait()
        lose = False
        topics = []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                tp = TopicPartition(t["topic"], p["partition"])
                code = self._check(node_id, tp)
                if code is ErrorCode.NONE and self.errors[tp]:
                    code = self.errors[tp].popleft()
                if code is not ErrorCode.NONE:
                    parts.append({"partition": tp.partition, "error": int(code), "base_offset": -1,
                                  "log_start_offset": -1})
                    continue
                part = self.partitions[tp]
                base = part.log_end_offset
                buf = bytearray(p["records"])
                batches = list(iter_batches(bytes(buf)))
                self.batches_per_partition.append(len(batches))
                limit = part.max_message_bytes
                # as the broker's check_batches: any batch too large refuses the partition's records, before
                # the sequence checks
                code, duplicate_of = (ErrorCode.MESSAGE_TOO_LARGE, -1) if limit is not None and any(
                    h.size > limit for _, h in batches) else check_sequences(part.producers, [h for _, h in batches])
                if code is not ErrorCode.NONE:
                    parts.append({"partition": tp.partition, "error": int(code), "base_offset": -1,
                                  "log_start_offset": -1})
                    continue
                if duplicate_of >= 0:
                    self.duplicates_answered += 1
                    base = duplicate_of
                    batches = []
                prefix = self.append_prefix_and_lose.get(tp)
                if prefix is not None and len(batches) > prefix:
                    del self.append_prefix_and_lose[tp]
                    batches = batches[:prefix]
                    lose = True
                if part.log_append_time_ms is not None and batches:  # as the broker does (batches from pos 0)
                    buf[:] = set_timestamp_type(bytes(buf), [h for _, h in batches], part.log_append_time_ms)
                for pos, header in batches:
                    stamp(buf, pos, base_offset=part.log_end_offset, partition_leader_epoch=part.leader_epoch)
                    start = part.log_end_offset
                    if header.producer_id >= 0:
                        remember(part.producers, header, start)
                    part.log_end_offset += header.last_offset_delta + 1
                    part.batches.append((start, part.log_end_offset, bytes(buf[pos:pos + header.size])))
                if batches and self.lose_answers[tp] > 0:
                    self.lose_answers[tp] -= 1
                    lose = True
                answer = {"partition": tp.partition, "error": 0, "base_offset": base,
                          "log_start_offset": part.log_start_offset,
                          "log_append_time_ms": -1 if part.log_append_time_ms is None or duplicate_of >= 0
                          else part.log_append_time_ms}
                if not self.base_offset_in_answers:
                    del answer["base_offset"]
                parts.append(answer)
            topics.append({"topic": t["topic"], "partitions": parts})
        async with self.changed:
            self.changed.notify_all()
        if lose:
            self.lost_answers += 1
            return {"topics": topics, "lose_answer": True}
        return {"topics": topics}

    def _read(self, node_id: int, tp: TopicPartition, offset: int, max_bytes: int,
              current_leader_epoch: int = -1, min_one: bool = True, last_fetched_epoch: int = -1) -> dict[str, Any]:
        code = self._check(node_id, tp)
        part = self.partitions.get(tp)
        stale = self.stale_leaders.get((node_id, tp))
        if stale is not None and current_leader_epoch <= stale[0]:  # a cut-off old leader, believed by the client
            return {"partition": tp.partition, "error": int(ErrorCode.OFFSET_OUT_OF_RANGE), "high_watermark": stale[1],
                    "log_start_offset": 0, "log_end_offset": stale[1], "diverging_epoch": None, "records": b""}
        if stale is not None:  # the client knows a newer epoch: the real broker answers UNKNOWN_LEADER_EPOCH
            code = ErrorCode.UNKNOWN_LEADER_EPOCH
        base: dict[str, Any] = {"partition": tp.partition, "error": int(code), "high_watermark": -1,
                                "log_start_offset": -1, "log_end_offset": -1, "diverging_epoch": None,
                                "records": b""}
        if part is None or code is not ErrorCode.NONE:
            return base
        base.update(high_watermark=part.high_watermark, log_start_offset=part.log_start_offset,
                    log_end_offset=part.log_end_offset)
        if last_fetched_epoch >= 0 and offset >= part.log_start_offset:  # KIP-320, before the range check
            epoch, end = part.epoch_end(last_fetched_epoch)
            if epoch < 0:
                base["error"] = int(ErrorCode.OFFSET_OUT_OF_RANGE)
                return base
            if end < offset or epoch < last_fetched_epoch:
                base["diverging_epoch"] = {"epoch": epoch, "end_offset": end}
                return base
        if offset < part.log_start_offset or offset > part.high_watermark:
            base["error"] = int(ErrorCode.OFFSET_OUT_OF_RANGE)
            return base
        chunks: list[bytes] = []
        size = 0
        for start, end, data in part.batches:
            if end <= offset or start < part.log_start_offset:
                continue
            if end > part.high_watermark or ((chunks or not min_one) and size + len(data) > max_bytes):
                break
            chunks.append(data)
            size += len(data)
        base["records"] = b"".join(chunks)
        return base

    async def _fetch(self, node_id: int, body: dict[str, Any]) -> dict[str, Any]:
        self.fetch_requests += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + body["max_wait_ms"] / 1000
        while True:
            topics = []
            total = 0
            size = 0  # as the real broker: the request's max_bytes over all partitions, in the order listed, and
            # at least one batch only for the first (the first partition with data gets one whole batch)
            for t in body["topics"]:
                parts = []
                for p in t["partitions"]:
                    self.fetch_offsets.append((TopicPartition(t["topic"], p["partition"]), p["fetch_offset"]))
                    budget = min(p["partition_max_bytes"], body["max_bytes"] - size)
                    r = self._read(node_id, TopicPartition(t["topic"], p["partition"]), p["fetch_offset"],
                                   budget, p.get("current_leader_epoch", -1), min_one=size == 0,
                                   last_fetched_epoch=p.get("last_fetched_epoch", -1))
                    size += len(r["records"])
                    total += len(r["records"]) + (1 if r["error"] else 0)
                    parts.append(r)
                topics.append({"topic": t["topic"], "partitions": parts})
            remaining = deadline - loop.time()
            if total >= body["min_bytes"] or remaining <= 0:
                return {"error": 0, "topics": topics}
            async with self.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), remaining)

    async def _list_offsets(self, node_id: int, body: dict[str, Any]) -> dict[str, Any]:
        if self.list_offsets_gates:
            gate = self.list_offsets_gates.popleft()
            self.list_offsets_held += 1
            await gate.wait()
        topics = []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                tp = TopicPartition(t["topic"], p["partition"])
                code = self._check(node_id, tp)
                offset: int | None = -1
                stale = self.stale_leaders.get((node_id, tp))
                if stale is not None and p.get("current_leader_epoch", -1) <= stale[0]:
                    code = ErrorCode.NONE  # a cut-off old leader, believed by the client: its own short log
                    offset = 0 if p["timestamp"] == -2 else stale[1]
                elif stale is not None:
                    code = ErrorCode.UNKNOWN_LEADER_EPOCH
                elif code is ErrorCode.NONE:
                    part = self.partitions[tp]
                    offset = part.log_start_offset if p["timestamp"] == -2 else part.high_watermark
                if code is ErrorCode.NONE and self.malformed_list_offsets > 0:
                    self.malformed_list_offsets -= 1
                    offset = None
                parts.append({"partition": tp.partition, "error": int(code), "timestamp": -1, "offset": offset,
                              "leader_epoch": -1})
            topics.append({"topic": t["topic"], "partitions": parts})
        return {"topics": topics}


@contextlib.asynccontextmanager
async def running(topic: str, partitions: int, *, brokers: int = 2) -> AsyncIterator[FakeCluster]:
    """``brokers`` fake brokers on 127.0.0.1 serving ``topic`` with ``partitions`` partitions; closed on exit."""
    cluster = FakeCluster()
    try:
        await cluster.start(brokers)
        cluster.create_topic(topic, partitions)
        yield cluster
    finally:
        await cluster.close()


async def _serve_forever(topic: str, partitions: int) -> None:
    async with running(topic, partitions, brokers=1) as cluster:
        print(cluster.bootstrap, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    # For client benchmarks: `python -m tests.client.fake_broker [TOPIC] [PARTITIONS]` prints its address.
    import sys

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(sys.argv[1] if len(sys.argv) > 1 else "perf",
                                   int(sys.argv[2]) if len(sys.argv) > 2 else 3))
