"""A stand-in for ``storage.log_manager.LogManager`` (same interface, real ``storage.log.Log`` files),
used only while the storage package's manager is not there yet."""

from __future__ import annotations

import asyncio
from pathlib import Path

from common.clock import Clock
from common.config import Config
from common.wire import TopicPartition
from storage import checkpoint
from storage.log import Log, LogConfig, parse_topic_partition

HW_FILE = "replication-offset-checkpoint"


class StandinLogManager:
    def __init__(self, data_dir: Path, config: Config, clock: Clock) -> None:
        self.data_dir = data_dir
        self.config = config
        self.clock = clock
        self._logs: dict[TopicPartition, Log] = {}
        self.high_watermarks: object = None

    def start(self) -> None:
        pass

    async def load(self) -> None:
        for d in sorted(self.data_dir.iterdir()):
            if d.is_dir() and "-" in d.name:
                the_log = await asyncio.to_thread(Log.open, d, LogConfig.from_config(self.config), self.clock)
                self._logs[parse_topic_partition(d)] = the_log

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    async def get_or_create_log(self, tp: TopicPartition, config: LogConfig) -> Log:
        if tp not in self._logs:
            d = self.data_dir / f"{tp.topic}-{tp.partition}"
            self._logs[tp] = await asyncio.to_thread(Log.open, d, config, self.clock)
        return self._logs[tp]

    def logs(self) -> dict[TopicPartition, Log]:
        return dict(self._logs)

    def read_high_watermarks(self) -> dict[TopicPartition, int]:
        path = self.data_dir / HW_FILE
        return checkpoint.read_offsets(path) if path.exists() else {}

    def checkpoint_high_watermarks(self, hws: dict[TopicPartition, int]) -> None:
        checkpoint.write_offsets(self.data_dir / HW_FILE, hws)

    def checkpoint_recovery_points_and_log_starts(self) -> None:
        pass

    async def delete_log(self, tp: TopicPartition) -> None:
        the_log = self._logs.pop(tp, None)
        if the_log is not None:
            await asyncio.to_thread(the_log.delete)

    async def close(self) -> None:
        for the_log in self._logs.values():
            the_log.close()
