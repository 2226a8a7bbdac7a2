"""The two delayed operations: produce waiting for the HW, fetch waiting for data (Kafka
``DelayedProduce`` / ``DelayedFetch``). Their conditions read the partition state through small
callables so they stay free of I/O and can be unit-tested with plain values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.purgatory import DelayedOperation
from common.errors import ErrorCode
from common.wire import TopicPartition


@dataclass(frozen=True, slots=True)
class LeaderView:
    """What a delayed produce needs to know about a partition now."""

    is_leader: bool
    leader_epoch: int
    high_watermark: int
    isr_size: int
    min_insync_replicas: int


@dataclass(frozen=True, slots=True)
class ProduceWait:
    leader_epoch: int
    required_offset: int  # HW must reach this (last appended offset + 1)


class DelayedProduce(DelayedOperation[dict[TopicPartition, ErrorCode]]):
    """acks=all: done when every partition has an answer.

    Per partition (Kafka ``DelayedProduce.tryComplete``): leadership or leader epoch changed ->
    NOT_LEADER_OR_FOLLOWER (fail, never succeed, DESIGN.md); HW >= required offset -> NONE, or
    NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR is now below min.insync.replicas. Expiry ->
    REQUEST_TIMED_OUT for the partitions still waiting.
    """

    def __init__(self, deadline_ms: int, waits: dict[TopicPartition, ProduceWait],
                 view: Callable[[TopicPartition], LeaderView | None],
                 on_done: Callable[[dict[TopicPartition, ErrorCode]], None]) -> None:
        super().__init__(deadline_ms, on_done)
        self._waits = waits
        self._view = view
        self._answers: dict[TopicPartition, ErrorCode] = {}

    def check(self) -> dict[TopicPartition, ErrorCode] | None:
        for tp, wait in self._waits.items():
            if tp in self._answers:
                continue
            answer = _produce_answer(self._view(tp), wait)
            if answer is not None:
                self._answers[tp] = answer
        if len(self._answers) == len(self._waits):
            return dict(self._answers)
        return None

    def expired_result(self) -> dict[TopicPartition, ErrorCode]:
        return self.result_with(ErrorCode.REQUEST_TIMED_OUT)

    def result_with(self, unanswered: ErrorCode) -> dict[TopicPartition, ErrorCode]:
        """The answers so far, ``unanswered`` for the partitions still waiting (expiry; shutdown): a partition
        whose write was already committed keeps NONE, so the client does not send it again."""
        out = dict(self._answers)
        for tp in self._waits:
            out.setdefault(tp, unanswered)
        return out


def _produce_answer(view: LeaderView | None, wait: ProduceWait) -> ErrorCode | None:
    if view is None or not view.is_leader or view.leader_epoch != wait.leader_epoch:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    if view.high_watermark >= wait.required_offset:
        if view.isr_size < view.min_insync_replicas:
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return ErrorCode.NONE
    return None


class DelayedFetch(DelayedOperation[bool]):
    """A long-poll fetch: done (True) when ``ready()`` says enough data or an error is there;
    expired -> False. The handler then reads again and answers with what is there."""

    def __init__(self, deadline_ms: int, ready: Callable[[], bool], on_done: Callable[[bool], None]) -> None:
        super().__init__(deadline_ms, on_done)
        self._ready = ready

    def check(self) -> bool | None:
        return True if self._ready() else None

    def expired_result(self) -> bool:
        return False
