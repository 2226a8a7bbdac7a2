"""Model-based test of the controller ops: random broker lives and ISR requests, invariants after every step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ErrorCode
from common.wire import TopicPartition
from controller import ops
from controller.state import MetadataImage, PartitionRecord, PartitionState, Record, RegisterBrokerRecord

BROKERS = (1, 2, 3, 4)

step = st.one_of(
    st.tuples(st.just("register"), st.sampled_from(BROKERS)),
    st.tuples(st.just("fence"), st.sampled_from(BROKERS)),
    st.tuples(st.just("unfence"), st.sampled_from(BROKERS)),
    st.tuples(st.just("shutdown"), st.sampled_from(BROKERS)),
    st.tuples(st.just("expand"), st.integers(0, 5)),
    st.tuples(st.just("shrink"), st.integers(0, 5)),
    st.tuples(st.just("preferred"), st.just(0)),
)


class Model:
    def __init__(self, unclean: bool) -> None:
        self.image = MetadataImage(controller_epoch=1)
        self.log: list[Record] = []
        self.shutting: set[int] = set()
        for b in BROKERS:
            self.commit([RegisterBrokerRecord(b, "h", 9000 + b, "i", b)])
        self.image.topics["t"] = {"unclean.leader.election.enable": unclean}
        plan, results = ops.create_topics(self.image, [ops.NewTopic("t2", 6, 3, {"unclean.leader.election.enable":
                                                                                  unclean})],
                                          list(BROKERS), default_partitions=1, default_rf=1, start_index=1,
                                          replica_shift=2)
        assert results[0].error is ErrorCode.NONE
        self.commit(plan.records)

    def live(self) -> set[int]:
        return {b for b, r in self.image.brokers.items() if not r.fenced} - self.shutting

    def commit(self, records: list[Record], *, new_incarnation: int | None = None) -> None:
        before = dict(self.image.partitions)
        for r in records:
            self.image.apply(r)
            self.log.append(r)
        for r in records:
            if isinstance(r, PartitionRecord) and r.tp in before:
                check_transition(before[r.tp], self.image.partitions[r.tp], new_incarnation)

    def step(self, kind: str, arg: int) -> None:
        unclean = False
        if kind == "register":
            plan, _ = ops.register_broker(self.image, arg, "h", 9000 + arg, "x", self.live(), unclean_default=unclean)
            self.shutting.discard(arg)
            self.commit(plan.records, new_incarnation=arg)
        elif kind == "fence" and not self.image.brokers[arg].fenced:
            self.commit(ops.fence_broker(self.image, arg, self.live() - {arg}, unclean_default=unclean).records)
        elif kind == "unfence" and self.image.brokers[arg].fenced and arg not in self.shutting:
            self.commit(ops.unfence_broker(self.image, arg, self.live(), unclean_default=unclean).records)
        elif kind == "shutdown" and not self.image.brokers[arg].fenced:
            self.shutting.add(arg)
            plan, remaining = ops.controlled_shutdown(self.image, arg, self.live(), unclean_default=unclean)
            self.commit(plan.records)
            assert all(self.image.partitions[tp].leader == arg for tp in remaining)
        elif kind in ("expand", "shrink"):
            tp = TopicPartition("t2", arg)
            p = self.image.partitions[tp]
            if p.leader < 0:
                return
            new_isr = tuple(dict.fromkeys((*p.isr, *p.replicas))) if kind == "expand" else (p.leader,)
            epochs = {b: self.image.brokers[b].broker_epoch for b in new_isr}
            plan, results = ops.alter_partition(self.image, p.leader,
                                                [ops.AlterItem(tp, p.leader_epoch, p.partition_epoch, new_isr, epochs)],
                                                self.live())
            if results[0].error is ErrorCode.NONE:
                assert set(new_isr) - set(p.isr) <= self.live(), "only eligible brokers are added"
            self.commit(plan.records)
        elif kind == "preferred":
            self.commit(ops.preferred_elections(self.image, self.live(), 0).records)

    def check(self) -> None:
        live = self.live()
        for tp, p in self.image.partitions.items():
            assert p.isr, f"{tp}: the ISR never becomes empty"
            assert set(p.isr) <= set(p.replicas)
            if p.leader >= 0:
                assert p.leader in p.isr, f"{tp}: the leader is in the ISR"
                assert p.leader in live or p.leader in self.shutting, f"{tp}: a fenced broker does not lead"
        replayed = MetadataImage()
        for r in self.log:
            replayed.apply(r)
        assert replayed.partitions == self.image.partitions


def check_transition(old: PartitionState, new: PartitionState, new_incarnation: int | None = None) -> None:
    if new == old:
        return
    assert new.partition_epoch == old.partition_epoch + 1, "every change bumps the partition epoch once"
    if new.leader != old.leader:
        assert new.leader_epoch == old.leader_epoch + 1, "every leader change bumps the leader epoch"
    elif old.leader >= 0 and old.leader == new_incarnation:
        assert new.leader_epoch == old.leader_epoch + 1, "a new incarnation leads in a new leader epoch"
    else:
        assert new.leader_epoch == old.leader_epoch


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(step, max_size=40))
def test_invariants_hold_after_every_step(steps: list[tuple[str, int]]) -> None:
    model = Model(unclean=False)
    model.check()
    for kind, arg in steps:
        model.step(kind, arg)
        model.check()
