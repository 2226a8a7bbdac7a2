"""The narrow interfaces between the broker's replica manager and the fetchers.

The replica manager (``broker/``) drives the fetcher manager:

    manager.add_partitions({tp: InitialFetchState(leader, leader_epoch, fetch_offset)})
    manager.remove_partitions({tp, ...})
    await manager.shutdown_idle_fetchers()
    await manager.shutdown()

and implements ``FollowerPartitions`` so a fetcher task can reach the local
log of a partition it replicates and report progress back. The fetcher never
imports ``broker``; the broker never looks inside a fetcher task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from common.wire import TopicPartition

if TYPE_CHECKING:
    from storage.log import Log


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    broker_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class InitialFetchState:
    leader: BrokerEndpoint
    leader_epoch: int
    fetch_offset: int  # normally the local LEO; truncation by epoch may still move it


class FollowerPartitions(Protocol):
    """What a fetcher task may do to partitions this broker follows (implemented by the broker)."""

    @property
    def broker_id(self) -> int: ...

    @property
    def broker_epoch(self) -> int: ...

    def follower_log(self, tp: TopicPartition, leader_epoch: int) -> Log | None:
        """The local log if this broker still follows ``tp`` at ``leader_epoch``; else None.

        Checked before every append and truncation so that a response that arrives
        after the partition moved is never applied.
        """
        ...

    def on_follower_appended(self, tp: TopicPartition, leader_high_watermark: int,
                             leader_log_start_offset: int) -> None:
        """After an append (or an empty response): follower HW = min(LEO, leader HW),
        log start offset follows the leader's; wakes delayed fetches."""
        ...

    def on_follower_truncated(self, tp: TopicPartition, offset: int, reason: str) -> None:
        """After a truncation: HW is clamped to the new LEO; logged as ``log_truncated``."""
        ...

    def truncations_done(self) -> None:
        """Make the truncations reported since the last call durable (the recovery-point checkpoint).

        Called once after a round of ``on_follower_truncated`` calls, before the fetcher awaits anything or
        appends: one checkpoint write for the whole round, not one per partition (a leader change moves
        many partitions at once, and each write covers every log of the broker)."""
        ...


class FollowerHighWatermarks(Protocol):
    """Optional (added by the fetcher): the local HW, used only when the leader has no epoch for ours.

    A ``FollowerPartitions`` that also has this method lets the fetcher apply Kafka's
    truncate-to-HW fallback; without it the fetcher uses the HW it last learned from the leader.
    """

    def follower_high_watermark(self, tp: TopicPartition) -> int | None: ...
