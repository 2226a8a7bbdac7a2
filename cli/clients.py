"""``minibroker produce`` and ``minibroker consume`` (kcat / console producer and consumer).

Shared option helpers for the client-side commands live here too:
``--bootstrap`` defaults to ``$MINIBROKER_BOOTSTRAP``, else the default local
cluster's brokers (127.0.0.1:9091..9093); ``--controller`` to
``$MINIBROKER_CONTROLLER``, else 127.0.0.1:9090.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import sys
from collections.abc import AsyncIterator, Coroutine
from typing import Any, BinaryIO, TextIO

from cli.main import CliError
from common.cli_args import non_negative, positive

DEFAULT_BOOTSTRAP = "127.0.0.1:9091,127.0.0.1:9092,127.0.0.1:9093"
DEFAULT_CONTROLLER = "127.0.0.1:9090"


# -- shared helpers --------------------------------------------------------------------------------

def add_bootstrap(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", "-b", default=None, metavar="HOST:PORT[,HOST:PORT]",
                   help="brokers to bootstrap from (default: $MINIBROKER_BOOTSTRAP or the local cluster "
                        f"{DEFAULT_BOOTSTRAP})")


def add_controller(p: argparse.ArgumentParser) -> None:
    p.add_argument("--controller", default=None, metavar="HOST:PORT",
                   help=f"the controller (default: $MINIBROKER_CONTROLLER or {DEFAULT_CONTROLLER})")


def _given(flag: str | None, env: str, default: str) -> str:
    """The flag's value when given (an empty one too: parse_bootstrap then says it is no HOST:PORT,
    rather than the default being used unasked), else the environment variable when set and not empty,
    else the default."""
    if flag is not None:
        return flag
    return os.environ.get(env) or default


def bootstrap_of(args: argparse.Namespace) -> list[str]:
    from client.metadata import parse_bootstrap

    text = _given(args.bootstrap, "MINIBROKER_BOOTSTRAP", DEFAULT_BOOTSTRAP)
    try:
        return parse_bootstrap(text)
    except ValueError as exc:
        raise CliError(f"--bootstrap: {exc}") from None


def controller_of(args: argparse.Namespace) -> str:
    from client.metadata import parse_bootstrap

    text = _given(args.controller, "MINIBROKER_CONTROLLER", DEFAULT_CONTROLLER)
    try:
        addresses = parse_bootstrap(text)
    except ValueError as exc:
        raise CliError(f"--controller: {exc}") from None
    if len(addresses) != 1:
        raise CliError("--controller takes one HOST:PORT")
    return addresses[0]


def configure_client_logging() -> None:
    """Client logs go to stderr (stdout carries data), warnings and up unless MINIBROKER_LOG_LEVEL says."""
    from common.logging import configure

    configure("client", level=os.environ.get("MINIBROKER_LOG_LEVEL", "WARNING"))


def run_client(coro: Coroutine[Any, Any, int]) -> int:
    """Run a client coroutine; wire errors and unreachable brokers become one readable line."""
    from common.errors import MinibrokerError

    configure_client_logging()

    try:
        return asyncio.run(coro)
    except MinibrokerError as exc:
        message = str(exc)
        if exc.code.name not in message:
            message = f"{exc.code.name}: {message}"
        raise CliError(message, status=1) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep the interpreter from complaining at exit
        return 0


def text_of(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "backslashreplace")


# -- produce ---------------------------------------------------------------------------------------

# ``--producer-property KEY=VALUE``: Kafka's producer names for the ProducerConfig settings that have no option of
# their own (the others are set with theirs: --acks, --linger-ms, --batch-size, --max-in-flight,
# --delivery-timeout-ms, --max-block-ms)
PRODUCER_PROPERTIES = ("enable.idempotence", "retries", "retry.backoff.ms", "request.timeout.ms",
                       "buffer.memory", "max.request.size")
_PRODUCER_OPTIONS = {"acks": "--acks", "linger.ms": "--linger-ms", "batch.size": "--batch-size",
                     "max.in.flight.requests.per.connection": "--max-in-flight",
                     "delivery.timeout.ms": "--delivery-timeout-ms", "max.block.ms": "--max-block-ms"}


def producer_properties(items: list[str] | None, own_options: dict[str, str] | None = None) -> dict[str, Any]:
    """``["enable.idempotence=false", "retries=3"]`` -> ProducerConfig keywords; CliError for a malformed item,
    an unknown name, a name that has its own option in this command (``own_options``: Kafka name -> option,
    ``produce``'s by default), or a value of the wrong type (range checks are ProducerConfig's)."""
    own = _PRODUCER_OPTIONS if own_options is None else own_options
    settable = [name for name in PRODUCER_PROPERTIES if name not in own]
    from client.producer import parse_bool
    from common.config import ConfigError, parse_assignments

    try:
        given = parse_assignments(items or [])
    except ConfigError as exc:
        raise CliError(f"--producer-property: {exc}") from None
    out: dict[str, Any] = {}
    for key, raw in given.items():
        if key in own:
            raise CliError(f"--producer-property {key}: use {own[key]}")
        if key not in settable:
            raise CliError(f"--producer-property: unknown producer setting {key!r} "
                           f"(settable here: {', '.join(settable)})")
        try:
            out[key.replace(".", "_")] = parse_bool(key, raw) if key == "enable.idempotence" else int(raw)
        except ValueError:
            raise CliError(f"--producer-property {key}: expected "
                           f"{'true or false' if key == 'enable.idempotence' else 'an integer'}, got {raw!r}") from None
    return out


async def read_lines(stream: BinaryIO, chunk_bytes: int = 1 << 16) -> AsyncIterator[list[bytes]]:
    """Lines of ``stream`` (without their newline) in chunks, read off the event loop."""
    carry = b""
    while True:
        read1 = getattr(stream, "read1", stream.read)
        chunk = await asyncio.to_thread(read1, chunk_bytes)
        if not chunk:
            break
        parts = (carry + chunk).split(b"\n")
        carry = parts.pop()
        if parts:
            yield parts
    if carry:
        yield [carry]


class NoKeySeparatorError(ValueError):
    """A line without the --key-separator: Kafka's console producer refuses it too, rather than send it
    with a null key that the user did not ask for."""


def split_key(line: bytes, separator: bytes | None) -> tuple[bytes | None, bytes]:
    line = line.removesuffix(b"\r")
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        raise NoKeySeparatorError(f"no key separator {separator.decode(errors='replace')!r} in the line")
    return key, value


async def produce_main(args: argparse.Namespace, stdin: BinaryIO, out: TextIO) -> int:
    from client.errors import ErrorCode, MinibrokerError, error_name
    from client.producer import DeliveryFuture, Producer, ProducerConfig, parse_acks

    RECORD_ERRORS = {ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE}

    settings: dict[str, Any] = {"request_timeout_ms": min(args.delivery_timeout_ms, 30_000)}
    settings.update(producer_properties(args.producer_property))
    config = ProducerConfig(acks=parse_acks(args.acks), linger_ms=args.linger_ms, batch_size=args.batch_size,
                            max_in_flight_requests_per_connection=args.max_in_flight,
                            delivery_timeout_ms=args.delivery_timeout_ms, max_block_ms=args.max_block_ms,
                            **settings)
    if args.key_separator == "":
        raise CliError("--key-separator must not be empty")
    separator = args.key_separator.encode() if args.key_separator is not None else None
    counts = {"sent": 0, "acked": 0, "failed": 0}
    first_error: list[str] = []

    def failed(line_no: int, value: bytes, exc: BaseException) -> None:
        counts["failed"] += 1
        name = "NO_KEY_SEPARATOR" if isinstance(exc, NoKeySeparatorError) else error_name(exc)
        if not first_error:
            first_error.append(f"line {line_no}: {name}: {exc}")
        if args.delivery_report:
            out.write(json.dumps({"line": line_no, "value": text_of(value), "error": name}) + "\n")

    def report(line_no: int, value: bytes, fut: DeliveryFuture) -> None:
        exc = fut.exception()
        if exc is not None:
            failed(line_no, value, exc)
            return
        counts["acked"] += 1
        meta = fut.result()
        if args.delivery_report:
            out.write(json.dumps({"line": line_no, "value": text_of(value), "partition": meta.partition,
                                  "offset": meta.offset}) + "\n")

    producer = Producer(bootstrap_of(args), config)
    progress = asyncio.create_task(report_progress(counts, args.progress_interval_ms))
    try:
        await producer.start()
        await producer.partitions_for(args.topic)
        line_no = 0
        async for lines in read_lines(stdin):
            for line in lines:
                line_no += 1
                try:
                    key, value = split_key(line, separator)
                except NoKeySeparatorError as exc:  # this line alone fails, as an oversized one does
                    counts["sent"] += 1
                    failed(line_no, line.removesuffix(b"\r"), exc)
                    continue
                try:
                    fut = await producer.send(args.topic, value, key=key, partition=args.partition)
                except MinibrokerError as exc:
                    if exc.code not in RECORD_ERRORS:
                        raise
                    # this record alone is refused (too large): report it and go on with the next line, as
                    # Kafka's console producer does (its send hands the error to the record's callback)
                    counts["sent"] += 1
                    failed(line_no, value, exc)
                    continue
                fut.add_done_callback(functools.partial(report, line_no, value))
                counts["sent"] += 1
        await producer.flush()
        await asyncio.sleep(0)  # let the last done-callbacks run
    finally:
        progress.cancel()
        await producer.close()
        await asyncio.sleep(0)
        out.flush()
    if counts["failed"] or counts["acked"] < counts["sent"]:
        print(f"minibroker: {counts['failed']} of {counts['sent']} records were not acknowledged"
              + (f" (first error: {first_error[0]})" if first_error else ""), file=sys.stderr)
        return 1
    return 0


async def report_progress(counts: dict[str, int], interval_ms: int) -> None:
    """A progress line on stderr every ``interval_ms`` (0 = never) while producing."""
    if interval_ms <= 0:
        return
    while True:
        await asyncio.sleep(interval_ms / 1000)
        if not counts["sent"]:  # still waiting for metadata: nothing to report yet
            continue
        print(f"minibroker: {counts['sent']} sent, {counts['acked']} acknowledged, {counts['failed']} failed",
              file=sys.stderr, flush=True)


def cmd_produce(args: argparse.Namespace) -> int:
    return run_client(produce_main(args, sys.stdin.buffer, sys.stdout))


# -- consume ---------------------------------------------------------------------------------------

def format_record(rec: Any, fmt: str, print_key: bool = False, key_separator: str = "\t") -> str:
    if fmt == "json":
        return json.dumps({"partition": rec.partition, "offset": rec.offset, "key": text_of(rec.key),
                           "value": text_of(rec.value), "timestamp": rec.timestamp})
    value = text_of(rec.value) or ""
    if print_key:
        return f"{text_of(rec.key) or ''}{key_separator}{value}"
    return value


async def consume_main(args: argparse.Namespace, out: TextIO) -> int:
    from client.consumer import Consumer, ConsumerConfig
    from client.fetch_state import OffsetReset
    from common.errors import ErrorCode, error_for
    from common.wire import TopicPartition

    reset = OffsetReset.EARLIEST if args.from_beginning else OffsetReset.LATEST
    consumer = Consumer(bootstrap_of(args), ConsumerConfig(auto_offset_reset=reset,
                                                           fetch_max_wait_ms=args.fetch_max_wait_ms))
    count = 0
    try:
        if args.partition is None:
            tps = await consumer.assign_topic(args.topic, timeout_ms=args.metadata_timeout_ms)
        else:
            parts = await consumer.metadata.wait_for_topic(args.topic, args.metadata_timeout_ms)
            if args.partition not in parts:
                raise CliError(f"topic {args.topic!r} has no partition {args.partition} "
                               f"(partitions 0..{len(parts) - 1})")
            tps = [TopicPartition(args.topic, args.partition)]
            consumer.assign(tps)
        if args.offset is not None:
            for tp in tps:
                consumer.seek(tp, args.offset)
        idle_ms = 0
        while args.max_messages is None or count < args.max_messages:
            poll_ms = 500 if args.timeout_ms is None else max(1, min(500, args.timeout_ms - idle_ms))
            started = asyncio.get_running_loop().time()
            limit = None if args.max_messages is None else args.max_messages - count
            records = await consumer.poll(timeout_ms=poll_ms, max_records=limit)
            if not records:
                if await topic_deleted(consumer, args.topic):
                    raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"UNKNOWN_TOPIC_OR_PARTITION: topic '{args.topic}' was deleted")
                idle_ms += int((asyncio.get_running_loop().time() - started) * 1000) or poll_ms
                if args.timeout_ms is not None and idle_ms >= args.timeout_ms:
                    break
                continue
            idle_ms = 0
            out.write("".join(format_record(r, args.format, args.print_key) + "\n" for r in records))
            out.flush()
            count += len(records)
        leaderless = [tp for tp in tps if consumer.metadata.current.leader_address(tp) is None]
    finally:
        await consumer.close()
    if leaderless:  # Kafka's consumer warns LEADER_NOT_AVAILABLE in its log; say it where it is seen
        print(f"warning: no leader for partition{'s' if len(leaderless) > 1 else ''} "
              f"{', '.join(f'{tp.topic}-{tp.partition}' for tp in leaderless)}: records there could not be read",
              file=sys.stderr)
    print(f"consumed {count} messages", file=sys.stderr)
    return 0


async def topic_deleted(consumer: Any, topic: str) -> bool:
    """True when the consumer's metadata says ``topic`` no longer exists and a fresh metadata request
    confirms it (a consumed topic that vanished was deleted: without this, consume would wait forever)."""
    from client.errors import NoBrokersAvailableError
    from common.errors import ErrorCode

    def gone() -> bool:
        md = consumer.metadata.current
        return (md.topic_errors.get(topic) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                and not md.partitions_for(topic))

    if not gone():
        return False
    try:
        await consumer.metadata.refresh(force=True)
    except NoBrokersAvailableError:
        return False
    return gone()


def cmd_consume(args: argparse.Namespace) -> int:
    if args.from_beginning and args.offset is not None:
        raise CliError("use either --from-beginning or --offset, not both")
    return run_client(consume_main(args, sys.stdout))


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("produce", help="produce one record per stdin line",
                       description="Produce one record per line of stdin. Exit status 0 only when every "
                                   "record was acknowledged.")
    p.add_argument("topic", metavar="TOPIC", help="topic to produce to")
    add_bootstrap(p)
    p.add_argument("--acks", default="all", choices=["all", "-1", "1", "0"], help="default all")
    p.add_argument("--partition", "-p", type=non_negative("--partition"), default=None,
                   help="send every record to this partition (default: by key hash, sticky for null keys)")
    p.add_argument("--key-separator", "-K", default=None, metavar="SEP",
                   help="split each line at the first SEP into key and value; a line without SEP is not sent "
                        "and is reported as failed (NO_KEY_SEPARATOR)")
    p.add_argument("--delivery-report", action="store_true",
                   help='one JSON line per record as it is acknowledged or fails: {"line","value","partition",'
                        '"offset"} or {"line","value","error"}, line being its 1-based line number on stdin')
    p.add_argument("--linger-ms", type=non_negative("--linger-ms"), default=5, help="linger.ms (default 5)")
    p.add_argument("--batch-size", type=positive("--batch-size"), default=16_384,
                   help="batch.size in bytes (default 16384)")
    p.add_argument("--max-in-flight", type=positive("--max-in-flight"), default=5,
                   help="max.in.flight.requests.per.connection (default 5)")
    p.add_argument("--delivery-timeout-ms", type=positive("--delivery-timeout-ms"), default=120_000,
                   help="delivery.timeout.ms: how long a record may wait for its acknowledgement, retries "
                        "included (default 120000); each request's request.timeout.ms is the smaller of this "
                        "and 30000")
    p.add_argument("--max-block-ms", type=non_negative("--max-block-ms"), default=10_000,
                   help="max.block.ms: how long a send may wait for the topic's metadata or for room in the "
                        "producer's buffer (default 10000)")
    p.add_argument("--progress-interval-ms", type=non_negative("--progress-interval-ms"), default=5_000,
                   help="progress line on stderr this often (0 = never; default 5000)")
    p.add_argument("--producer-property", action="append", default=None, metavar="KEY=VALUE",
                   help="a producer setting by its Kafka name, repeatable: "
                        f"{', '.join(PRODUCER_PROPERTIES)}. enable.idempotence=true|false: the idempotent "
                        "producer (retries never write a record twice); on by default with --acks all, off with "
                        "--acks 0 or 1, and true with --acks 0 or 1 is an error. When only on by default and the "
                        "brokers do not support it, records go without it (a warning); when set to true, they "
                        "fail. request.timeout.ms defaults to the smaller of --delivery-timeout-ms and 30000")
    p.set_defaults(func=cmd_produce)

    c = sub.add_parser("consume", help="print records of a topic",
                       description="Print records; stops after --max-messages or --timeout-ms without new data.")
    c.add_argument("topic", metavar="TOPIC", help="topic to consume")
    add_bootstrap(c)
    c.add_argument("--partition", "-p", type=non_negative("--partition"), default=None,
                   help="only this partition (default: all)")
    start = c.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the log start (default: the end)")
    start.add_argument("--offset", type=non_negative("--offset"), default=None,
                       help="start at this offset in every consumed partition (where it is past a partition's "
                            "end or before its start, that partition starts at its end, as Kafka's console "
                            "consumer does)")
    c.add_argument("--max-messages", type=positive("--max-messages"), default=None,
                   help="stop after this many records (default: no limit)")
    c.add_argument("--timeout-ms", type=positive("--timeout-ms"), default=None,
                   help="stop after this long without new data (default: never)")
    c.add_argument("--format", choices=["text", "json"], default="text",
                   help='text: the value; json: {"partition","offset","key","value","timestamp"} per line')
    c.add_argument("--print-key", action="store_true", help="text format: key<TAB>value")
    c.add_argument("--fetch-max-wait-ms", type=non_negative("--fetch-max-wait-ms"), default=500,
                   help="fetch.max.wait.ms (default 500)")
    c.add_argument("--metadata-timeout-ms", type=positive("--metadata-timeout-ms"), default=10_000,
                   help="how long to wait for the topic and its partition leaders (default 10000)")
    c.set_defaults(func=cmd_consume)
