"""``minibroker perf produce|consume|e2e``: Kafka's perf-test tools, same output shape.

``perf produce`` prints kafka-producer-perf-test's lines: a window line every
``--reporting-interval`` ms and a final line with records/sec, MB/sec, average
and max latency and the 50th/95th/99th/99.9th percentiles. Latency is from
``send`` to acknowledgement, per record. ``perf consume`` prints
kafka-consumer-perf-test's figures; ``perf e2e`` produces at a fixed rate and
measures send-to-consume latency (the timestamp travels in the value).
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from cli.clients import add_bootstrap, bootstrap_of, producer_properties, run_client
from cli.main import CliError
from common.cli_args import non_negative, number, positive


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values))))
    return sorted_values[rank]


@dataclass(slots=True)
class LatencyStats:
    """kafka-producer-perf-test's Stats: windows for progress, every latency (ms) for percentiles."""

    started_s: float
    reporting_interval_s: float
    out: TextIO
    count: int = 0
    bytes: int = 0
    total_latency_ms: float = 0.0
    max_latency_ms: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    window_start_s: float = 0.0
    window_count: int = 0
    window_bytes: int = 0
    window_latency_ms: float = 0.0
    window_max_ms: float = 0.0

    def __post_init__(self) -> None:
        self.window_start_s = self.started_s

    def record_many(self, latencies_ms: list[float], size: int, now_s: float) -> None:
        """Records of one batch, all acknowledged at ``now_s``."""
        n = len(latencies_ms)
        if not n:
            return
        total = sum(latencies_ms)
        worst = max(latencies_ms)
        self.count += n
        self.bytes += n * size
        self.total_latency_ms += total
        self.max_latency_ms = max(self.max_latency_ms, worst)
        self.latencies_ms.extend(latencies_ms)
        self.window_count += n
        self.window_bytes += n * size
        self.window_latency_ms += total
        self.window_max_ms = max(self.window_max_ms, worst)
        if now_s - self.window_start_s >= self.reporting_interval_s:
            self.print_window(now_s)

    def record(self, latency_ms: float, size: int, now_s: float) -> None:
        self.count += 1
        self.bytes += size
        self.total_latency_ms += latency_ms
        self.max_latency_ms = max(self.max_latency_ms, latency_ms)
        self.latencies_ms.append(latency_ms)
        self.window_count += 1
        self.window_bytes += size
        self.window_latency_ms += latency_ms
        self.window_max_ms = max(self.window_max_ms, latency_ms)
        if now_s - self.window_start_s >= self.reporting_interval_s:
            self.print_window(now_s)

    def print_window(self, now_s: float) -> None:
        elapsed = max(now_s - self.window_start_s, 1e-9)
        n = max(self.window_count, 1)
        self.out.write(f"{self.window_count} records sent, {self.window_count / elapsed:.1f} records/sec "
                       f"({self.window_bytes / elapsed / 1024 / 1024:.2f} MB/sec), "
                       f"{self.window_latency_ms / n:.1f} ms avg latency, {self.window_max_ms:.1f} ms max latency.\n")
        self.out.flush()
        self.window_start_s = now_s
        self.window_count = self.window_bytes = 0
        self.window_latency_ms = self.window_max_ms = 0.0

    def summary(self, now_s: float) -> dict[str, float]:
        elapsed = max(now_s - self.started_s, 1e-9)
        lat = sorted(self.latencies_ms)
        return {"records": self.count, "records_per_sec": self.count / elapsed,
                "mb_per_sec": self.bytes / elapsed / 1024 / 1024,
                "avg_latency_ms": self.total_latency_ms / max(self.count, 1), "max_latency_ms": self.max_latency_ms,
                "p50_ms": percentile(lat, 0.5), "p95_ms": percentile(lat, 0.95), "p99_ms": percentile(lat, 0.99),
                "p999_ms": percentile(lat, 0.999)}

    def print_final(self, now_s: float) -> dict[str, float]:
        s = self.summary(now_s)
        self.out.write(f"{s['records']:.0f} records sent, {s['records_per_sec']:.1f} records/sec "
                       f"({s['mb_per_sec']:.2f} MB/sec), {s['avg_latency_ms']:.2f} ms avg latency, "
                       f"{s['max_latency_ms']:.2f} ms max latency, {s['p50_ms']:.0f} ms 50th, "
                       f"{s['p95_ms']:.0f} ms 95th, "
                       f"{s['p99_ms']:.0f} ms 99th, {s['p999_ms']:.0f} ms 99.9th.\n")
        self.out.flush()
        return s


