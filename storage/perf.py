"""``minibroker perf storage``: Log append/read throughput next to raw ``os.write``/``os.pread``.

For each batch size (default 16 KiB and 1 MiB of 100-byte records) one run:
1. builds one batch of that size (not timed);
2. appends it N times with plain ``os.write`` to a file, and with
   ``Log.append_as_leader`` to a fresh log in the same directory (same disk);
3. reads everything back with ``Log.read`` (1 MiB fetches, and one batch per
   call) and with ``os.pread`` of exactly the same byte ranges from the raw file.
Each measurement runs once as a warm-up and then ``--repeat`` times, raw and log
alternating; the best run of each is reported (least disturbed by the other processes on a shared machine).
No fsync on either side (Kafka's default flush policy). Prints figures; asserts
nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.clock import SystemClock
from storage.log import Log, LogConfig
from storage.record_batch import build_batch

FETCH_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Figure:
    batch_bytes: int
    operation: str
    raw_s: float
    log_s: float
    total_bytes: int
    batches: int

    def line(self) -> str:
        raw_mb, log_mb = self.total_bytes / 1e6 / self.raw_s, self.total_bytes / 1e6 / self.log_s
        return (f"{self.batch_bytes:>8} B  {self.operation:<18} raw {raw_mb:8.0f} MB/s "
                f"{self.batches / self.raw_s:9.0f} batches/s | log {log_mb:8.0f} MB/s "
                f"{self.batches / self.log_s:9.0f} batches/s | "
                f"ratio {self.raw_s / self.log_s:5.2f}")


def make_batch(target_bytes: int, record_bytes: int) -> bytes:
    """The largest batch of ``record_bytes``-byte values not above ``target_bytes``."""
    value = b"x" * record_bytes
    n = max(1, (target_bytes - 61) // (record_bytes + 8))
    while True:
        data = build_batch([(None, value)] * n, timestamp_ms=SystemClock().now_ms())
        if len(data) <= target_bytes or n == 1:
            return data
        n -= max(1, (len(data) - target_bytes) // (record_bytes + 8))


def _best_pair(raw: Callable[[], float], log: Callable[[], float], repeat: int) -> tuple[float, float]:
    """Best time of each after a warm-up of both, alternating runs so load drifts hit both alike."""
    log()
    raw()
    raw_times, log_times = [], []
    for _ in range(repeat):
        log_times.append(log())
        raw_times.append(raw())
    return min(raw_times), min(log_times)


def bench_size(base: Path, batch: bytes, count: int, repeat: int) -> list[Figure]:
    raw_path = base / "raw.bin"
    log_dir = base / "perf-0"
    state: dict[str, Log] = {}

    def raw_append() -> float:
        raw_path.unlink(missing_ok=True)
        fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        t0 = time.perf_counter()
        for _ in range(count):
            os.write(fd, batch)
        elapsed = time.perf_counter() - t0
        os.close(fd)
        return elapsed

    def log_append() -> float:
        if "log" in state:
            state.pop("log").delete()
        shutil.rmtree(log_dir, ignore_errors=True)
        log = Log.open(log_dir, LogConfig(), SystemClock())
        log.maybe_assign_epoch_start_offset(0, 0)  # as on becoming leader: its checkpoint fsync is not an append
        state["log"] = log
        t0 = time.perf_counter()
        for _ in range(count):
            log.append_as_leader(batch, 0)
        return time.perf_counter() - t0

    figures = []
    total = len(batch) * count
    raw_s, log_s = _best_pair(raw_append, log_append, repeat)
    figures.append(Figure(len(batch), "append", raw_s, log_s, total, count))
    log = state["log"]
    per_batch = log.log_end_offset // count
    for name, fetch in (("read 1 MiB fetches", FETCH_BYTES), ("read 1 batch/call", 1)):
        ranges: list[int] = []

        def log_read(fetch: int = fetch, ranges: list[int] = ranges) -> float:
            ranges.clear()
            offset, leo = 0, log.log_end_offset
            t0 = time.perf_counter()
            while offset < leo:
                data = log.read(offset, fetch).records
                ranges.append(len(data))
                offset += len(data) // len(batch) * per_batch
            return time.perf_counter() - t0

        def raw_read(ranges: list[int] = ranges) -> float:
            fd = os.open(raw_path, os.O_RDONLY)
            pos = 0
            t0 = time.perf_counter()
            for n in ranges:
                os.pread(fd, n, pos)
                pos += n
            elapsed = time.perf_counter() - t0
            os.close(fd)
            return elapsed

        raw_s, log_s = _best_pair(raw_read, log_read, repeat)
        figures.append(Figure(len(batch), name, raw_s, log_s, total, count))
    state.pop("log").delete()
    raw_path.unlink(missing_ok=True)
    return figures


def run(dir: Path | None, total_mib: int, batch_sizes: list[int], record_bytes: int, repeat: int) -> list[Figure]:
    base = Path(tempfile.mkdtemp(prefix="minibroker-perf-", dir=dir))
    try:
        print(f"storage benchmark in {base} ({os.cpu_count()} cores), {total_mib} MiB per batch size, "
              f"{record_bytes}-byte records, best of {repeat} after a warm-up; ratio = log / raw throughput")
        figures = []
        for size in batch_sizes:
            batch = make_batch(size, record_bytes)
            count = max(1, total_mib * 1024 * 1024 // len(batch))
            for fig in bench_size(base, batch, count, repeat):
                print(fig.line(), flush=True)
                figures.append(fig)
        return figures
    finally:
        shutil.rmtree(base, ignore_errors=True)
