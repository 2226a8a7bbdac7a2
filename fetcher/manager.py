"""ReplicaFetcherManager: which fetcher task replicates which followed partition.

Kafka's ``AbstractFetcherManager``. A partition goes to the task keyed by
``(leader broker id, fetcher id)`` with ``fetcher id = crc32("<topic>-<partition>")
% num.replica.fetchers`` (stable across processes, unlike ``hash()`` of a str).
Tasks are created on demand; a task left without partitions is stopped (its
stop is scheduled at once and awaited by ``shutdown_idle_fetchers``/``shutdown``).
A partition moves between tasks only through remove + add, so at most one task
ever fetches it.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry

from common.clock import Clock
from common.config import Config
from common.logging import get_logger
from common.wire import TopicPartition
from fetcher.api import BrokerEndpoint, FollowerPartitions, InitialFetchState
from fetcher.endpoint import HttpLeaderEndpoint, LeaderEndpoint
from fetcher.state import PartitionFetchState
from fetcher.task import FetcherConfig, FetcherTask

log = get_logger("fetcher")

FetcherKey = tuple[int, int]  # (leader broker id, fetcher id)


def fetcher_id_for(tp: TopicPartition, num_fetchers: int) -> int:
    return zlib.crc32(f"{tp.topic}-{tp.partition}".encode()) % max(1, num_fetchers)


class ReplicaFetcherManager:
    def __init__(self, partitions: FollowerPartitions, config: Config, clock: Clock, *,
                 endpoint_factory: Callable[[BrokerEndpoint], LeaderEndpoint] | None = None,
                 fetcher_config: FetcherConfig | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        """``registry``: where the fetcher's Prometheus series go (default: prometheus_client's global one;
        a broker passes its own so that its /metrics shows them)."""
        self._partitions = partitions
        self._clock = clock
        self._config = fetcher_config or FetcherConfig.from_config(config)
        timeout_ms = self._config.socket_timeout_ms
        self._endpoint_factory = endpoint_factory or (lambda b: HttpLeaderEndpoint(b, timeout_ms=timeout_ms))
        self._tasks: dict[FetcherKey, FetcherTask] = {}
        self._owner: dict[TopicPartition, FetcherKey] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._registry = registry

    def fetcher_id(self, tp: TopicPartition) -> int:
        return fetcher_id_for(tp, self._config.num_fetchers)

    def add_partitions(self, states: Mapping[TopicPartition, InitialFetchState]) -> None:
        """Fetch each partition from its leader (replacing any earlier assignment of it)."""
        by_key: dict[FetcherKey, dict[TopicPartition, InitialFetchState]] = {}
        for tp, initial in states.items():
            if initial.leader.broker_id < 0 or initial.leader.broker_id == self._partitions.broker_id:
                # An offline partition (leader -1) or ourselves: nothing to fetch from.
                log.warning("fetcher_partition_not_added", broker_id=self._partitions.broker_id, topic=tp.topic,
                            partition=tp.partition, leader=initial.leader.broker_id,
                            leader_epoch=initial.leader_epoch)
                self.remove_partitions([tp])
                continue
            key = (initial.leader.broker_id, self.fetcher_id(tp))
            if self._owner.get(tp) not in (None, key):
                self.remove_partitions([tp])
            by_key.setdefault(key, {})[tp] = initial
        for key, group in by_key.items():
            leader = next(iter(group.values())).leader
            task = self._tasks.get(key)
            if task is not None and task.leader.broker != leader:
                # The leader broker moved to another address: Kafka restarts the thread, carrying
                # the other partitions over with their current fetch offsets.
                for tp in task.partitions():
                    state = task.fetch_state(tp)
                    if tp not in group and state is not None:
                        group[tp] = InitialFetchState(leader, state.current_leader_epoch, state.fetch_offset)
                self._retire(key)
                task = None
            if task is None:
                task = FetcherTask(key[1], self._endpoint_factory(leader), self._partitions, self._config,
                                   self._clock, registry=self._registry)
                self._tasks[key] = task
            task.add_partitions(group)
            for tp in group:
                self._owner[tp] = key
            task.start()

    def remove_partitions(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching; takes effect at once, even for a response in flight (checked before use)."""
        by_key: dict[FetcherKey, list[TopicPartition]] = {}
        for tp in tps:
            key = self._owner.pop(tp, None)
            if key is not None:
                by_key.setdefault(key, []).append(tp)
        for key, group in by_key.items():
            task = self._tasks.get(key)
            if task is None:
                continue
            task.remove_partitions(group)
            if task.partition_count == 0:
                self._retire(key)

    def _retire(self, key: FetcherKey) -> None:
        task = self._tasks.pop(key, None)
        if task is None:
            return
        tps = task.partitions()
        for tp in tps:
            if self._owner.get(tp) == key:
                del self._owner[tp]
        # Out of the task now, not when its stop runs: a new task with the same key (leader address change)
        # may get them first, and the old one must neither fetch them meanwhile nor then remove their series.
        task.remove_partitions(tps)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: the task never started
            return
        stopper = loop.create_task(task.stop(), name=f"stop-fetcher-{key[0]}-{key[1]}")
        self._stopping.add(stopper)
        stopper.add_done_callback(self._stopping.discard)

    async def shutdown_idle_fetchers(self) -> None:
        for key, task in list(self._tasks.items()):
            if task.partition_count == 0:
                self._retire(key)
        await self._await_stopping()

    async def shutdown(self) -> None:
        for key in list(self._tasks):
            self._retire(key)
        await self._await_stopping()
        log.info("fetcher_manager_shutdown", broker_id=self._partitions.broker_id)

    async def _await_stopping(self) -> None:
        if self._stopping:
            await asyncio.gather(*list(self._stopping), return_exceptions=True)

    # --- introspection (status page, tests) -------------------------------------------------

    def fetch_state(self, tp: TopicPartition) -> PartitionFetchState | None:
        key = self._owner.get(tp)
        task = self._tasks.get(key) if key is not None else None
        return task.fetch_state(tp) if task is not None else None

    def tasks(self) -> dict[FetcherKey, FetcherTask]:
        return dict(self._tasks)
