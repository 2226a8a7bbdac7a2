"""Metadata that is stale or incomplete (a broker that missed UpdateMetadata, one just restarted, a cut-off old
leader), and consumer answers that arrive for partitions no longer assigned or malformed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from client import Consumer, ConsumerRecord, Producer, TopicPartition
from client.errors import NoBrokersAvailableError
from client.metadata import MetadataCache
from common.errors import MinibrokerError
from common.http import RpcClient
from tests.client.fake_broker import FakeCluster, running
from tests.client.helpers import fast

TOPIC = "events"
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


async def produce(fake: FakeCluster, n: int, partition: int = 0) -> None:
    async with Producer(fake.bootstrap, fast()) as producer:
        for i in range(n):
            await producer.send(TOPIC, str(i).encode(), partition=partition)
        await producer.flush()


async def first_records(consumer: Consumer) -> list[ConsumerRecord]:
    """The first records a poll returns, polling at most 20 times for 50 ms (empty if none came)."""
    for _ in range(20):
        got = await consumer.poll(timeout_ms=50)
        if got:
            return got
    return []


async def test_refreshes_go_to_each_broker_in_turn() -> None:
    async with running(TOPIC, 1, brokers=3) as fake:
        rpc = RpcClient()
        try:
            cache = MetadataCache(rpc, fake.bootstrap.split(","), retry_backoff_ms=0)
            cache.add_topics([TOPIC])
            for _ in range(6):
                await cache.refresh(force=True)
        finally:
            await rpc.close()
    assert fake.metadata_requests_by_node == {1: 2, 2: 2, 3: 2}


async def test_refreshes_no_broker_answers_back_off_exponentially_up_to_a_second() -> None:
    # Kafka's retry.backoff.max.ms (KIP-580): a client kept asking every retry.backoff.ms (100 ms) while every
    # broker was down, a warning each time (found by an operator review: ~12 log lines a second)
    async with running(TOPIC, 1) as fake:
        rpc = RpcClient()
        try:
            cache = MetadataCache(rpc, fake.bootstrap.split(","), retry_backoff_ms=100)
            cache.add_topics([TOPIC])
            live = list(fake.addresses)
            for node in live:
                await fake.stop_broker(node)
            seen = [cache.backoff_ms()]
            for _ in range(6):
                with pytest.raises(NoBrokersAvailableError):
                    await cache.refresh(force=True)
                seen.append(cache.backoff_ms())
            assert seen == [100, 100, 200, 400, 800, 1000, 1000]
            await fake.start_broker(live[0])
            await cache.refresh(force=True)
            assert cache.backoff_ms() == 100  # answered: back to retry.backoff.ms
        finally:
            await rpc.close()


async def test_one_broker_with_stale_metadata_does_not_pin_the_clients() -> None:
    """Broker 1 stops getting UpdateMetadata, then the leader moves from 2 to 3: the clients still find it
    (every refresh used to go to broker 1, which kept naming broker 2 until delivery.timeout.ms)."""
    async with running(TOPIC, 1, brokers=3) as fake:
        fake.partitions[TP0].leader = 2
        async with Producer(fake.bootstrap, fast(delivery_timeout_ms=5_000)) as producer, \
                Consumer(fake.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=50,
                         retry_backoff_ms=20) as consumer:
            await producer.send_and_wait(TOPIC, b"before", partition=0)
            consumer.assign([TP0])
            seen = [r.value for r in await consumer.poll(timeout_ms=2_000)]
            fake.freeze_metadata(1, [TOPIC])
            fake.move_leader(TP0, 3)
            assert (await producer.send_and_wait(TOPIC, b"after", partition=0)).offset == 1
            for _ in range(100):
                seen += [r.value for r in await consumer.poll(timeout_ms=50)]
                if len(seen) == 2:
                    break
        assert seen == [b"before", b"after"]


async def test_an_answer_without_the_topic_does_not_let_an_older_leader_epoch_back() -> None:
    """A broker just restarted answers that the topic does not exist; the next answer comes from a cut-off old
    leader naming itself at an older epoch. Taking it would send the consumer to that shorter log and reset
    its position to the beginning."""
    async with running(TOPIC, 1, brokers=3) as fake:
        old = fake.partitions[TP0].leader
        fake.move_leader(TP0, 2)  # epoch 1
        await produce(fake, 10)
        async with Consumer(fake.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=50,
                            retry_backoff_ms=20) as consumer:
            consumer.assign([TP0])
            seen: list[int] = []
            for _ in range(100):
                seen += [r.offset for r in await consumer.poll(timeout_ms=50)]
                if len(seen) == 10:
                    break
            fake.stale_leaders[(old, TP0)] = (0, 3)  # `old` still believes it leads epoch 0, with 3 records
            fake.move_leader(TP0, 3)  # epoch 2: the consumer's fetch from 2 is refused, it refreshes
            fake.metadata_script.extend(["unknown", old])
            for _ in range(20):
                seen += [r.offset for r in await consumer.poll(timeout_ms=50)]
            assert not fake.metadata_script  # both answers were given
            fake.stale_leaders.clear()
            await produce(fake, 1)
            for _ in range(100):
                seen += [r.offset for r in await consumer.poll(timeout_ms=50)]
                if len(seen) >= 11:
                    break
        assert seen == list(range(11))


async def test_an_offset_reset_carries_the_leader_epoch() -> None:
    """The leader named by metadata (epoch 2) has not learned of its epoch yet and answers from its old view
    (epoch 0, 3 records): without the epoch in ListOffsets, a reset to latest took its 3 for the log end."""
    async with running(TOPIC, 1, brokers=2) as fake:
        fake.move_leader(TP0, 2)
        fake.move_leader(TP0, 1)  # leader 1 at epoch 2
        await produce(fake, 10)
        fake.stale_leaders[(1, TP0)] = (0, 3)
        # bootstrap from broker 2 only, which knows epoch 2: broker 1's own (older) answers are never taken
        async with Consumer(fake.addresses[2], fetch_max_wait_ms=50, retry_backoff_ms=20) as consumer:
            consumer.assign([TP0])
            for _ in range(5):
                assert await consumer.poll(timeout_ms=50) == []
            fake.stale_leaders.clear()
            assert await consumer.position(TP0) == 10


async def test_an_answer_for_a_partition_no_longer_assigned_is_ignored() -> None:
    async with running(TOPIC, 2, brokers=1) as fake:
        await produce(fake, 3)
        await produce(fake, 1, partition=1)
        async with Consumer(fake.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=50) as consumer:
            await consumer.metadata.wait_for_topic(TOPIC, 5_000)
            consumer.assign([TP0, TP1])
            consumer.seek(TP0, 100)  # past the end: its fetch is answered OFFSET_OUT_OF_RANGE
            consumer.seek(TP1, 0)
            assert await consumer.poll(timeout_ms=0) == []  # the fetch is in flight
            consumer.assign([TP1])
            got = await first_records(consumer)
        assert [(r.partition, r.offset) for r in got] == [(1, 0)]


async def test_a_malformed_offset_answer_fails_one_reset_not_every_poll() -> None:
    async with running(TOPIC, 1, brokers=1) as fake:
        await produce(fake, 1)
        fake.malformed_list_offsets = 1
        async with Consumer(fake.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=50,
                            retry_backoff_ms=20) as consumer:
            consumer.assign([TP0])
            got = await first_records(consumer)
            assert fake.malformed_list_offsets == 0
            assert TP0 not in consumer.fetch_errors()
        assert [r.value for r in got] == [b"0"]



# Found by review: with brokers that accept connections and never answer (paused), a wait for a topic's metadata
# lasted a refresh's whole round of them, 5 s per broker, whatever max.block.ms (or assign_topic's timeout_ms)
# said, and each metadata request waited 5 s whatever request.timeout.ms said.

@contextlib.asynccontextmanager
async def frozen_brokers(n: int) -> AsyncIterator[list[str]]:
    """``n`` servers on 127.0.0.1 that take connections and read requests but never answer, as the kernel does
    for a SIGSTOPped broker."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    servers = [await asyncio.start_server(hold, "127.0.0.1", 0) for _ in range(n)]
    try:
        yield [f"127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
    finally:
        for writer in held:
            writer.close()
        for s in servers:
            s.close()


async def test_max_block_ms_bounds_the_wait_for_metadata_from_brokers_that_never_answer() -> None:
    async with frozen_brokers(2) as addresses:
        async with Producer(",".join(addresses), fast(max_block_ms=300)) as producer:
            with pytest.raises(MinibrokerError, match="topic 'events' not present in metadata after 300 ms"):
                await asyncio.wait_for(producer.send(TOPIC, b"x"), 4)  # it took 10 s (5 s per broker)
        async with Consumer(",".join(addresses)) as consumer:
            with pytest.raises(MinibrokerError, match="topic 'events' not present in metadata after 300 ms"):
                await asyncio.wait_for(consumer.assign_topic(TOPIC, timeout_ms=300), 4)


async def test_a_metadata_request_waits_at_most_request_timeout_ms() -> None:
    async with frozen_brokers(2) as addresses, Consumer(",".join(addresses), request_timeout_ms=300) as consumer:
        with pytest.raises(NoBrokersAvailableError, match="no broker answered metadata"):
            await asyncio.wait_for(consumer.metadata.refresh(force=True), 4)  # it took 10 s (5 s per broker)
