"""Helpers shared by the storage tests."""

from __future__ import annotations

from pathlib import Path

from common.clock import ManualClock
from storage.log import Log, LogConfig
from storage.record_batch import build_batch

TS = 1_700_000_000_000


def batch(n: int = 1, *, ts: int = TS, size: int = 10, base_offset: int = 0, epoch: int = -1,
          tag: int = 0) -> bytes:
    return build_batch([(b"k", bytes([tag % 256]) * size, ts + i) for i in range(n)], timestamp_ms=ts,
                       base_offset=base_offset, partition_leader_epoch=epoch)


def open_log(path: Path, clock: ManualClock | None = None, **cfg: int) -> Log:
    return Log.open(path, LogConfig(**cfg), clock or ManualClock(TS))
