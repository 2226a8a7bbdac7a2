"""The Propagator's per-broker senders driven through a scripted transport (no servers): what a failed round
keeps, and when a broker's queue is dropped rather than retried."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from common.http import RpcConnectionError
from common.wire import TopicPartition
from controller.propagator import Propagator
from controller.state import (
    BrokerFencingRecord,
    MetadataImage,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from tests.controller.fakes import eventually

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)


def one_broker_image() -> MetadataImage:
    image = MetadataImage(controller_epoch=1)
    image.apply(RegisterBrokerRecord(1, "127.0.0.1", 9001, "a", 1))
    image.apply(TopicRecord("t", {}))
    for tp in (T0, T1):
        image.apply(PartitionRecord(tp.topic, tp.partition, (1,), (1,), 1, 0, 0))
    return image


class ScriptedTransport:
    """Records every call. ``fail`` calls fail (after ``on_failing`` runs); ``hold_first`` keeps the first call
    waiting for ``release``; the rest are acknowledged."""

    def __init__(self, *, fail: int = 0, hold_first: bool = False,
                 on_failing: Callable[[], None] = lambda: None) -> None:
        self.fail = fail
        self.hold_first = hold_first
        self.on_failing = on_failing
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, address: str, api: str, body: dict[str, Any], *,
                   timeout_s: float | None = None) -> dict[str, Any]:
        self.calls.append((api, body))
        if len(self.calls) == 1 and self.hold_first:
            self.entered.set()
            await self.release.wait()
        if self.fail > 0:
            self.fail -= 1
            self.on_failing()
            raise RpcConnectionError("unreachable")
        return {"error": 0}


async def test_a_fenced_brokers_queue_is_dropped_not_retried() -> None:
    # A round failing for a broker fenced meanwhile must not be retried: the broker gets a full sync when it
    # registers again, and a kept queue would be retried for ever (failing the same way each time).
    image = one_broker_image()
    transport = ScriptedTransport(fail=1_000, on_failing=lambda: image.apply(BrokerFencingRecord(1, 1, True)))
    p = Propagator(lambda: image, transport)
    try:
        p.enqueue(1, partitions=[T0], metadata=True)
        await eventually(lambda: len(transport.calls) == 1, timeout_s=5, what="the first attempt")
        await eventually(p.idle, timeout_s=5, what="the fenced broker's queue to be dropped")
        assert len(transport.calls) == 1
        assert p.senders()[1].failures == 1
    finally:
        await p.close()


async def test_a_new_partition_stays_new_when_a_failed_round_is_merged_back() -> None:
    # A LeaderAndIsr queued as new while an older round was out must still say is_new once that round fails
    # and its work is merged with the queue (a broker creates a log it lacks only for a new partition).
    image = one_broker_image()
    transport = ScriptedTransport(fail=1, hold_first=True)
    p = Propagator(lambda: image, transport)
    try:
        p.enqueue(1, partitions=[T0])
        await asyncio.wait_for(transport.entered.wait(), 5)
        p.enqueue(1, partitions=[T1], new=True)
        transport.release.set()
        await eventually(lambda: len(transport.calls) == 2, timeout_s=5, what="the retried round")
        api, body = transport.calls[1]
        assert api == "leader_and_isr"
        assert {s["partition"]: s["is_new"] for s in body["partition_states"]} == {0: False, 1: True}
    finally:
        await p.close()


def recreate_t(image: MetadataImage, replicas: tuple[int, ...]) -> None:
    """Delete topic t (its replicas already stopped) and create it again with partition 0 on ``replicas``."""
    image.apply(RemoveTopicRecord("t", {}))
    image.apply(TopicRecord("t", {}))
    image.apply(PartitionRecord("t", 0, replicas, replicas, replicas[0], 2, 0))


async def test_a_retried_update_metadata_does_not_delete_a_recreated_topic() -> None:
    # A deletion's UpdateMetadata retried after the name was created again must not list it in
    # deleted_topics: the broker applies deleted_topics last and would drop the new topic.
    image = one_broker_image()
    transport = ScriptedTransport(fail=1, hold_first=True)
    p = Propagator(lambda: image, transport)
    try:
        image.apply(RemoveTopicRecord("t", {}))
        p.enqueue(1, metadata=True, metadata_tps=[T0, T1], deleted_topics=["t"])
        await asyncio.wait_for(transport.entered.wait(), 5)
        assert transport.calls[0][1]["deleted_topics"] == ["t"]
        recreate_t(image, (1,))
        p.enqueue(1, partitions=[T0], new=True, metadata=True, metadata_tps=[T0], metadata_topics=["t"])
        transport.release.set()
        await eventually(lambda: [api for api, _ in transport.calls].count("update_metadata") == 2, timeout_s=5,
                         what="the retried UpdateMetadata")
        metadata = [body for api, body in transport.calls if api == "update_metadata"]
        assert metadata[-1]["deleted_topics"] == []
        assert [(s["topic"], s["partition"]) for s in metadata[-1]["partition_states"]] == [("t", 0)]
        assert metadata[-1]["topic_configs"] == {"t": {}}
    finally:
        await p.close()


async def test_a_retried_leader_and_isr_skips_a_partition_the_broker_no_longer_replicates() -> None:
    # A LeaderAndIsr queued for broker 1, retried after t was deleted and created again on broker 2 only,
    # must not make broker 1 a replica of the new partition.
    image = one_broker_image()
    image.apply(RegisterBrokerRecord(2, "127.0.0.1", 9002, "b", 2))
    transport = ScriptedTransport(fail=1, hold_first=True)
    p = Propagator(lambda: image, transport)
    try:
        p.enqueue(1, partitions=[T0])
        await asyncio.wait_for(transport.entered.wait(), 5)
        recreate_t(image, (2,))
        p.enqueue(1, metadata=True, metadata_tps=[T0], metadata_topics=["t"])
        transport.release.set()
        await eventually(lambda: transport.calls[-1][0] == "update_metadata", timeout_s=5,
                         what="the retried round's UpdateMetadata")
        assert [api for api, _ in transport.calls] == ["leader_and_isr", "update_metadata"]
        assert [s["replicas"] for s in transport.calls[-1][1]["partition_states"]] == [[2]]
    finally:
        await p.close()
