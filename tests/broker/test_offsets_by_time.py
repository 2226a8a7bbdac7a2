"""Offsets by time from the user's side, against a real broker (the test acting as controller): the consumer's
``offsets_for_times`` and ``list_offsets`` with -3 (KIP-734's max timestamp), and ``minibroker get-offsets``
(kafka-get-offsets.sh) as a subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from client import Consumer, OffsetAndTimestamp
from common.http import RpcClient
from common.wire import TopicPartition
from tests.broker.conftest import StartBroker, batch, part, produce_body
from tests.cli.helpers import run
from tests.fake_controller import FakeController

TOPIC = "times"
P0, P1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


@pytest.fixture
async def broker(start_broker: StartBroker, controller: FakeController, rpc: RpcClient) -> AsyncIterator[str]:
    """One broker leading both partitions of TOPIC (RF 1, so the HW follows each append). Partition 0: offsets
    0-2 at 1000, 3-4 at 5000, 5-7 at 3000; partition 1 is empty."""
    b = await start_broker()
    for tp in (P0, P1):
        await controller.elect(tp, leader=1, replicas=[1])
    for n, ts in ((3, 1000), (2, 5000), (3, 3000)):
        assert part(await rpc.call(b.address, "produce", produce_body(batch(n, ts=ts), tp=P0)))["error"] == 0
    yield b.address


async def test_offsets_for_times_and_max_timestamp(broker: str) -> None:
    async with Consumer(broker) as consumer:
        found = await consumer.offsets_for_times({P0: 2000, P1: 2000, (TOPIC, 0): 1000})
        assert found == {P0: OffsetAndTimestamp(0, 1000, 0), P1: None}  # the tuple form names P0 again
        assert await consumer.offsets_for_times({P0: 4000}) == {P0: OffsetAndTimestamp(3, 5000, 0)}
        assert await consumer.offsets_for_times({P0: 5001}) == {P0: None}
        assert await consumer.list_offsets([P0, P1], -3) == {P0: 3, P1: -1}
        assert await consumer.list_offsets([P0], 2000) == {P0: 3}
        with pytest.raises(ValueError, match="timestamp of times-0 must be"):
            await consumer.offsets_for_times({P0: -1})  # the special ones go through list_offsets
        with pytest.raises(ValueError, match="timestamp must be"):
            await consumer.list_offsets([P0], -4)
        with pytest.raises(TypeError, match="mapping"):
            await consumer.offsets_for_times([P0])  # type: ignore[arg-type]


async def test_get_offsets(broker: str) -> None:
    async def get_offsets(*argv: str) -> tuple[int, str, str]:
        return await run("get-offsets", TOPIC, "--bootstrap", broker, *argv)

    assert await get_offsets() == (0, "times:0:8\ntimes:1:0\n", "")  # latest, every partition
    assert await get_offsets("--time", "earliest") == (0, "times:0:0\ntimes:1:0\n", "")
    status, out, err = await get_offsets("--time", "max-timestamp")
    assert (status, out) == (0, "times:0:3\n") and err == "no offset for that time in partition 1\n"
    assert await get_offsets("--time", "-3", "--partitions", "0") == (0, "times:0:3\n", "")
    status, out, err = await get_offsets("--time", "2000", "--partitions", "0-")
    assert (status, out) == (0, "times:0:3\n") and err == "no offset for that time in partition 1\n"
    status, out, err = await get_offsets("--time", "9999", "--partitions", "0,1")
    assert (status, out) == (0, "") and err == "no offset for that time in partitions 0, 1\n"
    status, out, err = await get_offsets("--partitions", "1,7")
    assert status == 2 and out == "" and "topic 'times' has no partition 7 (partitions 0..1)" in err
    status, out, err = await get_offsets("--time", "soon")
    assert status == 2 and "--time must be a timestamp in ms" in err and "Traceback" not in err
    status, out, err = await run("get-offsets", "nope", "--bootstrap", broker, "--metadata-timeout-ms", "2000")
    assert status == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err and "nope" in err and "Traceback" not in err
