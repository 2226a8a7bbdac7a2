"""The idempotent producer (SPEC: KIP-98 without transactions) against fake brokers that deduplicate as a
leader does: producer ids, per-partition sequences, retries that never write twice, a new producer id after a
failed batch, and the settings that turn it on and off."""

from __future__ import annotations

import asyncio
import random

import pytest

from client import Consumer, Producer, ProducerConfig, TopicPartition
from client.accumulator import record_size
from client.errors import (
    DeliveryTimeoutError,
    ProducerIdUnavailableError,
    UnsupportedVersionError,
    is_definite_failure,
)
from common.config import ConfigError
from common.errors import ErrorCode, MinibrokerError
from storage.record_batch import decode_records
from tests.client.fake_broker import FakeCluster
from tests.client.helpers import fast

TOPIC = "events"
TP0, TP1, TP2 = (TopicPartition(TOPIC, p) for p in range(3))


def log_values(fake: FakeCluster, tp: TopicPartition) -> list[bytes | None]:
    """Every record value in ``tp``'s fake log, in offset order."""
    return [r.value for _, _, data in fake.partitions[tp].batches for r in decode_records(data)]


def stamps(fake: FakeCluster, tp: TopicPartition) -> list[tuple[int, int, int, int]]:
    """(producer_id, producer_epoch, base_sequence, record_count) of each batch in ``tp``'s fake log."""
    return [(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) for h in fake.headers(tp)]


# -- settings ----------------------------------------------------------------------------------------

def test_idempotence_defaults_on_for_acks_all_and_off_otherwise() -> None:
    assert ProducerConfig().idempotence and ProducerConfig(acks=-1).idempotence
    assert not ProducerConfig(acks=1).idempotence
    assert not ProducerConfig(acks=0).idempotence
    assert not ProducerConfig(retries=0).idempotence  # Kafka: not set and retries 0 -> off
    assert not ProducerConfig(enable_idempotence=False).idempotence
    assert ProducerConfig(enable_idempotence=True).idempotence


@pytest.mark.parametrize(("settings", "names"), [
    ({"acks": 1}, ["enable.idempotence", "acks=1"]),
    ({"acks": 0}, ["enable.idempotence", "acks=0"]),
    ({"retries": 0}, ["enable.idempotence", "retries=0"]),
])
def test_explicit_idempotence_with_conflicting_settings_is_a_config_error(settings: dict[str, int],
                                                                          names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        ProducerConfig(enable_idempotence=True, **settings)
    assert all(name in str(info.value) for name in names), str(info.value)
    with pytest.raises(ConfigError, match=r"enable\.idempotence"):  # the keyword form, Kafka-style strings
        Producer("127.0.0.1:9091", enable_idempotence="true",
                 **{k: str(v) if k == "acks" else v for k, v in settings.items()})


def test_enable_idempotence_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"enable\.idempotence"):
        ProducerConfig(enable_idempotence="true")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"enable\.idempotence: expected true or false"):
        Producer("127.0.0.1:9091", enable_idempotence="yes please")


# -- producer ids and sequences ------------------------------------------------------------------------

async def test_non_idempotent_producers_send_producer_id_minus_one(fake: FakeCluster) -> None:
    for config in (fast(acks=1), fast(enable_idempotence=False)):
        async with Producer(fake.bootstrap, config) as producer:
            for i in range(5):
                await producer.send_and_wait(TOPIC, b"%d" % i, partition=0)
    assert fake.init_requests == 0
    assert {s[:3] for s in stamps(fake, TP0)} == {(-1, -1, -1)}


async def test_sequences_are_contiguous_per_partition_across_batches_and_retries(fake: FakeCluster) -> None:
    rng = random.Random(5)
    for tp in (TP0, TP1, TP2):  # retried attempts, refused before any append
        fake.errors[tp].extend([ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_LEADER_OR_FOLLOWER])
    config = fast(batch_size=10 * record_size(None, b"x" * 20))
    async with Producer(fake.bootstrap, config) as producer:
        futures = []
        for i in range(600):
            futures.append(await producer.send(TOPIC, b"%020d" % i, partition=rng.randrange(3)))
            if i % 97 == 0:
                await asyncio.sleep(0.01)  # let some requests go with few batches, some with many
        metas = [await f for f in futures]
        pid = producer.producer_id
    assert fake.init_requests == 1 and pid >= 0
    assert max(fake.batches_per_partition) <= 5  # never more than a leader remembers
    for tp in (TP0, TP1, TP2):
        got = stamps(fake, tp)
        assert len(got) > 5
        assert {(p, e) for p, e, _, _ in got} == {(pid, 0)}
        expected_seq = 0
        for _, _, seq, count in got:
            assert seq == expected_seq
            expected_seq += count
        assert expected_seq == sum(1 for m in metas if m.partition == tp.partition)


