"""Controller operations as pure step tests: image + request -> records; the records applied give the new image."""

from __future__ import annotations

from common.errors import ErrorCode
from common.wire import TopicPartition
from controller import ops
from controller.rules import ElectionReason
from controller.state import MetadataImage, PartitionRecord, PartitionState, RegisterBrokerRecord

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def cluster(*parts: tuple[TopicPartition, PartitionState], unclean: bool = False) -> MetadataImage:
    image = MetadataImage(controller_epoch=1)
    for b in (1, 2, 3):
        image.apply(RegisterBrokerRecord(b, "127.0.0.1", 9000 + b, f"i{b}", b))
    image.topics["t"] = {"unclean.leader.election.enable": unclean, "min.insync.replicas": 1}
    for tp, st in parts:
        image.apply(PartitionRecord.of(tp, st))
    return image


def applied(image: MetadataImage, plan: ops.Plan) -> MetadataImage:
    for r in plan.records:
        image.apply(r)
    return image


def test_fencing_a_leader_elects_the_next_isr_member_and_bumps_epochs() -> None:
    image = cluster((TP0, PartitionState((1, 2, 3), (1, 2, 3), 1, 4, 9)),
                    (TP1, PartitionState((2, 3, 1), (2, 3, 1), 2, 0, 0)))
    plan = ops.fence_broker(image, 1, {2, 3}, unclean_default=False)
    image = applied(image, plan)
    assert image.brokers[1].fenced
    assert image.partitions[TP0] == PartitionState((1, 2, 3), (2, 3), 2, 5, 10)
    assert image.partitions[TP1] == PartitionState((2, 3, 1), (2, 3), 2, 0, 1)  # follower left: ISR change
    reasons = {c.tp: c.reason for c in plan.changes}
    assert reasons == {TP0: ElectionReason.OFFLINE, TP1: ElectionReason.OFFLINE}  # the cause: fencing


def test_fencing_the_last_isr_member_goes_offline_and_keeps_the_isr() -> None:
    image = cluster((TP0, PartitionState((1, 2), (1,), 1, 3, 3)))
    image = applied(image, ops.fence_broker(image, 1, {2, 3}, unclean_default=False))
    assert image.partitions[TP0] == PartitionState((1, 2), (1,), -1, 4, 4)
    # the broker comes back (heartbeat with its epoch): clean election of the last ISR member
    plan = ops.unfence_broker(image, 1, {2, 3}, unclean_default=False)
    image = applied(image, plan)
    assert image.partitions[TP0] == PartitionState((1, 2), (1,), 1, 5, 5)


def test_unclean_election_when_enabled() -> None:
    image = cluster((TP0, PartitionState((1, 2), (1,), 1, 3, 3)), unclean=True)
    plan = ops.fence_broker(image, 1, {2, 3}, unclean_default=False)
    image = applied(image, plan)
    assert image.partitions[TP0] == PartitionState((1, 2), (2,), 2, 4, 4)
    assert plan.changes[0].reason is ElectionReason.UNCLEAN


def test_new_incarnation_leaves_every_isr_and_gets_a_larger_epoch() -> None:
    image = cluster((TP0, PartitionState((1, 2, 3), (1, 2, 3), 1, 0, 0)),
                    (TP1, PartitionState((2, 1), (2, 1), 2, 0, 0)),
                    (TopicPartition("t", 2), PartitionState((1, 3), (1,), 1, 2, 2)))
    plan, epoch = ops.register_broker(image, 1, "127.0.0.1", 9011, "new", {1, 2, 3}, unclean_default=False)
    assert epoch == 4
    image = applied(image, plan)
    assert image.brokers[1].broker_epoch == 4 and image.brokers[1].port == 9011
    assert image.partitions[TP0] == PartitionState((1, 2, 3), (2, 3), 2, 1, 1)
    assert image.partitions[TP1] == PartitionState((2, 1), (2,), 2, 0, 1)
    # the sole ISR member keeps leading (the ISR never empties), in a new leader epoch: its follower learns
    # the new incarnation's address from the LeaderAndIsr
    assert image.partitions[TopicPartition("t", 2)] == PartitionState((1, 3), (1,), 1, 3, 3)
    assert {c.tp: c.reason for c in plan.changes}[TopicPartition("t", 2)] is ElectionReason.REREGISTRATION


