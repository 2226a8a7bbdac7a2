"""Bad input to the producer fails at the call, never later in the sender or a metadata refresh."""

from __future__ import annotations

import asyncio
import gc
import math
from collections.abc import Iterator
from typing import Any

import pytest

from client import Producer, ProducerConfig, TopicPartition
from client.metadata import MetadataCache, parse_bootstrap
from common.http import RpcClient
from storage.record_batch import decode_records, validate_batch
from tests.client.fake_broker import FakeCluster

TOPIC = "events"


@pytest.fixture
def loop_errors() -> Iterator[list[dict[str, Any]]]:
    """Everything reported to the loop's exception handler ("Task exception was never retrieved"...)."""
    loop = asyncio.get_event_loop_policy().get_event_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        yield errors
    finally:
        loop.set_exception_handler(previous)


def fast() -> ProducerConfig:
    return ProducerConfig(linger_ms=50, retry_backoff_ms=20, delivery_timeout_ms=10_000, request_timeout_ms=5_000)


def stored_values(fake: FakeCluster, tp: TopicPartition) -> list[tuple[int, bytes | None]]:
    """(timestamp, value) of every record stored for ``tp``; each batch must be valid."""
    out = []
    for _base, _next, data in fake.partitions[tp].batches:
        header = validate_batch(data)
        out += [(header.first_timestamp + r.timestamp_delta, r.value) for r in decode_records(data)]
    return out


async def assert_no_loop_errors(errors: list[dict[str, Any]]) -> None:
    await asyncio.sleep(0.05)
    gc.collect()  # an unretrieved task exception is reported when the task is collected
    assert errors == []


BAD_TIMESTAMPS: list[tuple[object, type[Exception], str]] = [
    (1.5, TypeError, "timestamp_ms must be an int"),
    (math.nan, TypeError, "timestamp_ms must be an int"),
    ("5", TypeError, "timestamp_ms must be an int"),
    (True, TypeError, "timestamp_ms must be an int"),
    (2**63, ValueError, "Invalid timestamp"),
    (2**64, ValueError, "Invalid timestamp"),
    (-1, ValueError, "Invalid timestamp"),
    (-(2**63) - 1, ValueError, "Invalid timestamp"),
]


@pytest.mark.parametrize(("bad", "error", "message"), BAD_TIMESTAMPS)
async def test_bad_timestamp_fails_at_the_call_and_spares_the_batch(
        fake: FakeCluster, loop_errors: list[dict[str, Any]], bad: object, error: type[Exception],
        message: str) -> None:
    tp = TopicPartition(TOPIC, 0)
    async with Producer(fake.bootstrap, fast()) as producer:
        before = await producer.send(TOPIC, b"before", partition=0, timestamp_ms=1_000)
        with pytest.raises(error, match=message):
            await producer.send(TOPIC, b"bad", partition=0, timestamp_ms=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match=message):
            producer.send_nowait(TOPIC, b"bad", partition=0, timestamp_ms=bad)  # type: ignore[arg-type]
        after = await producer.send(TOPIC, b"after", partition=0, timestamp_ms=2**63 - 1)
        assert (await before).offset == 0
        assert (await after).offset == 1
        again = await producer.send_and_wait(TOPIC, b"again", partition=0, timestamp_ms=0)
        assert again.offset == 2
    assert stored_values(fake, tp) == [(1_000, b"before"), (2**63 - 1, b"after"), (0, b"again")]
    await assert_no_loop_errors(loop_errors)


@pytest.mark.parametrize(("topic", "error"), [(None, TypeError), (5, TypeError), (b"events", TypeError),
                                               (["events"], TypeError), ("", ValueError)])
async def test_bad_topic_fails_at_the_call_and_metadata_keeps_refreshing(
        fake: FakeCluster, loop_errors: list[dict[str, Any]], topic: object, error: type[Exception]) -> None:
    async with Producer(fake.bootstrap, fast()) as producer:
        before = await producer.send(TOPIC, b"before", partition=1)
        with pytest.raises(error, match="topic must"):
            await producer.send(topic, b"x")  # type: ignore[arg-type]
        with pytest.raises(error, match="topic must"):
            producer.send_nowait(topic, b"x")  # type: ignore[arg-type]
        with pytest.raises(error, match="topic must"):
            await producer.partitions_for(topic)  # type: ignore[arg-type]
        with pytest.raises(error, match="topic must"):
            producer.metadata.add_topics([TOPIC, topic])  # type: ignore[list-item]
        assert all(isinstance(t, str) and t for t in producer.metadata._topics)
        await producer.metadata.refresh(force=True)  # raised TypeError in sorted() before the fix
        fake.move_leader(TopicPartition(TOPIC, 1), 2 if fake.partitions[TopicPartition(TOPIC, 1)].leader == 1 else 1)
        after = await producer.send(TOPIC, b"after", partition=1)  # follows the move: refreshes work
        assert (await before).offset == 0
        assert (await after).offset == 1
    assert [v for _, v in stored_values(fake, TopicPartition(TOPIC, 1))] == [b"before", b"after"]
    await assert_no_loop_errors(loop_errors)