async def test_init_producer_id_retries_coordinator_load_in_progress(fake: FakeCluster) -> None:
    fake.init_errors.extend([ErrorCode.COORDINATOR_LOAD_IN_PROGRESS] * 3)
    async with Producer(fake.bootstrap, fast()) as producer:
        meta = await producer.send_and_wait(TOPIC, b"x", partition=1)
    assert meta.offset == 0 and fake.init_requests == 4
    assert stamps(fake, TP1) == [(fake.next_producer_id - 1, 0, 0, 1)]


async def test_no_producer_id_within_max_block_ms_fails_the_waiting_records_definitely(fake: FakeCluster) -> None:
    fake.init_errors.extend([ErrorCode.COORDINATOR_LOAD_IN_PROGRESS] * 10_000)
    async with Producer(fake.bootstrap, fast(max_block_ms=200)) as producer:
        fut = await producer.send(TOPIC, b"x", partition=0)
        with pytest.raises(ProducerIdUnavailableError, match=r"max\.block\.ms=200.*COORDINATOR_LOAD_IN_PROGRESS"):
            await fut
        assert is_definite_failure(fut.exception())  # type: ignore[arg-type]
        fake.init_errors.clear()  # the next record asks again
        assert (await producer.send_and_wait(TOPIC, b"y", partition=0)).offset == 0
    assert fake.produce_requests == 1


async def test_a_broker_without_init_producer_id(fake: FakeCluster) -> None:
    """HTTP 404 for init_producer_id: only on by default -> on without idempotence; asked for -> an error."""
    fake.supports_idempotence = False
    async with Producer(fake.bootstrap, fast()) as producer:
        assert producer.idempotent
        assert (await producer.send_and_wait(TOPIC, b"a", partition=0)).offset == 0
        assert not producer.idempotent
    assert stamps(fake, TP0) == [(-1, -1, -1, 1)]
    async with Producer(fake.bootstrap, fast(enable_idempotence=True)) as producer:
        fut = await producer.send(TOPIC, b"b", partition=0)
        with pytest.raises(UnsupportedVersionError, match=r"enable\.idempotence=true.*init_producer_id"):
            await fut
        assert is_definite_failure(fut.exception())  # type: ignore[arg-type]
        with pytest.raises(UnsupportedVersionError):  # for good, not only the first records
            await producer.send_and_wait(TOPIC, b"c", partition=0)
    assert log_values(fake, TP0) == [b"a"]


# -- retries never write twice -------------------------------------------------------------------------

async def test_a_lost_answer_is_retried_without_writing_twice(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, fast()) as producer:
        assert (await producer.send_and_wait(TOPIC, b"a", partition=0)).offset == 0
        fake.lose_answers[TP0] = 1
        meta = await producer.send_and_wait(TOPIC, b"b", partition=0)  # appended, answer lost, retried
        assert meta.offset == 1  # the original offset, from the leader's duplicate answer
        assert (await producer.send_and_wait(TOPIC, b"c", partition=0)).offset == 2
    assert fake.lost_answers == 1 and fake.duplicates_answered == 1
    assert log_values(fake, TP0) == [b"a", b"b", b"c"]


async def test_without_idempotence_a_lost_answer_writes_twice(fake: FakeCluster) -> None:
    """The control for the test above: the fake's lost answer does make a plain retry duplicate."""
    async with Producer(fake.bootstrap, fast(enable_idempotence=False)) as producer:
        fake.lose_answers[TP0] = 1
        meta = await producer.send_and_wait(TOPIC, b"b", partition=0)
    assert meta.offset == 1 and log_values(fake, TP0) == [b"b", b"b"]