def test_registration_brings_an_offline_partition_back() -> None:
    image = cluster((TP0, PartitionState((1, 2), (1,), -1, 3, 3)))
    image.brokers[1] = image.brokers[1].__class__(1, "h", 1, "x", 1, fenced=True)
    plan, _ = ops.register_broker(image, 1, "127.0.0.1", 9001, "y", {2, 3}, unclean_default=False)
    image = applied(image, plan)
    assert image.partitions[TP0] == PartitionState((1, 2), (1,), 1, 4, 4)


def test_controlled_shutdown_moves_leadership_or_takes_it_away() -> None:
    image = cluster((TP0, PartitionState((1, 2), (1, 2), 1, 0, 0)),
                    (TP1, PartitionState((1, 3), (1,), 1, 0, 0)))
    plan, remaining = ops.controlled_shutdown(image, 1, {2, 3}, unclean_default=False)
    image = applied(image, plan)
    assert image.partitions[TP0] == PartitionState((1, 2), (2,), 2, 1, 1)
    # nobody else in sync: offline with its ISR kept (KRaft), so the broker need not wait to go
    assert image.partitions[TP1] == PartitionState((1, 3), (1,), -1, 1, 1)
    assert remaining == []
    plan, _ = ops.register_broker(image, 1, "127.0.0.1", 9001, "again", {2, 3}, unclean_default=False)
    assert applied(image, plan).partitions[TP1].leader == 1  # back: it leads again


def test_the_broker_leaving_is_never_eligible_even_if_counted_live() -> None:
    # every caller passes ``live`` without the broker today; a direct call with it included must still move
    # leadership away (fencing) or take it away (controlled shutdown of the last ISR member)
    image = cluster((TP0, PartitionState((1, 2), (1, 2), 1, 3, 3)))
    image = applied(image, ops.fence_broker(image, 1, {1, 2, 3}, unclean_default=False))
    assert image.partitions[TP0] == PartitionState((1, 2), (2,), 2, 4, 4)
    image = cluster((TP0, PartitionState((1, 2), (1,), 1, 3, 3)))
    plan, remaining = ops.controlled_shutdown(image, 1, {1, 2, 3}, unclean_default=False)
    image = applied(image, plan)
    assert image.partitions[TP0].leader == -1 and remaining == []


def test_a_topic_name_colliding_in_metric_names_is_refused() -> None:
    # Kafka refuses 'my_topic' next to 'my.topic' (InvalidTopicException: the names collide in metric names);
    # both used to be created
    image = cluster()
    image.topics["my.topic"] = {}
    topics = [ops.NewTopic("my_topic", 1, 1, {}), ops.NewTopic("a_b", 1, 1, {}), ops.NewTopic("a.b", 1, 1, {}),
              ops.NewTopic("my-topic", 1, 1, {})]
    plan, results = ops.create_topics(image, topics, [1, 2, 3], default_partitions=1, default_rf=1,
                                      start_index=0, replica_shift=0)
    assert [r.error for r in results] == [ErrorCode.INVALID_TOPIC_EXCEPTION, ErrorCode.NONE,
                                          ErrorCode.INVALID_TOPIC_EXCEPTION, ErrorCode.NONE]
    assert "collides with existing topic 'my.topic'" in results[0].message
    assert "collides with existing topic 'a_b'" in results[2].message
    assert sorted(applied(image, plan).topics) == ["a_b", "my-topic", "my.topic", "t"]


def test_preferred_election_moves_leadership_back() -> None:
    image = cluster((TP0, PartitionState((1, 2), (1, 2), 2, 3, 5)),
                    (TP1, PartitionState((1, 2), (2,), 2, 3, 5)))
    plan = ops.preferred_elections(image, {1, 2, 3}, 10)
    image = applied(image, plan)
    assert image.partitions[TP0] == PartitionState((1, 2), (1, 2), 1, 4, 6)
    assert image.partitions[TP1].leader == 2  # preferred not in the ISR
    assert ops.preferred_elections(image, {1, 2, 3}, 60).records == []  # 1 of 2 misplaced = 50% <= 60%


