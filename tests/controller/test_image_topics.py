"""The image's per-topic index of partitions (what metadata of all topics, status and topic deletion read)
agrees with the partitions it holds, through creations, added partitions, deletions, re-creations and a
snapshot round trip."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from common.wire import TopicPartition
from controller.state import MetadataImage, PartitionRecord, RemoveTopicRecord, TopicRecord

NAMES = ["a", "b", "c"]
step = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES), st.integers(1, 4)),
    st.tuples(st.just("add"), st.sampled_from(NAMES), st.integers(1, 3)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES), st.just(0)),
)


def scanned(image: MetadataImage, topic: str) -> list[TopicPartition]:
    return sorted(tp for tp in image.partitions if tp.topic == topic)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(step, max_size=30))
def test_topic_partitions_agree_with_the_partitions_held(steps: list[tuple[str, str, int]]) -> None:
    image = MetadataImage()
    for kind, name, n in steps:
        if kind == "create" and name not in image.topics:
            image.apply(TopicRecord(name, {}))
            for p in range(n):
                image.apply(PartitionRecord(name, p, (1,), (1,), 1, 0, 0))
        elif kind == "add" and name in image.topics:
            start = len(image.topic_partitions(name))
            for p in range(start, start + n):
                image.apply(PartitionRecord(name, p, (1,), (1,), 1, 0, 0))
        elif kind == "delete" and name in image.topics:
            image.apply(RemoveTopicRecord(name, {}))
        for name_ in NAMES:
            assert image.topic_partitions(name_) == scanned(image, name_)
    restored = MetadataImage.from_snapshot(image.to_snapshot())
    for name_ in NAMES:
        assert restored.topic_partitions(name_) == scanned(image, name_)