async def test_a_lost_answer_for_several_batches_resolves_each_record_at_its_offset(fake: FakeCluster) -> None:
    per_batch = 3
    config = fast(batch_size=per_batch * record_size(None, b"%03d" % 0), linger_ms=60_000)
    fake.lose_answers[TP2] = 2  # the first two requests (5 batches each) are appended, their answers lost
    async with Producer(fake.bootstrap, config) as producer:
        await producer.partitions_for(TOPIC)
        # queued without yielding to the sender, so that requests carry as many batches as they may
        futures = [producer.send_nowait(TOPIC, b"%03d" % i, partition=2) for i in range(40)]
        await producer.flush()
        offsets = [(await f).offset for f in futures if f is not None]
    assert fake.lost_answers == 2 and fake.duplicates_answered == 2
    assert offsets == list(range(40))
    assert log_values(fake, TP2) == [b"%03d" % i for i in range(40)]
    assert max(fake.batches_per_partition) == 5


async def test_a_retried_group_the_leader_holds_in_part_is_split_not_failed(fake: FakeCluster) -> None:
    """A new leader that holds only the first batch of a retried group refuses the group as out of order
    (it deduplicates a group as one unit); the producer retries its batches one by one: the first is answered
    as a duplicate, the second appended, and every record is acknowledged at its offset, once."""
    per_batch = 3
    config = fast(batch_size=per_batch * record_size(None, b"%03d" % 0), linger_ms=60_000)
    fake.append_prefix_and_lose[TP0] = 1
    async with Producer(fake.bootstrap, config) as producer:
        await producer.partitions_for(TOPIC)
        futures = [producer.send_nowait(TOPIC, b"%03d" % i, partition=0) for i in range(6)]  # two full batches
        await producer.flush()
        offsets = [(await f).offset for f in futures if f is not None]
    assert offsets == list(range(6))
    assert log_values(fake, TP0) == [b"%03d" % i for i in range(6)]
    assert fake.lost_answers == 1 and fake.duplicates_answered == 1


async def test_a_retry_is_never_merged_with_newer_batches(fake: FakeCluster) -> None:
    """The leader takes a request's batches of a partition as one unit: a retry that added newer batches to
    the duplicates would be refused (OUT_OF_ORDER_SEQUENCE_NUMBER), so it resends exactly the first ones."""
    per_batch = 3
    config = fast(batch_size=per_batch * record_size(None, b"%03d" % 0), linger_ms=60_000, retry_backoff_ms=300)
    fake.lose_answers[TP0] = 1
    async with Producer(fake.bootstrap, config) as producer:
        await producer.partitions_for(TOPIC)
        futures = [producer.send_nowait(TOPIC, b"%03d" % i, partition=0) for i in range(6)]  # two full batches
        for _ in range(200):
            if fake.lost_answers:
                break
            await asyncio.sleep(0.01)
        assert fake.lost_answers == 1  # the retry now waits retry.backoff.ms; two more batches are ready first
        futures += [producer.send_nowait(TOPIC, b"%03d" % i, partition=0) for i in range(6, 12)]
        await producer.flush()
        offsets = [(await f).offset for f in futures if f is not None]
    assert offsets == list(range(12))
    assert fake.batches_per_partition[:2] == [2, 2]  # the retry: the same two batches, deduplicated
    assert log_values(fake, TP0) == [b"%03d" % i for i in range(12)]


# -- a failed batch: a new producer id -----------------------------------------------------------------

async def test_a_failed_batch_makes_later_batches_take_a_new_producer_id(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, fast()) as producer:
        await producer.send_and_wait(TOPIC, b"a", partition=0)
        await producer.send_and_wait(TOPIC, b"p1-a", partition=1)
        first_pid = producer.producer_id
        fake.errors[TP0].append(ErrorCode.MESSAGE_TOO_LARGE)
        with pytest.raises(MinibrokerError) as info:
            await producer.send_and_wait(TOPIC, b"too large", partition=0)  # sequence 1 under first_pid: a gap
        assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE and is_definite_failure(info.value)
        # under first_pid this would be sequence 2 after 0: OUT_OF_ORDER_SEQUENCE_NUMBER
        assert (await producer.send_and_wait(TOPIC, b"b", partition=0)).offset == 1
        assert (await producer.send_and_wait(TOPIC, b"p1-b", partition=1)).offset == 1
        second_pid = producer.producer_id
    assert second_pid not in (-1, first_pid) and fake.init_requests == 2
    assert [s[:3] for s in stamps(fake, TP0)] == [(first_pid, 0, 0), (second_pid, 0, 0)]
    assert [s[:3] for s in stamps(fake, TP1)] == [(first_pid, 0, 0), (second_pid, 0, 0)]  # every partition


