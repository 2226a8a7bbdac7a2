"""When the producer reports a record delivered or failed, and what flush and close wait for (Kafka's Sender,
RecordAccumulator and KafkaProducer.flush/close): acks=0, delivery.timeout.ms for requests in flight, and
senders that keep going while a flush or close waits."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from client import Producer, ProducerConfig, TopicPartition
from client.accumulator import record_size
from client.errors import DeliveryTimeoutError, ProducerClosedError, is_definite_failure
from common.clock import ManualClock
from common.config import ConfigError
from common.errors import ErrorCode, MinibrokerError
from storage.record_batch import decode_records
from tests.client.fake_broker import FakeCluster
from tests.client.helpers import fast

TOPIC = "events"
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


async def until(condition: object, what: str) -> None:
    """Wait (at most 10 s, polling) until ``condition()`` holds."""
    for _ in range(1000):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_acks_zero_records_are_delivered_only_once_sent_and_close_waits_for_them(fake: FakeCluster) -> None:
    """A slow broker has read the requests but not answered: the records are not reported delivered yet, and
    close() waits for them instead of cancelling their requests (they used to be reported delivered at once,
    and dropped by close)."""
    producer = Producer(fake.bootstrap, fast(acks=0, linger_ms=0, batch_size=200))
    await producer.start()
    fake.hold_produce.clear()
    futures = [await producer.send(TOPIC, b"r%d" % i, partition=i % 3) for i in range(30)]
    await until(lambda: fake.produce_requests >= 3, "the broker has requests for the three partitions")
    assert not any(f.done() for f in futures)
    closing = asyncio.create_task(producer.close())
    await asyncio.sleep(0.05)
    fake.hold_produce.set()
    await asyncio.wait_for(closing, 30)
    assert [f.result().offset for f in futures] == [-1] * 30
    assert sum(p.log_end_offset for p in fake.partitions.values()) == 30


async def test_acks_zero_record_whose_request_failed_is_retried_not_reported_delivered(fake: FakeCluster) -> None:
    fake.partitions[TP0].leader = 1
    await fake.kill_broker(1)  # still named leader: the first attempt cannot connect
    async with Producer(fake.bootstrap, fast(acks=0)) as producer:
        fut = await producer.send(TOPIC, b"x", partition=0)
        await until(lambda: producer.metadata.current.brokers, "metadata")
        fake.move_leader(TP0, 2)
        assert (await asyncio.wait_for(asyncio.shield(fut), 30)).offset == -1
        assert fake.partitions[TP0].log_end_offset == 1  # reported delivered once it really was sent


async def test_acks_zero_records_the_leader_refused_are_retried_or_failed_not_reported_delivered(
        fake: FakeCluster) -> None:
    """The acks=0 answer used to be read and ignored: a record the leader refused (not the leader any more, a
    batch above the topic's max.message.bytes) was reported delivered though it was never written."""
    fake.errors[TP0].append(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    fake.errors[TP1].append(ErrorCode.INVALID_TOPIC_EXCEPTION)
    async with Producer(fake.bootstrap, fast(acks=0)) as producer:
        retried = await producer.send(TOPIC, b"retried", partition=0)
        refused = await producer.send(TOPIC, b"refused", partition=1)
        assert (await retried).offset == -1
        with pytest.raises(MinibrokerError) as info:
            await refused
    assert info.value.code is ErrorCode.INVALID_TOPIC_EXCEPTION
    assert fake.partitions[TP0].log_end_offset == 1 and fake.partitions[TP1].log_end_offset == 0


async def test_acks_zero_batch_above_max_message_bytes_is_split_and_every_record_written(
        fake: FakeCluster) -> None:
    fake.partitions[TP0].max_message_bytes = 400
    async with Producer(fake.bootstrap, fast(acks=0, linger_ms=50, batch_size=4_000)) as producer:
        futures = [await producer.send(TOPIC, b"v%02d" % i + b"." * 40, partition=0) for i in range(20)]
        assert [(await f).offset for f in futures] == [-1] * 20
    written = [r.value for _, _, raw in fake.partitions[TP0].batches for r in decode_records(raw)]
    assert written == [b"v%02d" % i + b"." * 40 for i in range(20)]


async def test_flush_waits_only_for_records_sent_before_it(fake: FakeCluster) -> None:
    fake.move_leader(TP1, -1)  # a record for partition 1 waits for a leader until delivery.timeout.ms
    async with Producer(fake.bootstrap, fast(delivery_timeout_ms=3_000)) as producer:
        early = await producer.send(TOPIC, b"early", partition=0)
        flushing = asyncio.create_task(producer.flush())
        await asyncio.sleep(0)  # the flush has started
        late = await producer.send(TOPIC, b"late", partition=1)
        await asyncio.wait_for(flushing, 30)
        assert early.done() and early.exception() is None
        assert not late.done()  # sent after flush() was called: not waited for
        fake.move_leader(TP1, 1)
        assert (await late).offset == 0


async def test_a_flush_that_ends_does_not_end_another_still_waiting(fake: FakeCluster) -> None:
    """Two flushes overlap; the batch only the second one waits for must stay ready (linger never expires on
    this clock) after the first returns, or the second never does."""
    async with Producer(fake.bootstrap, fast(linger_ms=60_000), clock=ManualClock()) as producer:
        fake.hold_produce.clear()
        first = await producer.send(TOPIC, b"1", partition=0)
        flush_one = asyncio.create_task(producer.flush())
        await until(lambda: fake.produce_requests == 1, "the first record's request")
        second = await producer.send(TOPIC, b"2", partition=0)  # a new batch; its partition has a request in flight
        flush_two = asyncio.create_task(producer.flush())
        await asyncio.sleep(0)
        fake.hold_produce.set()
        await asyncio.wait_for(flush_one, 30)
        await asyncio.wait_for(flush_two, 30)
        assert [(await f).offset for f in (first, second)] == [0, 1]


async def test_close_refuses_new_records_at_once(fake: FakeCluster) -> None:
    producer = Producer(fake.bootstrap, fast())
    await producer.start()
    fake.hold_produce.clear()
    held = await producer.send(TOPIC, b"held", partition=0)
    await until(lambda: fake.produce_requests == 1, "the held request")
    closing = asyncio.create_task(producer.close())
    await asyncio.sleep(0)  # close() is flushing
    with pytest.raises(ProducerClosedError):
        await producer.send(TOPIC, b"late", partition=1)
    fake.hold_produce.set()
    await asyncio.wait_for(closing, 30)
    assert (await held).offset == 0
    assert fake.partitions[TP1].log_end_offset == 0


def test_delivery_timeout_must_cover_linger_and_one_request() -> None:
    with pytest.raises(ConfigError, match=r"delivery\.timeout\.ms should be equal to or larger than linger\.ms "
                                          r"\+ request\.timeout\.ms \(10 \+ 3000\), got 1000"):
        ProducerConfig(linger_ms=10, request_timeout_ms=3_000, delivery_timeout_ms=1_000)
    explicit = ProducerConfig(linger_ms=10, request_timeout_ms=3_000, delivery_timeout_ms=3_010)
    assert explicit.delivery_timeout_ms == 3_010
    # not set: raised to the sum, as Kafka does
    assert ProducerConfig(linger_ms=5, request_timeout_ms=300_000).delivery_timeout_ms == 300_005


async def test_a_record_in_flight_fails_at_its_delivery_timeout(fake: FakeCluster) -> None:
    """The leader never answers: the record fails at delivery.timeout.ms, as maybe written, not when the
    request itself times out (request.timeout.ms and the HTTP client's slack, here seconds later)."""
    config = ProducerConfig(linger_ms=0, request_timeout_ms=900, delivery_timeout_ms=1_000, retry_backoff_ms=20)
    async with Producer(fake.bootstrap, config) as producer:
        fake.hold_produce.clear()
        fut = await producer.send(TOPIC, b"x", partition=0)
        with pytest.raises(DeliveryTimeoutError, match=r"delivery\.timeout\.ms=1000 \(its request is still "
                                                       r"unanswered\)") as info:
            await fut
        assert not is_definite_failure(info.value)
        fake.hold_produce.set()  # the late answer is ignored; the producer goes on
        assert (await producer.send_and_wait(TOPIC, b"y", partition=0)).offset == 1
    assert fake.partitions[TP0].log_end_offset == 2


async def test_close_waits_for_a_request_whose_record_already_timed_out(fake: FakeCluster) -> None:
    """Kafka's close waits for every request in flight, not only for the records not yet reported."""
    config = ProducerConfig(linger_ms=0, request_timeout_ms=900, delivery_timeout_ms=1_000, retry_backoff_ms=20)
    producer = Producer(fake.bootstrap, config)
    await producer.start()
    fake.hold_produce.clear()
    fut = await producer.send(TOPIC, b"x", partition=0)
    with pytest.raises(DeliveryTimeoutError):
        await fut
    closing = asyncio.create_task(producer.close())
    done, _ = await asyncio.wait([closing], timeout=0.2)
    assert not done  # its request is still unanswered
    fake.hold_produce.set()
    await asyncio.wait_for(closing, 30)


async def test_a_late_answer_to_a_batch_that_expired_in_flight_changes_nothing(fake: FakeCluster) -> None:
    """Records failed at delivery.timeout.ms while their request was out keep that outcome (maybe written)
    when the request then fails: here MESSAGE_TOO_LARGE, which would otherwise split the batch and requeue it.
    The partition goes on with the next record at offset 0."""
    clock = ManualClock()
    config = fast(linger_ms=60_000, request_timeout_ms=5_000, delivery_timeout_ms=65_000)
    async with Producer(fake.bootstrap, config, clock=clock) as producer:
        fake.hold_produce.clear()
        fake.errors[TP0].append(ErrorCode.MESSAGE_TOO_LARGE)
        futures = [await producer.send(TOPIC, b"v%d" % i, partition=0) for i in range(4)]  # one batch
        flushing = asyncio.create_task(producer.flush())
        await until(lambda: fake.produce_requests == 1, "the held request")
        clock.advance(65_000)
        await producer.flush()  # wakes the sender, which fails the batch in flight
        await asyncio.wait_for(flushing, 30)
        expired = [f.exception() for f in futures]
        assert all(isinstance(e, DeliveryTimeoutError) and "still unanswered" in str(e) for e in expired)
        assert not any(is_definite_failure(e) for e in expired if e is not None)
        nxt = await producer.send(TOPIC, b"next", partition=0)  # waits behind the request still out
        fake.hold_produce.set()  # which now fails with MESSAGE_TOO_LARGE
        await producer.flush()
        assert (await nxt).offset == 0
        assert [f.exception() for f in futures] == expired
    assert fake.produce_requests == 2
    assert [r.value for _, _, data in fake.partitions[TP0].batches for r in decode_records(data)] == [b"next"]


async def test_close_ends_a_send_waiting_for_a_topics_metadata(fake: FakeCluster) -> None:
    # it went on asking the brokers for max.block.ms after close had returned, then failed with another error
    producer = Producer(fake.bootstrap, fast(max_block_ms=60_000))
    await producer.start()
    sending = asyncio.create_task(producer.send("not-yet-created", b"x"))
    await until(lambda: fake.metadata_requests["not-yet-created"], "the send asks for the topic")
    await producer.close()
    with pytest.raises(ProducerClosedError, match="waiting for the metadata of topic 'not-yet-created'"):
        await asyncio.wait_for(sending, 10)


async def test_close_leaves_no_unread_failure_of_the_metadata_request_it_cut_short() -> None:
    # the refresh a closed send no longer waits for fails when close() closes its connection: that failure
    # is read, not logged as "Task exception was never retrieved"
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # a broker that takes the request and never answers
    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    unread: list[str] = []
    loop.set_exception_handler(lambda _loop, context: unread.append(str(context.get("message"))))
    try:
        producer = Producer(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", fast(max_block_ms=60_000))
        await producer.start()
        sending = asyncio.create_task(producer.send("t", b"x"))
        await until(lambda: accepted, "the metadata request")
        await producer.close()
        with pytest.raises(ProducerClosedError):
            await asyncio.wait_for(sending, 10)
        await asyncio.sleep(0.1)  # the refresh fails on its closed connection
        del producer, sending
        gc.collect()
        await asyncio.sleep(0)
        assert unread == []
    finally:
        loop.set_exception_handler(None)
        for writer in accepted:
            writer.close()
        server.close()


class SteppingClock(ManualClock):
    """Manual, except that the next ``steps`` monotonic reads each move time on by 1 ms after reading."""

    steps = 0

    def monotonic_ms(self) -> int:
        t = super().monotonic_ms()
        if self.steps:
            self.steps -= 1
            self.advance(1)
        return t


async def test_a_batch_drained_for_a_request_is_in_flight_before_its_request_task_runs(fake: FakeCluster) -> None:
    """A's expiry in a sender pass resets the producer id, which runs the next pass at once; B, drained for a
    retry in the first pass, expires in the second before its request's task has run. It counts as in flight
    (maybe written), since that task sends it: it was told never written (a definite failure), and the leader
    appended it (found by a review of await points)."""
    clock = SteppingClock()
    async with Producer(fake.bootstrap, fast(linger_ms=0), clock=clock) as producer:
        fake.errors[TP0].append(ErrorCode.NOT_ENOUGH_REPLICAS)  # retriable and not appended: retried
        fake.errors[TP1].append(ErrorCode.NOT_ENOUGH_REPLICAS)
        a = await producer.send(TOPIC, b"a", partition=0)  # its deadline: 10000
        await until(lambda: fake.produce_requests == 1, "a's first attempt")
        clock.advance(1)
        b = await producer.send(TOPIC, b"b", partition=1)  # its deadline: 10001
        await until(lambda: fake.produce_requests == 2, "b's first attempt")
        await asyncio.sleep(0.05)  # both answered and queued for a retry
        assert not a.done() and not b.done()
        clock.advance(10_000 - clock.monotonic_ms())
        clock.steps = 2  # the next two passes read 10000 and 10001
        await asyncio.wait_for(producer.flush(), 10)
        assert isinstance(a.exception(), DeliveryTimeoutError) and is_definite_failure(a.exception())
        assert not is_definite_failure(b.exception()), b.exception()
    # close waited for b's request
    assert [r.value for _, _, data in fake.partitions[TP1].batches for r in decode_records(data)] == [b"b"]


@pytest.mark.parametrize("idempotence", [True, False])
@pytest.mark.parametrize("records_per_batch", [40, 8])  # one batch; or requests of several batches, each too large
async def test_a_batch_larger_than_the_topic_allows_is_split_and_sent_in_order(
        fake: FakeCluster, idempotence: bool, records_per_batch: int) -> None:
    """max.message.bytes below the producer's batch: each full batch used to fail every record in it
    (Kafka's Sender splits it and sends it again). Order, offsets and the sequences stay as if the batches
    had been small from the start: one producer id, contiguous sequences."""
    fake.partitions[TP0].max_message_bytes = 600  # five of these records per batch, not six
    config = fast(batch_size=records_per_batch * record_size(None, b"v" * 100), linger_ms=60_000,
                  enable_idempotence=idempotence)
    async with Producer(fake.bootstrap, config, clock=ManualClock()) as producer:  # one batch until the flush
        futures = [await producer.send(TOPIC, b"%03d" % i + b"v" * 97, partition=0) for i in range(40)]
        await producer.flush()
        assert [(await f).offset for f in futures] == list(range(40))
    headers = fake.headers(TP0)
    assert len(headers) > 1 and all(h.size <= 600 for h in headers)
    assert [(r.value or b"")[:3] for _, _, data in fake.partitions[TP0].batches
            for r in decode_records(data)] == [b"%03d" % i for i in range(40)]
    if idempotence:
        assert len({h.producer_id for h in headers}) == 1 and fake.init_requests == 1
        starts = [sum(h.record_count for h in headers[:i]) for i in range(len(headers))]
        assert [h.base_sequence for h in headers] == starts


async def test_a_record_too_large_alone_fails_and_the_rest_of_its_batch_is_delivered(fake: FakeCluster) -> None:
    fake.partitions[TP0].max_message_bytes = 600
    async with Producer(fake.bootstrap, fast(batch_size=100_000, linger_ms=60_000), clock=ManualClock()) as producer:
        values = [b"a%02d" % i for i in range(10)] + [b"x" * 700] + [b"b%02d" % i for i in range(10)]
        futures = [await producer.send(TOPIC, v, partition=0) for v in values]
        await producer.flush()
        with pytest.raises(MinibrokerError) as info:
            await futures[10]
        assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE and is_definite_failure(info.value)
        assert [(await f).offset for f in futures[:10] + futures[11:]] == list(range(20))
    assert [r.value for _, _, data in fake.partitions[TP0].batches
            for r in decode_records(data)] == values[:10] + values[11:]


async def test_a_record_awaited_before_its_batch_was_split_gets_its_own_outcome(fake: FakeCluster) -> None:
    """``send_and_wait`` awaits at once: the batch awaited is the one later split, which completes with its
    first failed piece's error. Each record must still get its own outcome (they all got that error, the
    written ones too), and the batch callback counts each piece apart."""
    fake.partitions[TP0].max_message_bytes = 600
    counted: list[tuple[int, bool]] = []
    async with Producer(fake.bootstrap, fast(batch_size=100_000, linger_ms=60_000), clock=ManualClock()) as producer:
        values = [b"a%02d" % i for i in range(10)] + [b"x" * 700] + [b"b%02d" % i for i in range(10)]
        futures = [await producer.send(TOPIC, v, partition=0) for v in values]
        futures[0].add_batch_callback(lambda n, exc: counted.append((n, exc is None)))
        waiting = [asyncio.ensure_future(_outcome(f)) for f in futures]
        await asyncio.sleep(0)  # each is awaiting the batch as it was before the split
        await producer.flush()
        outcomes = await asyncio.gather(*waiting)
    assert outcomes[:10] + outcomes[11:] == list(range(20)) and outcomes[10] == "MESSAGE_TOO_LARGE"
    assert sum(n for n, _ in counted) == 21 and sum(n for n, ok in counted if not ok) == 1


async def test_a_batch_that_may_have_been_written_is_failed_not_split(fake: FakeCluster) -> None:
    """An attempt that timed out may have been appended: split and sent again, its records could be written
    twice. MESSAGE_TOO_LARGE on the retry fails them, as possibly written (not a definite failure)."""
    fake.errors[TP0].extend([ErrorCode.REQUEST_TIMED_OUT, ErrorCode.MESSAGE_TOO_LARGE])
    async with Producer(fake.bootstrap, fast(enable_idempotence=False, linger_ms=50)) as producer:
        futures = [await producer.send(TOPIC, b"v%d" % i, partition=0) for i in range(4)]
        await producer.flush()
        for f in futures:
            with pytest.raises(MinibrokerError) as info:
                await f
            assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE and not is_definite_failure(info.value)
    assert fake.partitions[TP0].batches == []


async def _outcome(future: Any) -> int | str:
    try:
        return int((await future).offset)
    except MinibrokerError as exc:
        return exc.code.name


async def test_a_request_the_leader_never_answers_is_retried_after_request_timeout_ms(fake: FakeCluster) -> None:
    # Found by review: the producer waited request.timeout.ms + 5 s for an answer, so with a delivery timeout
    # shorter than that, a request stuck on a paused leader was never retried: its records expired
    fake.hold_produce.clear()  # the leader reads the request and does not answer
    async with Producer(fake.bootstrap, fast(linger_ms=0, request_timeout_ms=500, delivery_timeout_ms=4_000,
                                             retry_backoff_ms=20)) as producer:
        fut = await producer.send(TOPIC, b"x", partition=0)
        await until(lambda: fake.produce_requests >= 2, "a second attempt within the delivery timeout")
        fake.hold_produce.set()
        meta = await asyncio.wait_for(asyncio.shield(fut), 30)
    assert meta.offset >= 0


async def test_retries_bounds_the_attempts_after_a_retriable_error(fake: FakeCluster) -> None:
    # retries=1: the batch is sent twice at most and then fails with the broker's error, long before
    # delivery.timeout.ms would end it
    fake.errors[TP0].extend([ErrorCode.NOT_ENOUGH_REPLICAS] * 3)
    async with Producer(fake.bootstrap, fast(retries=1, enable_idempotence=False)) as producer:
        fut = await producer.send(TOPIC, b"x", partition=0)
        with pytest.raises(MinibrokerError) as info:
            await fut
        assert info.value.code is ErrorCode.NOT_ENOUGH_REPLICAS
    assert len(fake.errors[TP0]) == 1  # the third answer was never asked for
    assert fake.partitions[TP0].batches == []