@pytest.mark.parametrize("bootstrap", [[5], b"127.0.0.1:9091", bytearray(b"127.0.0.1:9091"), None, 9091,
                                       ["127.0.0.1:9091", None], {"127.0.0.1:9091"}])
async def test_bad_bootstrap_fails_at_construction(bootstrap: object) -> None:
    with pytest.raises(TypeError, match="bootstrap"):
        Producer(bootstrap)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bootstrap"):
        parse_bootstrap(bootstrap)  # type: ignore[arg-type]


async def test_bootstrap_sequences_and_config_type() -> None:
    assert parse_bootstrap(["a:1", " b:2 ", "c:3,d:4"]) == ["a:1", "b:2", "c:3", "d:4"]
    assert parse_bootstrap(("a:1",)) == ["a:1"]
    with pytest.raises(ValueError, match="HOST:PORT"):
        Producer(["a:1", "nope"])
    with pytest.raises(ValueError, match="no bootstrap"):
        Producer([])
    with pytest.raises(TypeError, match="sequence of str"):
        MetadataCache(RpcClient(), b"127.0.0.1:9091")  # type: ignore[arg-type]
    for bad in ("x", {"linger_ms": 5}, 5):
        with pytest.raises(TypeError, match="config must be a ProducerConfig"):
            Producer("127.0.0.1:9091", bad)  # type: ignore[arg-type]
    producer = Producer(("127.0.0.1:9091",), ProducerConfig())
    await producer.close()


@pytest.mark.parametrize(("settings", "error", "message"), [
    ({"linger_ms": "5"}, TypeError, r"linger\.ms must be an int in \[0, "),
    ({"batch_size": None}, TypeError, r"batch\.size must be an int in \[1, "),
    ({"request_timeout_ms": 1.5}, TypeError, r"request\.timeout\.ms must be an int"),
    ({"request_timeout_ms": math.inf}, TypeError, r"request\.timeout\.ms must be an int"),
    ({"request_timeout_ms": 10**9}, ValueError, r"request\.timeout\.ms must be an int in \[1, 300000\]"),
    ({"retries": True}, TypeError, r"retries must be an int"),
    ({"max_block_ms": -1}, ValueError, r"max\.block\.ms must be an int in \[0, "),
    ({"buffer_memory": 0}, ValueError, r"buffer\.memory must be an int in \[1, "),
    ({"acks": True}, TypeError, "acks must be the int -1, 0 or 1"),
    ({"acks": 1.0}, TypeError, "acks must be the int -1, 0 or 1"),
    ({"acks": 2}, ValueError, "acks must be the int -1, 0 or 1"),
])
def test_bad_config_names_the_setting(settings: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        ProducerConfig(**settings)
    if "acks" not in settings:  # the keyword form parses acks itself
        with pytest.raises(error, match=message):
            Producer("127.0.0.1:9091", **settings)


@pytest.mark.parametrize("partition", ["0", 1.0, True, b"\x00", [0]])
async def test_bad_partition_type_fails_at_the_call(fake: FakeCluster, loop_errors: list[dict[str, Any]],
                                                     partition: object) -> None:
    async with Producer(fake.bootstrap, fast()) as producer:
        with pytest.raises(TypeError, match="partition must be an int or None"):
            await producer.send(TOPIC, b"x", partition=partition)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="partition must be an int or None"):
            await producer.send("not-yet-known", b"x", partition=partition)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="partition must be an int or None"):
            producer.send_nowait(TOPIC, b"x", partition=partition)  # type: ignore[arg-type]
        meta = await producer.send_and_wait(TOPIC, b"ok", partition=2)
        assert (meta.partition, meta.offset) == (2, 0)
    await assert_no_loop_errors(loop_errors)