def test_create_topics_validates_each_topic() -> None:
    image = cluster()
    topics = [ops.NewTopic("new", 3, 2, {"min.insync.replicas": "2"}), ops.NewTopic("t", 1, 1, {}),
              ops.NewTopic("bad/name", 1, 1, {}), ops.NewTopic("big", 1, 4, {}),
              ops.NewTopic("zero", 0, 1, {}), ops.NewTopic("cfg", 1, 1, {"nope": 1}),
              ops.NewTopic("new", 1, 1, {}), ops.NewTopic("cfg2", 1, 1, {"min.insync.replicas": "x"})]
    plan, results = ops.create_topics(image, topics, [1, 2, 3], default_partitions=1, default_rf=1,
                                      start_index=0, replica_shift=0)
    assert [r.error for r in results] == [
        ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS, ErrorCode.INVALID_TOPIC_EXCEPTION,
        ErrorCode.INVALID_REPLICATION_FACTOR, ErrorCode.INVALID_PARTITIONS, ErrorCode.INVALID_CONFIG,
        ErrorCode.TOPIC_ALREADY_EXISTS, ErrorCode.INVALID_CONFIG]
    image = applied(image, plan)
    assert image.topics["new"]["min.insync.replicas"] == 2
    parts = [image.partitions[TopicPartition("new", p)] for p in range(3)]
    assert [p.leader for p in parts] == [1, 2, 3]
    assert all(p.isr == p.replicas and p.leader_epoch == 0 for p in parts)


def test_alter_partition_checks_and_commits() -> None:
    image = cluster((TP0, PartitionState((1, 2, 3), (1, 2), 1, 5, 7)))
    items = [ops.AlterItem(TP0, 5, 7, (1, 2, 3), {3: 3}), ops.AlterItem(TopicPartition("x", 0), 0, 0, (1,), {})]
    plan, results = ops.alter_partition(image, 1, items, {1, 2, 3})
    assert [r.error for r in results] == [ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    image = applied(image, plan)
    assert image.partitions[TP0] == PartitionState((1, 2, 3), (1, 2, 3), 1, 5, 8)
    # the same request again (its answer was lost) carries a stale partition epoch: it is answered with the
    # committed state and changes nothing, as Kafka's LeaderAndIsr.equalsAllowStalePartitionEpoch
    plan, results = ops.alter_partition(image, 1, items[:1], {1, 2, 3})
    assert results[0].error is ErrorCode.NONE and results[0].state == image.partitions[TP0]
    assert applied(image, plan) == image
    # a stale partition epoch asking for another ISR is refused
    _, results = ops.alter_partition(image, 1, [ops.AlterItem(TP0, 5, 7, (1, 2), {})], {1, 2, 3})
    assert results[0].error is ErrorCode.INVALID_UPDATE_VERSION
    assert results[0].state == image.partitions[TP0]  # the answer carries the committed state
    # adding a fenced broker is refused
    _, results = ops.alter_partition(image, 1, [ops.AlterItem(TP0, 5, 8, (1, 2, 3), {})], {1, 2})
    assert results[0].error is ErrorCode.NONE  # no addition: 3 is already in the ISR
    shrink, _ = ops.alter_partition(image, 1, [ops.AlterItem(TP0, 5, 8, (1,), {})], {1})
    image = applied(image, shrink)
    _, results = ops.alter_partition(image, 1, [ops.AlterItem(TP0, 5, 9, (1, 3), {})], {1, 2})
    assert results[0].error is ErrorCode.INELIGIBLE_REPLICA


def test_delete_topics() -> None:
    image = cluster((TP0, PartitionState((1,), (1,), 1, 0, 0)))
    plan, results = ops.delete_topics(image, ["t", "nope", 5])
    assert [r.error for r in results] == [ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                          ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    image = applied(image, plan)
    assert not image.topics and not image.partitions
