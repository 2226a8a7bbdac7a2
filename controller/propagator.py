"""LeaderAndIsr / UpdateMetadata / StopReplica fan-out: one sender task per broker.

Each broker has a ``BrokerSender`` holding what it still has to be told, as
*keys*, not requests: the partitions whose LeaderAndIsr it must get, the
partitions and topic configs its next UpdateMetadata must carry (or "all" after
a (re)registration or a controller start), and the StopReplicas. UpdateMetadata
is incremental like KRaft's metadata deltas: brokers merge partition states
(broker/metadata_cache.py), and every live-broker list is complete. Requests are built from the
current image when sent, so the queue is bounded by the number of partitions
and always carries the latest state (an older state for the same partition is
never sent after a newer one). Failed sends are retried with a bounded backoff
until acknowledged; a broker that is fenced or unregistered has its queue
dropped (it gets a full sync when it registers again). One slow or dead broker
never delays another: every broker has its own task.

Order per round: StopReplica, LeaderAndIsr, then UpdateMetadata, so clients
that learn a new leader from metadata find it already leading.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.errors import ErrorCode
from common.http import RpcClient, RpcError
from common.logging import get_logger
from common.wire import TopicPartition
from controller.state import BrokerRegistration, MetadataImage, PartitionState

log = get_logger("controller.propagator")

CONTROLLER_ID = 3000  # KRaft convention: controller node ids live apart from broker ids
MAX_BACKOFF_S = 1.0
MIN_BACKOFF_S = 0.05
RPC_TIMEOUT_S = 5.0
DELETE_EPOCH = -2  # Kafka's EpochDuringDelete: a StopReplica with delete always applies


class Transport(Protocol):
    async def call(self, address: str, api: str, body: dict[str, Any], *,
                   timeout_s: float | None = None) -> dict[str, Any]: ...


def partition_state_wire(tp: TopicPartition, st: PartitionState, *, is_new: bool = False) -> dict[str, Any]:
    return {"topic": tp.topic, "partition": tp.partition, "leader": st.leader, "leader_epoch": st.leader_epoch,
            "isr": list(st.isr), "partition_epoch": st.partition_epoch, "replicas": list(st.replicas),
            "is_new": is_new}


def live_endpoints(image: MetadataImage) -> list[dict[str, Any]]:
    return [reg.endpoint() for _, reg in sorted(image.brokers.items()) if not reg.fenced]


@dataclass(slots=True)
class _Pending:
    leader_and_isr: dict[TopicPartition, bool] = field(default_factory=dict)  # tp -> is_new
    stop: dict[TopicPartition, int] = field(default_factory=dict)  # tp -> leader epoch (DELETE_EPOCH)
    deleted_topics: set[str] = field(default_factory=set)
    metadata: bool = False  # an UpdateMetadata is due (at least the live brokers changed)
    metadata_full: bool = False  # ... carrying every partition and topic config
    metadata_tps: set[TopicPartition] = field(default_factory=set)
    metadata_topics: set[str] = field(default_factory=set)  # topics whose configs it carries

    def empty(self) -> bool:
        return not (self.leader_and_isr or self.stop or self.metadata)

    def merge(self, other: _Pending) -> None:
        for tp, is_new in other.leader_and_isr.items():
            self.leader_and_isr[tp] = self.leader_and_isr.get(tp, False) or is_new
        for tp, epoch in other.stop.items():
            self.stop.setdefault(tp, epoch)
        self.deleted_topics |= other.deleted_topics
        self.metadata = self.metadata or other.metadata
        self.metadata_full = self.metadata_full or other.metadata_full
        self.metadata_tps |= other.metadata_tps
        self.metadata_topics |= other.metadata_topics


class BrokerSender:
    """The queue and task for one broker."""

    def __init__(self, node_id: int, propagator: Propagator) -> None:
        self.node_id = node_id
        self._p = propagator
        self.pending = _Pending()
        self._wake = asyncio.Event()
        self.sent_ok = 0
        self.failures = 0
        self.task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        self._wake.set()

    def drop(self) -> None:
        self.pending = _Pending()

    async def run(self) -> None:
        backoff = MIN_BACKOFF_S
        while True:
            await self._wake.wait()
            self._wake.clear()
            while not self.pending.empty():
                reg = self._p.registration(self.node_id)
                if reg is None or reg.fenced:
                    self.drop()
                    break
                work, self.pending = self.pending, _Pending()
                if await self._send_round(reg, work):
                    backoff = MIN_BACKOFF_S
                    continue
                work.merge(self.pending)
                self.pending = work
                self.failures += 1
                self._p.on_failure(self.node_id)
                await asyncio.sleep(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)

    async def _send_round(self, reg: BrokerRegistration, work: _Pending) -> bool:
        try:
            # A StopReplica some partitions of which fail (a log that could not be deleted) does not hold up
            # the LeaderAndIsr and UpdateMetadata behind it; only the failed partitions are retried, with the
            # round's backoff (Kafka's TopicDeletionManager retries failed deletions on their own).
            stopped = not work.stop or await self._stop(reg, work)
            if work.leader_and_isr:
                body = self._p.leader_and_isr_body(reg, work.leader_and_isr)
                if body["partition_states"] and not await self._call(reg, "leader_and_isr", body):
                    return False
            work.leader_and_isr.clear()
            if work.metadata and not await self._call(reg, "update_metadata",
                                                      self._p.update_metadata_body(reg, work)):
                return False
        except RpcError as exc:
            log.info("propagation_failed", broker_id=self.node_id, error=str(exc))
            return False
        except Exception as exc:  # an answer of the wrong shape, a bug: the round's work must not be lost
            log.exception("propagation_failed", broker_id=self.node_id, error=str(exc))
            return False
        if not stopped:
            return False
        self.sent_ok += 1
        return True

    async def _stop(self, reg: BrokerRegistration, work: _Pending) -> bool:
        """Send the StopReplica; the partitions the broker confirmed leave ``work.stop`` (and are reported
        stopped), the failed ones stay. True when none is left."""
        body = self._p.stop_replica_body(reg, work)
        resp = await self._p.transport.call(reg.address, "stop_replica", body, timeout_s=RPC_TIMEOUT_S)
        if not self._acknowledged(reg, "stop_replica", resp, body):
            return False
        failed = {(p.get("topic"), p.get("partition")) for p in resp.get("partitions") or []
                  if isinstance(p, dict) and p.get("error")}
        if failed:
            log.warning("propagation_partition_errors", broker_id=self.node_id, api="stop_replica",
                        partitions=sorted(failed, key=str)[:5])
        done = [tp for tp in work.stop if (tp.topic, tp.partition) not in failed]
        for tp in done:
            del work.stop[tp]
        # a deletion is confirmed per topic and broker: only topics with no partition left to stop here
        left = {tp.topic for tp in work.stop}
        confirmed = [tp for tp in done if tp.topic not in left]
        if confirmed:
            self._p.on_stopped(self.node_id, confirmed)
        return not work.stop

    async def _call(self, reg: BrokerRegistration, api: str, body: dict[str, Any]) -> bool:
        """True when acknowledged."""
        resp = await self._p.transport.call(reg.address, api, body, timeout_s=RPC_TIMEOUT_S)
        return self._acknowledged(reg, api, resp, body)

    def _acknowledged(self, reg: BrokerRegistration, api: str, resp: dict[str, Any], body: dict[str, Any]) -> bool:
        raw = resp.get("error", 0)
        # anything but an integer is no acknowledgement (a broker of ours always answers one)
        error = ErrorCode.of(raw) if type(raw) is int else ErrorCode.UNKNOWN_SERVER_ERROR
        if error is ErrorCode.NONE:
            return True
        log.warning("propagation_refused", broker_id=self.node_id, api=api, error=error.name,
                    broker_epoch=reg.broker_epoch, controller_epoch=body.get("controller_epoch"))
        # STALE_BROKER_EPOCH: the broker re-registered and we have not applied it yet, or it has not seen
        # its own registration answer; retry (bounded backoff) with the image's epoch at that time.
        return False


class Propagator:
    """Owns the per-broker senders; the controller tells it what changed after each commit."""

    def __init__(self, image_fn: Callable[[], MetadataImage], transport: Transport | None = None, *,
                 on_failure: Callable[[int], None] | None = None,
                 on_stopped: Callable[[int, list[TopicPartition]], None] | None = None) -> None:
        self._image_fn = image_fn
        self.on_failure: Callable[[int], None] = on_failure or (lambda _node_id: None)
        self.on_stopped: Callable[[int, list[TopicPartition]], None] = on_stopped or (lambda _n, _tps: None)
        self.transport: Transport = transport if transport is not None else RpcClient(limit_per_host=4)
        self._senders: dict[int, BrokerSender] = {}
        self._closed = False

    def registration(self, node_id: int) -> BrokerRegistration | None:
        return self._image_fn().brokers.get(node_id)

    def _sender(self, node_id: int) -> BrokerSender:
        sender = self._senders.get(node_id)
        if sender is None:
            sender = BrokerSender(node_id, self)
            self._senders[node_id] = sender
        if sender.task is None or sender.task.done():
            sender.task = asyncio.get_running_loop().create_task(sender.run(), name=f"sender-{node_id}")
        return sender

    def senders(self) -> dict[int, BrokerSender]:
        return dict(self._senders)

    def enqueue(self, node_id: int, *, partitions: Iterable[TopicPartition] = (), new: bool = False,
                metadata: bool = False, metadata_full: bool = False,
                metadata_tps: Iterable[TopicPartition] = (), metadata_topics: Iterable[str] = (),
                stop: dict[TopicPartition, int] | None = None, deleted_topics: Iterable[str] = ()) -> None:
        if self._closed:
            return
        reg = self.registration(node_id)
        if reg is None or reg.fenced:
            return
        sender = self._sender(node_id)
        for tp in partitions:
            sender.pending.leader_and_isr[tp] = sender.pending.leader_and_isr.get(tp, False) or new
        for tp, epoch in (stop or {}).items():
            sender.pending.stop.setdefault(tp, epoch)
            sender.pending.leader_and_isr.pop(tp, None)
        sender.pending.deleted_topics.update(deleted_topics)
        sender.pending.metadata = sender.pending.metadata or metadata or metadata_full
        sender.pending.metadata_full = sender.pending.metadata_full or metadata_full
        if not sender.pending.metadata_full:
            sender.pending.metadata_tps.update(metadata_tps)
            sender.pending.metadata_topics.update(metadata_topics)
        sender.wake()

    def full_sync(self, node_id: int) -> None:
        """Everything a (re)registered broker must know: all its partitions and the whole metadata."""
        image = self._image_fn()
        stops = {TopicPartition(name, p): DELETE_EPOCH
                 for name, pending in image.deleting.items() for p in pending.get(node_id, ())}
        self.enqueue(node_id, partitions=[tp for tp, _ in image.partitions_of_broker(node_id)], metadata_full=True,
                     stop=stops, deleted_topics={tp.topic for tp in stops})

    def drop(self, node_id: int) -> None:
        sender = self._senders.get(node_id)
        if sender is not None:
            sender.drop()

    def idle(self) -> bool:
        return all(s.pending.empty() for s in self._senders.values())

    # --- request bodies (built at send time from the current image) ---

    def _header(self, reg: BrokerRegistration) -> dict[str, Any]:
        image = self._image_fn()
        return {"controller_id": CONTROLLER_ID, "controller_epoch": image.controller_epoch,
                "broker_epoch": reg.broker_epoch}

    def leader_and_isr_body(self, reg: BrokerRegistration, tps: dict[TopicPartition, bool]) -> dict[str, Any]:
        image = self._image_fn()
        states = []
        leaders: set[int] = set()
        topics: set[str] = set()
        for tp, is_new in sorted(tps.items()):
            st = image.partitions.get(tp)
            if st is None or reg.node_id not in st.replicas:
                continue
            states.append(partition_state_wire(tp, st, is_new=is_new))
            leaders.add(st.leader)
            topics.add(tp.topic)
        live_leaders = [image.brokers[b].endpoint() for b in sorted(leaders)
                        if b in image.brokers and not image.brokers[b].fenced]
        return {**self._header(reg), "partition_states": states, "live_leaders": live_leaders,
                "topic_configs": {t: dict(image.topics.get(t, {})) for t in sorted(topics)}}

    def update_metadata_body(self, reg: BrokerRegistration, work: _Pending) -> dict[str, Any]:
        image = self._image_fn()
        if work.metadata_full:
            tps: Iterable[TopicPartition] = image.partitions
            topics: Iterable[str] = image.topics
        else:
            tps = [tp for tp in work.metadata_tps if tp in image.partitions]
            topics = [t for t in work.metadata_topics if t in image.topics]
        return {**self._header(reg), "brokers": live_endpoints(image),
                "partition_states": [partition_state_wire(tp, image.partitions[tp]) for tp in sorted(tps)],
                "topic_configs": {t: dict(image.topics[t]) for t in sorted(topics)},
                "deleted_topics": sorted(t for t in work.deleted_topics if t not in image.topics),
                "full": work.metadata_full}

    def stop_replica_body(self, reg: BrokerRegistration, work: _Pending) -> dict[str, Any]:
        return {**self._header(reg),
                "partitions": [{"topic": tp.topic, "partition": tp.partition, "leader_epoch": epoch, "delete": True}
                               for tp, epoch in sorted(work.stop.items())]}

    async def close(self) -> None:
        self._closed = True
        tasks = [s.task for s in self._senders.values() if s.task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if isinstance(self.transport, RpcClient):
            await self.transport.close()