class Throttle:
    """Keeps the send rate at ``rate`` records/s (kafka's ThroughputThrottler); -1 = unthrottled."""

    def __init__(self, rate: float, started_s: float) -> None:
        self.rate = rate
        self.started_s = started_s

    def delay_s(self, sent: int, now_s: float) -> float:
        if self.rate <= 0:
            return 0.0
        return max(0.0, self.started_s + sent / self.rate - now_s)


# One period of the filler: byte i of a payload is _FILLER[i % 26] (the letters in the order i * 7 + 3 mod 26)
_FILLER = bytes(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"[(i * 7 + 3) % 26] for i in range(26))


def make_payload(size: int) -> bytes:
    """Printable filler, like kafka's perf test (uppercase letters); fixed so runs compare.

    Built from whole copies of one 26-byte period (a few C-level operations, not one per byte)."""
    copies, rest = divmod(size, len(_FILLER))
    try:
        return _FILLER * copies + _FILLER[:rest]
    except MemoryError:
        raise CliError(f"not enough memory for a {size}-byte payload (--record-size)") from None


def check_record_size(args: argparse.Namespace, minimum: int = 1) -> None:
    """Refuse a ``--record-size`` whose record the producer would refuse (larger than ``--max-request-size``
    with the producer's per-record overhead), before any payload is built or any broker is contacted."""
    from client.accumulator import RECORD_OVERHEAD_BYTES

    largest = args.max_request_size - RECORD_OVERHEAD_BYTES
    if largest < minimum:
        raise CliError(f"--max-request-size {args.max_request_size} leaves no room for a {minimum}-byte record "
                       f"(a record takes {RECORD_OVERHEAD_BYTES} bytes besides its value)")
    if args.record_size > largest:
        raise CliError(f"--record-size {args.record_size} does not fit --max-request-size {args.max_request_size} "
                       f"(a record takes {RECORD_OVERHEAD_BYTES} bytes besides its value: at most "
                       f"--record-size {largest})")


def check_e2e(args: argparse.Namespace) -> None:
    if args.throughput <= 0:
        raise CliError("perf e2e needs a fixed --throughput > 0")
    if args.record_size < 16:
        raise CliError("perf e2e needs --record-size >= 16 (the send time travels in the value)")
    check_record_size(args, minimum=16)


# the producer settings perf produce / perf e2e set with an option of their own (Kafka name -> option)
PERF_PRODUCER_OPTIONS = {"acks": "--acks", "batch.size": "--batch-size", "linger.ms": "--linger-ms",
                         "max.in.flight.requests.per.connection": "--max-in-flight",
                         "buffer.memory": "--buffer-memory", "max.request.size": "--max-request-size"}


def producer_config(args: argparse.Namespace) -> Any:
    from client.producer import ProducerConfig, parse_acks

    extra = producer_properties(args.producer_property, PERF_PRODUCER_OPTIONS)  # Kafka's --producer-props
    return ProducerConfig(acks=parse_acks(args.acks), batch_size=args.batch_size, linger_ms=args.linger_ms,
                          max_in_flight_requests_per_connection=args.max_in_flight,
                          buffer_memory=args.buffer_memory, max_request_size=args.max_request_size, **extra)


async def produce_main(args: argparse.Namespace, out: TextIO) -> int:
    from client.producer import Producer

    check_record_size(args)
    payload = make_payload(args.record_size)
    producer = Producer(bootstrap_of(args), producer_config(args))
    failures: list[BaseException] = []
    try:
        await producer.start()
        await producer.partitions_for(args.topic)
        clock = time.perf_counter
        started = clock()
        stats = LatencyStats(started, args.reporting_interval / 1000, out)
        throttle = Throttle(args.throughput, started)
        send_times: dict[int, list[float]] = {}
        size = len(payload)

        def on_batch(key: int, _count: int, error: BaseException | None) -> None:
            times = send_times.pop(key)
            now = clock()
            if error is not None:
                failures.append(error)
                return
            stats.record_many([(now - t) * 1000 for t in times], size, now)

        # the per-record loop: locals only (send_nowait, the clock, the open batch's send-time list)
        topic = args.topic
        send_nowait = producer.send_nowait
        throttled = throttle.rate > 0
        no_batch: list[float] = []
        add_time: Callable[[float], None] = no_batch.append
        for i in range(args.num_records):
            sent_at = clock()
            fut = send_nowait(topic, payload)
            if fut is None:
                fut = await producer.send(topic, payload)
            elif fut.index == 0:
                await asyncio.sleep(0)  # a new batch: let the sender run
            if fut.index == 0:
                current: list[float] = []
                key = id(current)
                send_times[key] = current
                add_time = current.append
                fut.add_batch_callback(functools.partial(on_batch, key))
            add_time(sent_at)
            if throttled and i % 16 == 0:
                delay = throttle.delay_s(i + 1, clock())
                if delay > 0:
                    await asyncio.sleep(delay)
        await producer.flush()
        await asyncio.sleep(0)
        stats.print_final(clock())
    finally:
        await producer.close()
    if failures:
        from client.errors import error_name

        print(f"minibroker: {len(failures)} batches failed (first: {error_name(failures[0])}: {failures[0]})",
              file=sys.stderr)
        return 1
    return 0


async def consume_main(args: argparse.Namespace, out: TextIO) -> int:
    from client.consumer import Consumer, ConsumerConfig
    from client.fetch_state import OffsetReset

    consumer = Consumer(bootstrap_of(args), ConsumerConfig(auto_offset_reset=OffsetReset.EARLIEST,
                                                           max_partition_fetch_bytes=args.fetch_size,
                                                           max_poll_records=100_000))
    try:
        await consumer.assign_topic(args.topic, args.timeout_ms)
        clock = time.perf_counter
        started = clock()
        wall_start = time.strftime("%Y-%m-%d %H:%M:%S")
        count = size = 0
        last_report = started
        idle_since = started
        while count < args.num_records:
            # never past --num-records (kafka-consumer-perf-test stops at --messages)
            records = await consumer.poll(timeout_ms=500, max_records=args.num_records - count)
            now = clock()
            if not records:
                if (now - idle_since) * 1000 >= args.timeout_ms:
                    print(f"minibroker: no data for {args.timeout_ms} ms; stopping after {count} records",
                          file=sys.stderr)
                    break
                continue
            idle_since = now
            count += len(records)
            size += sum(len(r.value or b"") + len(r.key or b"") for r in records)
            if now - last_report >= args.reporting_interval / 1000:
                out.write(f"{count} records consumed, {count / (now - started):.1f} records/sec\n")
                out.flush()
                last_report = now
        elapsed = max(clock() - started, 1e-9)
        mb = size / 1024 / 1024
        out.write("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec\n")
        out.write(f"{wall_start}, {time.strftime('%Y-%m-%d %H:%M:%S')}, {mb:.4f}, {mb / elapsed:.4f}, "
                  f"{count}, {count / elapsed:.4f}\n")
        out.write(f"{count} records consumed in {elapsed:.2f} s: {count / elapsed:.1f} records/sec "
                  f"({mb / elapsed:.2f} MB/sec)\n")
        out.flush()
    finally:
        await consumer.close()
    return 0 if count >= args.num_records else 1


async def e2e_main(args: argparse.Namespace, out: TextIO) -> int:
    """Produce ``num_records`` at ``throughput``/s; the consumer reads them back as they commit."""
    from client.consumer import Consumer, ConsumerConfig
    from client.fetch_state import OffsetReset
    from client.producer import Producer

    check_e2e(args)
    clock = time.perf_counter_ns
    filler = make_payload(args.record_size - 16)
    producer = Producer(bootstrap_of(args), producer_config(args))
    consumer = Consumer(bootstrap_of(args), ConsumerConfig(auto_offset_reset=OffsetReset.LATEST,
                                                           fetch_max_wait_ms=args.fetch_max_wait_ms,
                                                           max_poll_records=100_000))
    latencies: list[float] = []
    try:
        await producer.start()
        await producer.partitions_for(args.topic)
        tps = await consumer.assign_topic(args.topic)
        for tp in tps:
            await consumer.position(tp)  # pin "latest" before producing
        done = asyncio.Event()

        async def consume() -> None:
            while len(latencies) < args.num_records and not done.is_set():
                for r in await consumer.poll(timeout_ms=200):
                    if r.value and len(r.value) >= 16 and r.value[:8] == b"MBE2E\x00\x00\x00":
                        latencies.append((clock() - int.from_bytes(r.value[8:16], "big")) / 1e6)
        task = asyncio.create_task(consume())
        started = time.perf_counter()
        throttle = Throttle(args.throughput, started)
        last_report = started
        for i in range(args.num_records):
            delay = throttle.delay_s(i, time.perf_counter())
            if delay > 0:
                await asyncio.sleep(delay)
            value = b"MBE2E\x00\x00\x00" + clock().to_bytes(8, "big") + filler
            await producer.send(args.topic, value)
            now = time.perf_counter()
            if now - last_report >= args.reporting_interval / 1000:
                out.write(f"{i + 1} records sent, {len(latencies)} received\n")
                out.flush()
                last_report = now
        await producer.flush()
        try:
            await asyncio.wait_for(task, timeout=args.timeout_ms / 1000)
        except TimeoutError:
            done.set()
    finally:
        await producer.close()
        await consumer.close()
    lat = sorted(latencies)
    out.write(f"{len(lat)} of {args.num_records} records received at {args.throughput} records/sec: "
              f"avg {sum(lat) / max(len(lat), 1):.2f} ms, 50th {percentile(lat, 0.5):.2f} ms, "
              f"95th {percentile(lat, 0.95):.2f} ms, 99th {percentile(lat, 0.99):.2f} ms, "
              f"99.9th {percentile(lat, 0.999):.2f} ms, max {lat[-1] if lat else 0:.2f} ms end-to-end latency.\n")
    out.flush()
    return 0 if len(lat) >= args.num_records else 1


def _producer_args(q: argparse.ArgumentParser, linger_ms: int) -> None:
    q.add_argument("--acks", default="all", choices=["all", "-1", "1", "0"], help="acks (default all)")
    q.add_argument("--batch-size", type=positive("--batch-size"), default=65_536,
                   help="batch.size in bytes (default 65536, near the 64000 of Kafka's classic perf-test command "
                        "line; the producer library's own default is 16384, as Kafka's)")
    q.add_argument("--linger-ms", type=non_negative("--linger-ms"), default=linger_ms,
                   help=f"linger.ms (default {linger_ms})")
    q.add_argument("--max-in-flight", type=positive("--max-in-flight"), default=5,
                   help="max.in.flight.requests.per.connection (default 5)")
    q.add_argument("--buffer-memory", type=positive("--buffer-memory"), default=32 * 1024 * 1024,
                   help="buffer.memory in bytes (default 33554432, 32 MiB)")
    q.add_argument("--max-request-size", type=positive("--max-request-size"), default=1024 * 1024,
                   help="max.request.size in bytes (default 1048576, 1 MiB); bounds --record-size")
    q.add_argument("--producer-property", action="append", default=None, metavar="KEY=VALUE",
                   help="another producer setting by its Kafka name, repeatable (Kafka's --producer-props): "
                        "enable.idempotence (default true with --acks all), retries, retry.backoff.ms, "
                        "request.timeout.ms")


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    q = perf.add_parser("produce", help="producer throughput and latency (kafka-producer-perf-test)",
                        description="Send --num-records records of --record-size bytes and print producer "
                                    "throughput and send-to-acknowledgement latency, as "
                                    "kafka-producer-perf-test does.")
    q.add_argument("--topic", required=True, help="topic to produce to")
    q.add_argument("--num-records", type=positive("--num-records"), required=True, help="records to send")
    q.add_argument("--record-size", type=positive("--record-size"), required=True,
                   help="bytes of each record's value")
    q.add_argument("--throughput", type=number("--throughput"), default=-1,
                   help="records/sec; -1 = unthrottled (default)")
    q.add_argument("--reporting-interval", type=positive("--reporting-interval"), default=5_000, metavar="MS",
                   help="milliseconds between progress lines (default 5000)")
    _producer_args(q, linger_ms=5)
    add_bootstrap(q)
    q.set_defaults(func=_run_produce)

    q = perf.add_parser("consume", help="consumer throughput (kafka-consumer-perf-test)",
                        description="Read a topic (every partition, from the beginning) until --num-records "
                                    "records arrived or none came for --timeout-ms, and print consumer throughput, "
                                    "as kafka-consumer-perf-test does.")
    q.add_argument("--topic", required=True, help="topic to consume (every partition, from the beginning)")
    q.add_argument("--num-records", type=positive("--num-records"), required=True,
                   help="records to read (no more are counted); exit status 1 if fewer arrive")
    q.add_argument("--fetch-size", type=positive("--fetch-size"), default=1024 * 1024,
                   help="max.partition.fetch.bytes (default 1048576)")
    q.add_argument("--timeout-ms", type=positive("--timeout-ms"), default=10_000,
                   help="stop after this long without data, and wait at most this long for the topic's metadata "
                        "(default 10000)")
    q.add_argument("--reporting-interval", type=positive("--reporting-interval"), default=5_000, metavar="MS",
                   help="milliseconds between progress lines (default 5000)")
    add_bootstrap(q)
    q.set_defaults(func=lambda a: run_client(consume_main(a, sys.stdout)))

    q = perf.add_parser("e2e", help="end-to-end latency at a fixed rate",
                        description="Produce at a fixed --throughput while a consumer reads the topic, and print "
                                    "send-to-consume latency percentiles (the send time travels in the value).")
    q.add_argument("--topic", required=True, help="topic to produce to and consume from")
    q.add_argument("--num-records", type=positive("--num-records"), default=10_000,
                   help="records to send (default 10000)")
    q.add_argument("--record-size", type=positive("--record-size"), default=100,
                   help="bytes of each record's value, at least 16 (default 100)")
    q.add_argument("--throughput", type=number("--throughput"), default=1_000, help="records/sec (default 1000)")
    q.add_argument("--fetch-max-wait-ms", type=non_negative("--fetch-max-wait-ms"), default=500,
                   help="the consumer's fetch.max.wait.ms (default 500)")
    q.add_argument("--timeout-ms", type=positive("--timeout-ms"), default=30_000,
                   help="how long to wait for the last records after sending (default 30000)")
    q.add_argument("--reporting-interval", type=positive("--reporting-interval"), default=5_000, metavar="MS",
                   help="milliseconds between progress lines (default 5000)")
    _producer_args(q, linger_ms=0)  # each record is sent at once: latency, not batching, is measured
    add_bootstrap(q)
    q.set_defaults(func=_run_e2e)


def _run_produce(args: argparse.Namespace) -> int:
    check_record_size(args)  # before logging is set up, a payload built or a broker contacted
    return run_client(produce_main(args, sys.stdout))


def _run_e2e(args: argparse.Namespace) -> int:
    check_e2e(args)
    return run_client(e2e_main(args, sys.stdout))
