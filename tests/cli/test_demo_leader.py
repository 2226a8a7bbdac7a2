"""The demo reads the leader of its partition from fresh metadata, and each refresh asks the next broker: one
that has not yet heard of the just-created topic (or still names the killed leader) must not end the demo.
It once failed with a KeyError traceback right after creating the topic."""

from __future__ import annotations

from cli.demo import TOPIC, _leader_of
from client import Producer, TopicPartition
from tests.client.fake_broker import running
from tests.client.helpers import fast

TP = TopicPartition(TOPIC, 0)


async def test_leader_is_asked_again_while_a_broker_does_not_know_the_topic() -> None:
    async with running(TOPIC, 3) as fake, Producer(fake.bootstrap, fast()) as producer:
        await producer.metadata.wait_for_topic(TOPIC, 10_000)
        fake.metadata_script.extend(["unknown", "unknown"])
        assert await _leader_of(producer, 0) == (fake.partitions[TP].leader, 0)
        assert not fake.metadata_script


async def test_new_leader_is_asked_again_while_a_broker_still_names_the_old_one() -> None:
    async with running(TOPIC, 3) as fake, Producer(fake.bootstrap, fast()) as producer:
        await producer.metadata.wait_for_topic(TOPIC, 10_000)
        old = fake.partitions[TP].leader
        new = 2 if old == 1 else 1
        fake.move_leader(TP, new)
        fake.stale_leaders[(old, TP)] = (0, 0)
        fake.metadata_script.extend([old, old])  # answered as the old leader would: itself, epoch 0
        assert await _leader_of(producer, 0, other_than=old) == (new, fake.partitions[TP].leader_epoch)
        assert not fake.metadata_script


async def test_no_leader_within_the_wait_is_reported_not_raised() -> None:
    async with running(TOPIC, 3) as fake, Producer(fake.bootstrap, fast()) as producer:
        await producer.metadata.wait_for_topic(TOPIC, 10_000)
        fake.move_leader(TP, -1)
        assert await _leader_of(producer, 0, wait_s=0.3) == (-1, fake.partitions[TP].leader_epoch)
