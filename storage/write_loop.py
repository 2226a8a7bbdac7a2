"""``python -m storage.write_loop``: the broker's page-cache write in a plain loop, with the background work
(fsync of rolled files, unlink of old ones) arranged in different ways.

Each step decodes a 108,000-byte produce-like msgpack body, takes its CRC-32C and appends the records to the
current 64 MiB file (``--segment-mib``); at each roll the files beyond ``--keep`` are removed. ``--mode``
says who does the background work:

  inline               the loop unlinks the oldest file itself at each roll; no fsync
  worker               a worker thread fsyncs each rolled file, then unlinks the old ones (the broker's way)
  worker-fsync         the worker fsyncs; the loop unlinks the oldest file itself
  worker-unlink        the worker unlinks; no fsync
  worker-dontneed      the worker fsyncs, drops the file's cached pages, then unlinks

It prints the write's CPU time (median and mean) and the share of writes above ``--slow-us``: on a VM whose
host backs guest memory lazily, a write into pages the host has not backed costs ~10 times the median
(docs/benchmarks/broker.md, thirteenth session). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import itertools
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

import msgpack
from crc32c import crc32c

from common.cli_args import positive

MODES = ("inline", "worker", "worker-fsync", "worker-unlink", "worker-dontneed")
Job = tuple[str, int | Path]


def _work(jobs: queue.SimpleQueue[list[Job] | None]) -> None:
    while (batch := jobs.get()) is not None:
        for op, arg in batch:
            if isinstance(arg, Path):
                arg.unlink()
                continue
            os.fsync(arg)
            if op == "dontneed":
                os.posix_fadvise(arg, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(arg)


def run(mode: str, directory: Path, steps: int, segment_bytes: int, keep: int, slow_us: float) -> str:
    body = msgpack.packb({"topics": [{"partitions": [{"records": os.urandom(108_000)}]}]})
    jobs: queue.SimpleQueue[list[Job] | None] = queue.SimpleQueue()
    worker = threading.Thread(target=_work, args=(jobs,), daemon=True)
    worker.start()
    files: list[Path] = []
    names = itertools.count()

    def new_file() -> int:
        files.append(directory / f"write-loop-{os.getpid()}-{next(names):08d}.log")
        return os.open(files[-1], os.O_CREAT | os.O_WRONLY | os.O_APPEND | os.O_EXCL, 0o644)

    fd, size, cpu_us = new_file(), 0, []
    started = time.perf_counter()
    try:
        for _ in range(steps):
            records = msgpack.unpackb(body)["topics"][0]["partitions"][0]["records"]
            crc32c(records)
            t0 = time.thread_time_ns()
            os.write(fd, records)
            cpu_us.append((time.thread_time_ns() - t0) / 1000)
            size += len(records)
            if size < segment_bytes:
                continue
            batch: list[Job] = []
            if mode in ("worker", "worker-fsync", "worker-dontneed"):
                batch.append(("dontneed" if mode == "worker-dontneed" else "fsync", os.dup(fd)))
            os.close(fd)
            fd, size = new_file(), 0
            for old in files[:-1 - keep]:
                if mode in ("inline", "worker-fsync"):
                    old.unlink()
                else:
                    batch.append(("unlink", old))
            del files[:-1 - keep]
            jobs.put(batch)
        rate = steps / (time.perf_counter() - started)
    finally:
        jobs.put(None)
        worker.join()
        os.close(fd)
        for path in files:
            path.unlink(missing_ok=True)
    slow = sum(1 for us in cpu_us if us > slow_us) / len(cpu_us)
    return (f"{mode:16s} {rate:8.0f} writes/s  write CPU median {statistics.median(cpu_us):6.1f} us, "
            f"mean {statistics.fmean(cpu_us):6.1f} us, above {slow_us:g} us: {slow:.2%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m storage.write_loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="an existing directory on the file system to measure")
    parser.add_argument("--mode", choices=MODES, action="append", help="repeatable (default: all, in order)")
    parser.add_argument("--steps", type=positive("--steps"), default=50_000, help="writes per mode")
    parser.add_argument("--segment-mib", type=positive("--segment-mib"), default=64)
    parser.add_argument("--keep", type=positive("--keep"), default=4, help="old files kept besides the current")
    parser.add_argument("--slow-us", type=positive("--slow-us"), default=150)
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        parser.error(f"{args.directory} is not a directory")
    for mode in args.mode or MODES:
        try:
            line = run(mode, args.directory, args.steps, args.segment_mib << 20, args.keep, args.slow_us)
        except OSError as exc:  # a read-only or full file system: one line, and run() removed its files
            parser.exit(2, f"{parser.prog}: error: {mode}: {exc}\n")
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
