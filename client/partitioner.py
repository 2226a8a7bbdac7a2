"""Choosing a partition for a record (pure).

Keyed records: Kafka's ``murmur2(key) & 0x7fffffff % num_partitions`` so the
same key always lands on the same partition (and on the same one Kafka's Java
client would pick). Records without a key use a sticky partition (KIP-480):
all of them go to one partition until its batch is sent, then the partitioner
moves on round-robin, skipping partitions without a leader while any has one,
which keeps batches full instead of spraying one record per partition.
"""

from __future__ import annotations

from collections.abc import Callable


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (seed 0x9747b28c), as a signed 32-bit int."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    tail = length4 * 4
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    assert num_partitions > 0
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Keyless records stick to one partition per topic until ``on_new_batch`` moves it on.

    The producer calls ``on_new_batch`` when a keyless record would open a new batch on the sticky partition
    (its batch is full or was sent), then appends the record to the next partition: Kafka's
    ``abortOnNewBatch``, so batches fill instead of each partition getting a one-record batch."""

    def __init__(self, start: int = 0) -> None:
        self._start = start
        self.current: dict[str, int] = {}  # topic -> sticky partition; read directly on the producer's hot path

    def partition(self, topic: str, key: bytes | None, num_partitions: int,
                  has_leader: Callable[[int], bool] | None = None) -> int:
        if key is not None:
            return partition_for_key(key, num_partitions)  # a key's partition, leader or not (as Kafka)
        current = self.current.get(topic)
        if current is None or current >= num_partitions:
            current = _first_with_leader(self._start % num_partitions, num_partitions, has_leader)
            self.current[topic] = current
        return current

    def on_new_batch(self, topic: str, num_partitions: int, has_leader: Callable[[int], bool] | None = None) -> None:
        """The sticky partition's batch was closed: move to the next partition that has a leader."""
        current = self.current.get(topic, self._start)
        self.current[topic] = _first_with_leader((current + 1) % max(num_partitions, 1), num_partitions, has_leader)


def _first_with_leader(first: int, num_partitions: int, has_leader: Callable[[int], bool] | None) -> int:
    """``first`` or, round-robin after it, the first partition with a leader; ``first`` when none has one.
    Kafka's sticky partitioner too picks among the available partitions when there are any, so keyless
    records do not wait out delivery.timeout.ms on a partition that has no leader."""
    if has_leader is None:
        return first
    for i in range(num_partitions):
        candidate = (first + i) % num_partitions
        if has_leader(candidate):
            return candidate
    return first
