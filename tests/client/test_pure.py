"""Pure parts of the client: partitioner, accumulator, positions, metadata, describe merge."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.accumulator import RecordAccumulator, record_size
from client.admin import describe_document
from client.fetch_state import ConsumerRecord, Positions
from client.metadata import ClusterMetadata, merge_metadata, metadata_from_response, parse_bootstrap
from client.partitioner import StickyPartitioner, murmur2, partition_for_key
from common.wire import TopicPartition

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


@pytest.mark.parametrize(("data", "expected"), [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
])
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_keyed_records_always_land_on_the_same_partition() -> None:
    parts = {partition_for_key(f"key-{i}".encode(), 6) for i in range(200)}
    assert parts == set(range(6))  # spreads
    assert all(partition_for_key(b"user-42", 6) == partition_for_key(b"user-42", 6) for _ in range(3))


def test_sticky_partitioner_moves_on_only_when_a_batch_closes() -> None:
    p = StickyPartitioner()
    first = p.partition("t", None, 3)
    assert all(p.partition("t", None, 3) == first for _ in range(10))
    p.on_new_batch("t", 3)
    second = p.partition("t", None, 3)
    assert second == (first + 1) % 3
    assert p.partition("t", b"k", 3) == partition_for_key(b"k", 3)


def test_sticky_partitioner_skips_partitions_without_a_leader_while_any_has_one() -> None:
    leaders = {0: False, 1: True, 2: False, 3: True}
    p = StickyPartitioner()
    assert p.partition("t", None, 4, leaders.__getitem__) == 1  # not 0, which has no leader
    p.on_new_batch("t", 4, leaders.__getitem__)
    assert p.partition("t", None, 4) == 3  # 2 skipped
    p.on_new_batch("t", 4, leaders.__getitem__)
    assert p.partition("t", None, 4) == 1  # round the end, 0 skipped
    p.on_new_batch("t", 4, lambda _: False)  # none has a leader: plain round-robin
    assert p.partition("t", None, 4) == 2
    assert p.partition("t", b"k", 4, lambda _: False) == partition_for_key(b"k", 4)  # keys keep their partition


def acc(batch_size: int = 100, linger_ms: int = 10) -> RecordAccumulator:
    return RecordAccumulator(batch_size=batch_size, linger_ms=linger_ms, delivery_timeout_ms=1_000)


def test_batches_fill_to_batch_size_then_close() -> None:
    a = acc(batch_size=3 * record_size(None, b"x" * 10))
    batches = []
    for _ in range(4):
        batch = a.append(TP0, None, b"x" * 10, 1, now_ms=0)
        batches.append((batch, len(batch) - 1))  # the record is the batch's last
    assert [i for _, i in batches] == [0, 1, 2, 0]  # index in batch; 0 = opened a new batch
    assert batches[0][0] is batches[2][0] is not batches[3][0]
    assert batches[0][0].closed and not batches[3][0].closed
    assert a.buffered_bytes == 4 * record_size(None, b"x" * 10)


def test_try_append_never_opens_a_batch() -> None:
    size = record_size(None, b"x" * 10)
    a = acc(batch_size=2 * size)
    assert a.try_append(TP0, None, b"x" * 10, 1, size) is None  # no batch yet
    assert a.empty() and a.buffered_bytes == 0
    first = a.append(TP0, None, b"x" * 10, 1, now_ms=0)
    assert a.try_append(TP0, None, b"x" * 10, 2, size) is first and first.closed  # full now
    assert a.try_append(TP0, None, b"x" * 10, 3, size) is None  # would need a new batch
    assert [r[2] for r in first.records] == [1, 2] and a.buffered_bytes == 2 * size
    open_one = a.append(TP1, None, b"v", 1, now_ms=0)
    assert a.drain(TP1, max_bytes=10**6, now_ms=10**6) == [open_one]  # sent: closed, no more appends
    assert a.try_append(TP1, None, b"v", 2, record_size(None, b"v")) is None


def test_ready_by_size_linger_or_flush() -> None:
    a = acc(batch_size=1_000, linger_ms=10)
    batch = a.append(TP0, None, b"v", 1, now_ms=100)
    assert not a.is_ready(batch, 105)
    assert a.next_ready_ms(batch) == 110
    assert a.is_ready(batch, 110)
    a.flushing = 1
    assert a.is_ready(batch, 100)


def test_drain_takes_ready_batches_in_order_within_the_byte_budget() -> None:
    size = record_size(None, b"x" * 50)
    a = acc(batch_size=size, linger_ms=0)
    for i in range(5):
        a.append(TP0, None, b"x" * 50, i, now_ms=0)
    first = a.drain(TP0, max_bytes=2 * size, now_ms=0)
    assert [b.records[0][2] for b in first] == [0, 1]
    rest = a.drain(TP0, max_bytes=1, now_ms=0)  # always at least one batch
    assert [b.records[0][2] for b in rest] == [2]
    a.requeue(first, retry_at_ms=50)
    assert a.drain(TP0, max_bytes=10_000, now_ms=10) == []  # backing off
    again = a.drain(TP0, max_bytes=10_000, now_ms=60)
    assert again == first  # a retry resends exactly its first request's batches, not merged with 3 and 4
    assert [b.records[0][2] for b in a.drain(TP0, max_bytes=10_000, now_ms=60)] == [3, 4]


def test_drain_caps_batches_and_keeps_a_retried_group_whole() -> None:
    size = record_size(None, b"x" * 50)
    a = acc(batch_size=size, linger_ms=0)
    for i in range(8):
        a.append(TP0, None, b"x" * 50, i, now_ms=0)
    first = a.drain(TP0, max_bytes=10_000, now_ms=0, max_batches=5)
    assert [b.records[0][2] for b in first] == [0, 1, 2, 3, 4]
    a.requeue(first, retry_at_ms=0)
    # a group that does not fit a request that has other partitions already waits for the next request...
    assert a.drain(TP0, max_bytes=2 * size, now_ms=0, at_least_one=False) == []
    # ...and is never split: alone in a request it goes whole, even over the budget
    assert a.drain(TP0, max_bytes=1, now_ms=0) == first
    assert a.drain(TP0, max_bytes=size - 1, now_ms=0, at_least_one=False) == []  # fresh batches too
    assert [b.records[0][2] for b in a.drain(TP0, max_bytes=1, now_ms=0)] == [5]


def test_a_retried_group_expires_whole() -> None:
    a = RecordAccumulator(batch_size=record_size(None, b"v"), linger_ms=0, delivery_timeout_ms=100)
    a.append(TP0, None, b"v", 0, now_ms=0)
    a.append(TP0, None, b"v", 1, now_ms=50)
    a.append(TP0, None, b"v", 2, now_ms=60)
    group = a.drain(TP0, max_bytes=10_000, now_ms=60, max_batches=2)
    a.requeue(group, retry_at_ms=0)
    assert a.expire(now_ms=100) == group  # the second batch's deadline (150) has not passed: it goes too
    assert [b.records[0][2] for b in a.drain(TP0, max_bytes=10_000, now_ms=100)] == [2]


def test_expired_batches_are_removed() -> None:
    a = acc()
    a.append(TP0, None, b"v", 1, now_ms=0)
    a.append(TP1, None, b"v", 1, now_ms=500)
    expired = a.expire(now_ms=1_000)
    assert [b.tp for b in expired] == [TP0]
    assert a.partitions() == [TP1]


def test_take_unstamped_keeps_batches_already_drained() -> None:
    """The batches failed for want of a producer id are the never-drained ones: a drained group waiting for its
    retry (stamped already) stays queued and goes out as first sent."""
    a = acc(batch_size=record_size(None, b"v"), linger_ms=0)
    for i in range(3):
        a.append(TP0, None, b"v", i, now_ms=0)
    a.append(TP1, None, b"v", 3, now_ms=0)
    group = a.drain(TP0, max_bytes=10_000, now_ms=0, max_batches=2)
    a.requeue(group, retry_at_ms=0)
    assert [b.records[0][2] for b in a.take_unstamped()] == [2, 3]
    assert a.partitions() == [TP0]
    assert a.drain(TP0, max_bytes=10_000, now_ms=0) == group
    assert a.empty()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(1, 40), st.booleans()), min_size=1, max_size=60))
def test_accumulator_keeps_partition_order_through_retries(ops: list[tuple[int, int, bool]]) -> None:
    """Whatever drains and requeues happen, records of a partition come out in send order."""
    a = acc(batch_size=60, linger_ms=0)
    sent: dict[TopicPartition, list[int]] = {TP0: [], TP1: []}
    delivered: dict[TopicPartition, list[int]] = {TP0: [], TP1: []}
    failed: dict[TopicPartition, list[list[object]]] = {TP0: [], TP1: []}  # groups waiting for their retry

    def take(tp: TopicPartition, batches: list[object]) -> None:
        if failed[tp]:  # a retry is exactly the failed request's batches
            assert batches == failed[tp].pop(0)

    for seq, (p, size, fail) in enumerate(ops):
        tp = TopicPartition("t", p)
        a.append(tp, None, b"x" * size, seq, now_ms=seq)
        sent[tp].append(seq)
        batches = a.drain(tp, max_bytes=100, now_ms=seq + 1000, max_batches=3)
        assert len(batches) <= 3
        take(tp, list(batches))
        if fail:
            a.requeue(batches, retry_at_ms=0)
            failed[tp].append(list(batches))
        else:
            delivered[tp] += [r[2] for b in batches for r in b.records]
    for tp in (TP0, TP1):
        while batches := a.drain(tp, max_bytes=10**9, now_ms=10**9):
            take(tp, list(batches))
            delivered[tp] += [r[2] for b in batches for r in b.records]
        assert delivered[tp] == sent[tp]


def rec(offset: int) -> tuple[int, ConsumerRecord]:
    return 0, ConsumerRecord("t", 0, offset, 0, None, str(offset).encode())


def test_positions_skip_records_below_position_and_discard_moved_fetches() -> None:
    pos = Positions()
    pos.assign([TP0])
    assert pos.needs_reset() == [TP0]
    pos.seek(TP0, 5)
    out = pos.accept(TP0, 5, [rec(3), rec(4), rec(5), rec(6)])
    assert [r.offset for r in out] == [5, 6]
    assert pos.get(TP0).offset == 7
    assert pos.accept(TP0, 5, [rec(5), rec(6)]) == []  # stale response: position moved meanwhile
    assert pos.accept(TP0, 7, [rec(5), rec(6)]) == []  # never twice
    with pytest.raises(ValueError, match=">= 0"):
        pos.seek(TP0, -3)
    with pytest.raises(ValueError, match="< 2\\*\\*63"):
        pos.seek(TP0, 2**64)  # would fail later in msgpack's encoder, in the middle of a poll
    assert pos.get(TP0).offset == 7
    with pytest.raises(KeyError):
        pos.get(TP1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10)), max_size=30))
def test_positions_never_return_an_offset_twice(fetches: list[tuple[int, int]]) -> None:
    pos = Positions()
    pos.assign([TP0])
    pos.seek(TP0, 0)
    seen: list[int] = []
    for start, n in fetches:
        current = pos.get(TP0).offset
        assert current is not None
        fetch_offset = current if start % 3 else start  # sometimes a stale fetch offset
        seen += [r.offset for r in pos.accept(TP0, fetch_offset, [rec(o) for o in range(start, start + n)])]
    assert len(seen) == len(set(seen))
    assert seen == sorted(seen)


def test_parse_bootstrap() -> None:
    assert parse_bootstrap("a:1, b:2") == ["a:1", "b:2"]
    for bad in ["", "host", "host:x", "host:70000", ":80"]:
        with pytest.raises(ValueError):
            parse_bootstrap(bad)


META = {
    "cluster_id": "c", "controller_id": 0,
    "brokers": [{"node_id": 1, "host": "h", "port": 1}, {"node_id": 2, "host": "h", "port": 2}],
    "topics": [{"topic": "t", "error": 0, "partitions": [
        {"partition": 0, "error": 0, "leader": 1, "leader_epoch": 3, "replicas": [1, 2], "isr": [1, 2],
         "offline_replicas": []},
        {"partition": 1, "error": 0, "leader": -1, "leader_epoch": 4, "replicas": [2, 1], "isr": [2],
         "offline_replicas": []}]}],
}


def test_metadata_from_response_and_merge() -> None:
    md = metadata_from_response(META)
    assert md.leader_address(TP0) == (1, "h:1")
    assert md.leader_address(TP1) is None  # offline
    assert md.partitions_for("t") == [0, 1]
    other = ClusterMetadata.build({1: "h:1"}, {TopicPartition("u", 0): md.partitions[TP0]}, {}, -1, None)
    merged = merge_metadata(other, md, ["t"])
    assert TopicPartition("u", 0) in merged.partitions and TP0 in merged.partitions
    assert merged.partition_counts == {"u": 1, "t": 2}


def test_a_merge_never_goes_back_to_an_older_leader_epoch_even_after_an_answer_without_the_topic() -> None:
    known = metadata_from_response(META)  # partition 0: leader 1 at epoch 3; partition 1: no leader, epoch 4
    blank = metadata_from_response({**META, "topics": [{"topic": "t", "error": 3, "partitions": []}]})
    stale = metadata_from_response({**META, "topics": [{"topic": "t", "error": 0, "partitions": [  # a cut-off leader
        {"partition": p, "error": 0, "leader": 2, "leader_epoch": 1, "replicas": [1, 2], "isr": [2]}
        for p in (0, 1)]}]})
    after_blank = merge_metadata(known, blank, ["t"])
    assert after_blank.partitions_for("t") == []  # a restarted broker: the topic is unknown for now
    merged = merge_metadata(after_blank, stale, ["t"])
    assert [merged.partitions[tp].leader_epoch for tp in (TP0, TP1)] == [3, 4]  # the last seen, not 1
    assert merged.leader_address(TP0) is None and merged.partitions_for("t") == [0, 1]
    assert merge_metadata(merged, known, ["t"]).leader_address(TP0) == (1, "h:1")  # the same epoch again: taken


def test_describe_merges_controller_view_with_replica_status() -> None:
    statuses = {1: {"partitions": [{"topic": "t", "partition": 0, "high_watermark": 7, "log_end_offset": 9,
                                    "log_start_offset": 0}]}, 2: None}
    doc = describe_document(META, statuses)
    p0 = doc["topics"][0]["partitions"][0]
    assert p0["leader"] == 1 and p0["leader_epoch"] == 3 and p0["isr"] == [1, 2]
    assert p0["replica_states"][0] == {"broker": 1, "hw": 7, "leo": 9, "log_start_offset": 0, "reachable": True}
    assert p0["replica_states"][1]["hw"] is None and p0["replica_states"][1]["reachable"] is False