async def test_a_delivery_timeout_makes_later_batches_take_a_new_producer_id(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, fast(delivery_timeout_ms=300)) as producer:
        await producer.send_and_wait(TOPIC, b"a", partition=0)
        first_pid = producer.producer_id
        fake.errors[TP0].extend([ErrorCode.NOT_ENOUGH_REPLICAS] * 10_000)
        with pytest.raises(DeliveryTimeoutError):
            await producer.send_and_wait(TOPIC, b"late", partition=0)
        fake.errors[TP0].clear()
        assert (await producer.send_and_wait(TOPIC, b"b", partition=0)).offset == 1
    assert [s[:3] for s in stamps(fake, TP0)] == [(first_pid, 0, 0), (producer.producer_id, 0, 0)]
    assert producer.producer_id != first_pid


@pytest.mark.parametrize("code", [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.INVALID_PRODUCER_EPOCH])
async def test_sequence_and_epoch_refusals_are_not_definite_failures(fake: FakeCluster, code: ErrorCode) -> None:
    async with Producer(fake.bootstrap, fast()) as producer:
        await producer.send_and_wait(TOPIC, b"a", partition=0)
        first_pid = producer.producer_id
        fake.errors[TP0].append(code)
        with pytest.raises(MinibrokerError) as info:
            await producer.send_and_wait(TOPIC, b"x", partition=0)
        assert info.value.code is code and not is_definite_failure(info.value)
        assert (await producer.send_and_wait(TOPIC, b"b", partition=0)).offset == 1
        assert producer.producer_id != first_pid


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_leader_moves_errors_and_lost_answers_write_nothing_twice(fake: FakeCluster,
                                                                                seed: int) -> None:
    """Seeded chaos with lost answers (appended, then the answer is cut): with idempotence every value is
    in the log once, at the offset its send resolved with; errors that end a batch take a new producer id
    and nothing after them is refused out of order."""
    rng = random.Random(seed)
    sent: dict[bytes, tuple[int, int] | None] = {}
    errors = [ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.REQUEST_TIMED_OUT,
              ErrorCode.MESSAGE_TOO_LARGE]
    async with Producer(fake.bootstrap, fast(linger_ms=1)) as producer:
        for step in range(30):
            values = [f"{step}-{i}".encode() for i in range(rng.randint(1, 40))]
            futures = [await producer.send(TOPIC, v) for v in values]
            tp = TopicPartition(TOPIC, rng.randrange(3))
            action = rng.random()
            if action < 0.2:
                fake.move_leader(tp, 1 if fake.partitions[tp].leader == 2 else 2)
            elif action < 0.4:
                fake.errors[tp].append(rng.choice(errors))
            elif action < 0.8:
                fake.lose_answers[tp] += 1
            for v, f in zip(values, futures, strict=True):
                try:
                    meta = await f
                except MinibrokerError as exc:
                    assert exc.code is ErrorCode.MESSAGE_TOO_LARGE, exc  # never OUT_OF_ORDER_SEQUENCE_NUMBER
                    sent[v] = None
                else:
                    sent[v] = (meta.partition, meta.offset)
    assert fake.lost_answers > 5
    in_log = {}
    for tp in (TP0, TP1, TP2):
        values = log_values(fake, tp)
        assert len(values) == len(set(values)), "a value written twice"
        in_log.update({v: (tp.partition, offset) for offset, v in enumerate(values)})
    # every acknowledged value is in the log once, at its acknowledged offset, and nothing else is (the
    # only failures, MESSAGE_TOO_LARGE, are refused before an append)
    assert in_log == {v: pos for v, pos in sent.items() if pos is not None}
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=20) as consumer:
        await consumer.assign_topic(TOPIC)
        read: list[bytes | None] = []
        for _ in range(100):
            read += [r.value for r in await consumer.poll(timeout_ms=50)]
            if len(read) >= len(in_log):
                break
    assert sorted(v or b"" for v in read) == sorted(v or b"" for v in in_log)
