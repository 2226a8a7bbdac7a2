"""The client's view of the cluster: brokers, and leader/epoch per partition.

``ClusterMetadata`` is a pure value built from a ``metadata`` response
(docs/protocol.md); ``MetadataCache`` holds the current one, refreshes it from
any reachable broker (known brokers, then the bootstrap list, starting one
further on each refresh) and lets callers ask for a refresh when a leader
moved (NOT_LEADER_OR_FOLLOWER, a broken connection). Refreshes are coalesced:
concurrent callers share one request, and they are rate-limited by
``retry.backoff.ms``, doubled after each refresh no broker answered up to
``RETRY_BACKOFF_MAX_MS`` (Kafka's ``retry.backoff.max.ms`` default, KIP-580;
without its jitter): while every broker is down a client asks about once a
second, not ten times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from client.errors import NoBrokersAvailableError
from common.clock import Clock, SystemClock
from common.errors import ErrorCode
from common.http import RpcClient, RpcError
from common.logging import get_logger
from common.wire import TopicPartition

log = get_logger(__name__)

RETRY_BACKOFF_MAX_MS = 1_000
# A refresh asks the known brokers in turn; one that does not answer is given up on after the client's
# request.timeout.ms, but after this at most, so that one frozen broker does not hold every refresh for
# Kafka's 30 s default before the next broker is asked.
METADATA_BROKER_TIMEOUT_MS = 5_000


def parse_bootstrap(text: str | Sequence[str]) -> list[str]:
    """``"h1:p1,h2:p2"`` (or ``["h1:p1", "h2:p2"]``) -> ``["h1:p1", "h2:p2"]``; ``ValueError`` with a
    readable message for a bad address, ``TypeError`` for anything but a str or a sequence of str
    (``bytes`` too: ``list(b"...")`` would be ints)."""
    from common.hostport import split_host_port  # here, not at the top: this function is all that uses it

    items: list[str]
    if isinstance(text, str):
        items = text.split(",")
    elif isinstance(text, Sequence) and not isinstance(text, (bytes, bytearray, memoryview)):
        items = []
        for entry in text:
            if not isinstance(entry, str):
                raise TypeError(f"bootstrap addresses must be str, got {type(entry).__name__} {entry!r}")
            items += entry.split(",")
    else:
        raise TypeError(f"bootstrap must be a str or a sequence of str, got {type(text).__name__}")
    out: list[str] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        host, port = split_host_port(item, allow_port_zero=False)  # a connect target: no port 0
        out.append(f"{host}:{port}")
    if not out:
        raise ValueError("no bootstrap address given")
    return out


def check_topic(topic: object, what: str = "topic") -> str:
    """``topic`` if it is a non-empty str; else ``TypeError`` / ``ValueError`` naming ``what``: a topic
    name that is not a str would break every later metadata request (``sorted`` of mixed types, a bad
    request body)."""
    if not isinstance(topic, str):
        raise TypeError(f"{what} must be a str, got {type(topic).__name__} {topic!r}")
    if not topic:
        raise ValueError(f"{what} must not be empty")
    return topic


def check_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` if it is an int (not a bool) within bounds; else TypeError / ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        low = "" if minimum is None else f" >= {minimum}"
        high = "" if maximum is None else f" <= {maximum}"
        raise ValueError(f"{name} must be{low}{' and' if low and high else ''}{high}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error: int = 0


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    brokers: Mapping[int, str] = field(default_factory=dict)  # node_id -> "host:port"
    partitions: Mapping[TopicPartition, PartitionInfo] = field(default_factory=dict)
    topic_errors: Mapping[str, int] = field(default_factory=dict)
    controller_id: int = -1
    cluster_id: str | None = None
    partition_counts: Mapping[str, int] = field(default_factory=dict)  # derived from partitions
    # the highest leader epoch seen per partition (Kafka's Metadata.lastSeenLeaderEpochs): kept when an answer
    # lacks the partition, so a later answer at an older epoch is still known to be stale
    last_seen_epochs: Mapping[TopicPartition, int] = field(default_factory=dict)

    @classmethod
    def build(cls, brokers: Mapping[int, str], partitions: Mapping[TopicPartition, PartitionInfo],
              topic_errors: Mapping[str, int], controller_id: int, cluster_id: str | None,
              last_seen_epochs: Mapping[TopicPartition, int] | None = None) -> ClusterMetadata:
        counts: dict[str, int] = {}
        for tp in partitions:
            counts[tp.topic] = counts.get(tp.topic, 0) + 1
        epochs = {tp: info.leader_epoch for tp, info in partitions.items() if info.leader_epoch >= 0}
        for tp, epoch in (last_seen_epochs or {}).items():
            epochs[tp] = max(epoch, epochs.get(tp, -1))
        return cls(brokers, partitions, topic_errors, controller_id, cluster_id, counts, epochs)

    def partitions_for(self, topic: str) -> list[int]:
        return sorted(tp.partition for tp in self.partitions if tp.topic == topic)

    def leader_address(self, tp: TopicPartition) -> tuple[int, str] | None:
        info = self.partitions.get(tp)
        if info is None or info.leader < 0:
            return None
        address = self.brokers.get(info.leader)
        return None if address is None else (info.leader, address)


def metadata_from_response(resp: Mapping[str, Any]) -> ClusterMetadata:
    brokers = {int(b["node_id"]): f"{b['host']}:{int(b['port'])}" for b in resp.get("brokers") or []}
    partitions: dict[TopicPartition, PartitionInfo] = {}
    topic_errors: dict[str, int] = {}
    for t in resp.get("topics") or []:
        name = str(t["topic"])
        topic_errors[name] = int(t.get("error", 0))
        for p in t.get("partitions") or []:
            tp = TopicPartition(name, int(p["partition"]))
            partitions[tp] = PartitionInfo(
                topic=name, partition=tp.partition, leader=int(p.get("leader", -1)),
                leader_epoch=int(p.get("leader_epoch", -1)),
                replicas=tuple(int(r) for r in p.get("replicas") or ()),
                isr=tuple(int(r) for r in p.get("isr") or ()), error=int(p.get("error", 0)))
    return ClusterMetadata.build(brokers, partitions, topic_errors, int(resp.get("controller_id", -1)),
                                 resp.get("cluster_id"))


def merge_metadata(old: ClusterMetadata, new: ClusterMetadata, topics: Iterable[str] | None) -> ClusterMetadata:
    """A refresh of some topics keeps what is known of the others; a refresh of all replaces all. A partition
    never goes back to an older leader epoch than the last one seen (Kafka's ``Metadata.updateLatestMetadata``),
    even across an answer that lacked it (a broker just restarted answers UNKNOWN_TOPIC_OR_PARTITION, no
    partitions): a broker that was cut off may still answer with the leader it last knew, and a consumer sent
    to that stale leader would take its shorter log for the truth (OFFSET_OUT_OF_RANGE, a reset to the
    beginning). Such an answer keeps the partition's known info, or, when none is known, puts the partition
    without a leader (Kafka leaves it out; here it is kept so the topic's partition count stays right)."""
    wanted = None if topics is None else set(topics)
    partitions = {} if wanted is None else {tp: info for tp, info in old.partitions.items() if tp.topic not in wanted}
    last_seen = old.last_seen_epochs
    for tp, info in new.partitions.items():
        last = last_seen.get(tp, -1)
        if 0 <= info.leader_epoch < last:
            known = old.partitions.get(tp)
            info = known if known is not None and known.leader_epoch >= last else replace(
                info, leader=-1, leader_epoch=last)
        partitions[tp] = info
    # Kafka forgets a last seen epoch once its topic is no longer wanted; a MetadataCache never stops wanting
    # a topic, so every one is kept
    if wanted is None:
        return ClusterMetadata.build(new.brokers, partitions, new.topic_errors, new.controller_id, new.cluster_id,
                                     last_seen)
    topic_errors = {t: e for t, e in old.topic_errors.items() if t not in wanted}
    topic_errors.update(new.topic_errors)
    return ClusterMetadata.build(new.brokers or old.brokers, partitions, topic_errors, new.controller_id,
                                 new.cluster_id or old.cluster_id, last_seen)


class MetadataCache:
    """Current cluster metadata plus the I/O to refresh it."""

    def __init__(self, rpc: RpcClient, bootstrap: Sequence[str], *, clock: Clock | None = None,
                 retry_backoff_ms: int = 100, request_timeout_ms: int = METADATA_BROKER_TIMEOUT_MS) -> None:
        if not bootstrap:
            raise ValueError("no bootstrap address given")
        if isinstance(bootstrap, (str, bytes, bytearray, memoryview)) or not all(
                isinstance(a, str) for a in bootstrap):
            raise TypeError("bootstrap must be a sequence of str addresses (see parse_bootstrap)")
        self._rpc = rpc
        self._bootstrap = list(bootstrap)
        self._clock = clock or SystemClock()
        self._retry_backoff_ms = retry_backoff_ms
        self._request_timeout_ms = min(request_timeout_ms, METADATA_BROKER_TIMEOUT_MS)
        self._topics: set[str] = set()
        self.current = ClusterMetadata()  # a plain attribute: the producer reads it once per record
        self._refreshing: asyncio.Task[ClusterMetadata] | None = None
        self._last_refresh_ms = -(10**12)
        self._failed_refreshes = 0  # in a row: the backoff doubles with each
        self._next_address = 0

    def backoff_ms(self) -> int:
        """How long after a refresh the next one may start: retry.backoff.ms, doubled for each refresh in a row
        that no broker answered, at most RETRY_BACKOFF_MAX_MS (never below retry.backoff.ms)."""
        if not self._failed_refreshes:
            return self._retry_backoff_ms
        doubled = self._retry_backoff_ms << min(self._failed_refreshes - 1, 16)
        return max(self._retry_backoff_ms, min(doubled, RETRY_BACKOFF_MAX_MS))

    def add_topics(self, topics: Iterable[str]) -> None:
        """Topics to ask for on each refresh; ``TypeError``/``ValueError`` (and none added) for a name that
        is not a non-empty str."""
        wanted = list(topics)
        for topic in wanted:
            check_topic(topic)
        self._topics.update(wanted)

    def candidates(self) -> list[str]:
        """Every known broker address (metadata's brokers, then the bootstrap list), rotated past brokers that
        failed to answer and past the one that answered the last refresh: where to send a request that any
        broker can answer."""
        known = [a for _, a in sorted(self.current.brokers.items())]
        seen: list[str] = []
        for address in known + self._bootstrap:
            if address not in seen:
                seen.append(address)
        start = self._next_address % len(seen)
        return seen[start:] + seen[:start]

    async def refresh(self, *, force: bool = False) -> ClusterMetadata:
        """Refresh now (or join a refresh in flight); rate-limited unless ``force``."""
        if self._refreshing is not None and not self._refreshing.done():
            return await asyncio.shield(self._refreshing)
        wait_ms = self._last_refresh_ms + self.backoff_ms() - self._clock.monotonic_ms()
        if not force and wait_ms > 0:  # the rest of the backoff only (now up to a second)
            await asyncio.sleep(wait_ms / 1000)
        if self._refreshing is not None and not self._refreshing.done():
            return await asyncio.shield(self._refreshing)
        self._refreshing = asyncio.ensure_future(self._fetch())
        # read once done: every waiter may have gone (a send ended by the producer's close), and its failure
        # would be logged as never retrieved
        self._refreshing.add_done_callback(_retrieve)
        return await asyncio.shield(self._refreshing)

    async def _fetch(self) -> ClusterMetadata:
        topics = sorted(self._topics)
        errors: list[str] = []
        for address in self.candidates():
            # each refresh starts one broker further on, whether this one answers or not: a broker that
            # answers but missed UpdateMetadata must not be the only one ever asked (Kafka's leastLoadedNode
            # starts at a random node on each call; a rotation spreads refreshes as evenly, deterministically)
            self._next_address += 1
            try:
                resp = await self._rpc.call(address, "metadata", {"topics": topics},
                                            timeout_s=self._request_timeout_ms / 1000)
            except RpcError as exc:
                errors.append(str(exc))
                continue
            fresh = metadata_from_response(resp)
            self.current = merge_metadata(self.current, fresh, topics)
            self._last_refresh_ms = self._clock.monotonic_ms()
            self._failed_refreshes = 0
            return self.current
        self._last_refresh_ms = self._clock.monotonic_ms()
        self._failed_refreshes += 1
        raise NoBrokersAvailableError("no broker answered metadata: " + "; ".join(errors[-3:]))

    async def wait_for_topic(self, topic: str, timeout_ms: int, *, leaders: bool = True,
                             unknown_after_ms: int | None = None) -> list[int]:
        """Partitions of ``topic`` once every one has a leader (with ``leaders=False``: once the topic is
        known); the partitions known at the timeout, else the topic's error.

        ``unknown_after_ms``: give up before the timeout when the brokers keep answering that the topic does
        not exist (UNKNOWN_TOPIC_OR_PARTITION, no partitions) for this long, counted from the first such
        answer. Not at the first answer: a topic the controller has just created reaches the brokers a moment
        later (UpdateMetadata is sent after the create is answered). None: wait for the whole timeout."""
        from common.errors import error_for

        self.add_topics([topic])
        deadline = self._clock.monotonic_ms() + timeout_ms
        unknown_since: int | None = None
        while True:
            try:
                # the wait is bounded, not only the time between refreshes: brokers that accept connections and
                # never answer (paused) held it for a refresh's whole round of them, 5 s each, past max.block.ms
                remaining_ms = max(1, deadline - self._clock.monotonic_ms())
                md = await asyncio.wait_for(self.refresh(force=True), remaining_ms / 1000)
            except TimeoutError:  # the refresh goes on (shared); this wait decides on what is known
                md = self.current
            except NoBrokersAvailableError:
                if self._clock.monotonic_ms() >= deadline:
                    raise
                await asyncio.sleep(min(self.backoff_ms(), max(1, deadline - self._clock.monotonic_ms())) / 1000)
                continue
            parts = md.partitions_for(topic)
            if parts and (not leaders or all(md.leader_address(TopicPartition(topic, p)) for p in parts)):
                return parts
            fatal = ErrorCode.of(md.topic_errors.get(topic, ErrorCode.NONE))
            if not parts and fatal is not ErrorCode.NONE and not fatal.retriable:  # INVALID_TOPIC_EXCEPTION
                raise error_for(fatal, f"{fatal.name}: topic {topic!r}")
            now = self._clock.monotonic_ms()
            unknown = not parts and md.topic_errors.get(topic) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if not unknown:
                unknown_since = None
            else:
                if unknown_since is None:
                    unknown_since = now
                if unknown_after_ms is not None and now - unknown_since >= unknown_after_ms:
                    raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"UNKNOWN_TOPIC_OR_PARTITION: topic {topic!r} does not exist")
            if now >= deadline:
                if parts:
                    return parts
                code = ErrorCode.of(md.topic_errors.get(topic, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                if code is ErrorCode.NONE:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                # Kafka's producer: "Topic t not present in metadata after 60000 ms."
                raise error_for(code, f"{code.name}: topic {topic!r} not present in metadata after {timeout_ms} ms")
            await asyncio.sleep(self._retry_backoff_ms / 1000)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
