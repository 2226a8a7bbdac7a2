"""``minibroker produce`` and ``minibroker consume`` (kcat / console producer and consumer).

Shared option helpers for the client-side commands live here too:
``--bootstrap`` defaults to ``$MINIBROKER_BOOTSTRAP``, else the default local
cluster's brokers (127.0.0.1:9091..9093); ``--controller`` to
``$MINIBROKER_CONTROLLER``, else 127.0.0.1:9090.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO, TypeVar

from cli.main import CliError
from common.cli_args import int_range, non_negative, positive

DEFAULT_BOOTSTRAP = "127.0.0.1:9091,127.0.0.1:9092,127.0.0.1:9093"
DEFAULT_CONTROLLER = "127.0.0.1:9090"

# After a Ctrl-C, how long produce waits for the records it already sent (a second Ctrl-C stops waiting)
INTERRUPT_WAIT_MS = 10_000
# consume: a topic the brokers keep saying does not exist for this long is reported (not at their first answer:
# a topic just created reaches the brokers a moment after the controller answered the create)
UNKNOWN_TOPIC_GRACE_MS = 1_000
# a delivery report shows this many bytes of a line too long to be a record (the rest was never kept)
LONG_LINE_HEAD_BYTES = 64

_T = TypeVar("_T")


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
        quiet_broken_stdout()
        return 0


def quiet_broken_stdout() -> None:
    """Stdout's reader went away (EPIPE: ``| head -1``): send whatever is still buffered, and anything written
    later, the interpreter's flush at exit included, to /dev/null, so the command ends quietly as Unix tools
    do (Python's documentation, "Note on SIGPIPE")."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    with contextlib.suppress(OSError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep the interpreter from complaining at exit


def data_fields(name: str, data: bytes | None) -> dict[str, str | None]:
    """JSON fields for a key or value: ``{name: text}`` when it is UTF-8 (``{name: None}`` when null), else
    ``{name + "_base64": base64 of the bytes}`` and no ``name``: bytes that are not UTF-8 never show as text
    that other bytes could also have produced."""
    if data is None:
        return {name: None}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(data).decode("ascii")}


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
    from common.config import ConfigError, parse_assignments, parse_int

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
        try:  # Kafka's parsers (true/false; Long.parseLong's digits), as for broker and topic configs
            out[key.replace(".", "_")] = parse_bool(key, raw) if key == "enable.idempotence" else parse_int(key, raw)
        except ConfigError as exc:
            raise CliError(f"--producer-property {exc}") from None
    return out


@dataclass(frozen=True, slots=True)
class LongLine:
    """A stdin line longer than any record can be: only its first bytes were kept, and its length."""

    head: bytes
    size: int


_STOP = object()


class LineReader:
    """Lines of a binary stream (without their newline), read by a daemon thread.

    The thread reads the file descriptor with ``os.read`` (a stream without one: its ``read1``) a chunk at a
    time, at most ``read_ahead`` chunks ahead of the consumer, and hands each chunk to the event loop. A
    daemon thread blocked in a read (a terminal, a pipe whose writer stays open) never holds up the end of
    the process, as a read in the loop's executor does (``asyncio.run`` waits for its threads), and it holds
    no lock of ``sys.stdin``. Lines are assembled in linear time (pieces joined once per line); a line longer
    than ``max_line_bytes`` is not kept past that: it comes out as a ``LongLine``."""

    def __init__(self, stream: BinaryIO, max_line_bytes: int, *, chunk_bytes: int = 1 << 16,
                 read_ahead: int = 4) -> None:
        self._stream = stream
        self._max = max_line_bytes
        self._chunk_bytes = chunk_bytes
        self._room = threading.Semaphore(read_ahead)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parts: list[bytes] = []  # the pieces of the line being read
        self._partial_bytes = 0
        self._long: LongLine | None = None  # the line being read, once it is too long to keep
        self._done = False
        self.at_end = False  # the stream's end was read (not only a ``stop``)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, name="stdin-reader", daemon=True).start()

    def _pump(self) -> None:
        read: Callable[[int], bytes]
        try:
            read = functools.partial(os.read, self._stream.fileno())
        except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
            read = getattr(self._stream, "read1", self._stream.read)
        while True:
            self._room.acquire()
            try:
                chunk: Any = read(self._chunk_bytes)
            except Exception as exc:  # EIO and the like: raised in the loop, where it is reported
                chunk = exc
            if not self._post(chunk) or not isinstance(chunk, bytes) or not chunk:
                return

    def _post(self, item: Any) -> bool:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody reads any more
            return False
        return True

    def stop(self) -> None:
        """No more lines: ``next_lines`` returns None from now on, at once (the thread may stay blocked in a
        read; it is a daemon and ends with the process)."""
        if not self._done:
            self._done = True
            self._queue.put_nowait(_STOP)

    async def next_lines(self) -> list[bytes | LongLine] | None:
        """The next lines read (at least one), or None at the end of the stream or after ``stop``."""
        while not self._done:
            item = await self._queue.get()
            if item is _STOP:
                break
            self._room.release()
            if isinstance(item, BaseException):
                raise item
            if not item:  # the end of the stream: a last line without its newline is still a line
                self._done = self.at_end = True
                last = self._end_line(b"") if self._parts or self._long is not None else None
                return None if last is None else [last]
            pieces = item.split(b"\n")
            rest = pieces.pop()
            lines = [self._end_line(piece) for piece in pieces]
            self._add(rest)
            if lines:
                return lines
        return None

    def unread_lines(self) -> int:
        """Lines read from the stream and not handed out by ``next_lines`` (a partly read one included)."""
        count = 0
        tail = bool(self._parts) or self._long is not None
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, bytes) and item:
                newlines = item.count(b"\n")
                count += newlines
                tail = not item.endswith(b"\n") if newlines else True
        return count + (1 if tail else 0)

    def _add(self, piece: bytes) -> None:
        """Append a piece to the line being read; past ``max_line_bytes``, only count its bytes."""
        if self._long is not None:
            self._long = LongLine(self._long.head, self._long.size + len(piece))
            return
        if not piece:
            return
        self._parts.append(piece)
        self._partial_bytes += len(piece)
        if self._partial_bytes > self._max:
            head = self._parts[0] if len(self._parts[0]) >= LONG_LINE_HEAD_BYTES else b"".join(self._parts)
            self._long = LongLine(head[:LONG_LINE_HEAD_BYTES], self._partial_bytes)
            self._parts = []
            self._partial_bytes = 0

    def _end_line(self, piece: bytes) -> bytes | LongLine:
        """The line that ``piece`` (what comes before a newline) ends."""
        if self._parts or self._long is not None:
            self._add(piece)
            if self._long is not None:
                done, self._long = self._long, None
                return done
            piece = b"".join(self._parts)
            self._parts = []
            self._partial_bytes = 0
        if len(piece) > self._max:
            return LongLine(piece[:LONG_LINE_HEAD_BYTES], len(piece))
        return piece


class ReportOutput:
    """Delivery reports on stdout; the first broken pipe (the reader went away: ``| head -1``) calls
    ``on_broken`` and makes every later write a no-op, instead of a traceback per record."""

    def __init__(self, out: TextIO, on_broken: Callable[[], None]) -> None:
        self._out = out
        self._on_broken = on_broken
        self.broken = False

    def write(self, text: str) -> None:
        if self.broken:
            return
        try:
            self._out.write(text)
        except BrokenPipeError:
            self._broke()

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self._out.flush()
        except BrokenPipeError:
            self._broke()

    def _broke(self) -> None:
        self.broken = True
        quiet_broken_stdout()
        self._on_broken()


class _Stopped(Exception):
    """What ``_unless`` raises when its event was set first."""


async def _unless(aw: Awaitable[_T], event: asyncio.Event) -> _T:
    """``aw``'s result, unless ``event`` is set first: then ``aw`` is cancelled and _Stopped raised."""
    if event.is_set():
        if asyncio.iscoroutine(aw):
            aw.close()
        raise _Stopped
    task = asyncio.ensure_future(aw)
    stopper = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise _Stopped
    return task.result()


def _handle_sigint(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` on each SIGINT (instead of asyncio.run's cancel of the main task) until the returned
    function is called. Not in the main thread, or not on Unix: nothing is installed."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
    except (NotImplementedError, RuntimeError, ValueError):
        return lambda: None

    def restore() -> None:
        loop.remove_signal_handler(signal.SIGINT)

    return restore


class NoKeySeparatorError(ValueError):
    """A line without the --key-separator: Kafka's console producer refuses it too, rather than send it
    with a null key that the user did not ask for."""

    report_name = "NO_KEY_SEPARATOR"  # for client.errors.error_name


def split_key(line: bytes, separator: bytes | None) -> tuple[bytes | None, bytes]:
    line = line.removesuffix(b"\r")
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        raise NoKeySeparatorError(f"no key separator {separator.decode(errors='replace')!r} in the line")
    return key, value


async def produce_main(args: argparse.Namespace, stdin: BinaryIO, out: TextIO) -> int:
    from client.accumulator import RECORD_OVERHEAD_BYTES
    from client.errors import ErrorCode, MinibrokerError, error_for, error_name, is_definite_failure
    from client.producer import DeliveryFuture, Producer, ProducerConfig, parse_acks

    RECORD_ERRORS = {ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE}

    # one request must fit in the delivery timeout after the linger (Kafka refuses the config otherwise)
    settings: dict[str, Any] = {"request_timeout_ms": max(1, min(args.delivery_timeout_ms - args.linger_ms, 30_000))}
    settings.update(producer_properties(args.producer_property))
    config = ProducerConfig(acks=parse_acks(args.acks), linger_ms=args.linger_ms, batch_size=args.batch_size,
                            max_in_flight_requests_per_connection=args.max_in_flight,
                            delivery_timeout_ms=args.delivery_timeout_ms, max_block_ms=args.max_block_ms,
                            **settings)
    if args.key_separator == "":
        raise CliError("--key-separator must not be empty")
    separator = args.key_separator.encode() if args.key_separator is not None else None
    counts = {"sent": 0, "acked": 0, "failed": 0, "maybe_written": 0}
    first_error: list[str] = []
    producer = Producer(bootstrap_of(args), config)
    # a longer line makes a record larger than the producer takes, whatever its key separator and "\r"; a
    # shorter one is the producer's to judge (a line is kept whole up to at least LONG_LINE_HEAD_BYTES)
    max_line = max(producer.max_record_size - RECORD_OVERHEAD_BYTES + len(separator or b"") + 1,
                   LONG_LINE_HEAD_BYTES)
    reader = LineReader(stdin, max_line)
    stopping = asyncio.Event()  # the first Ctrl-C, or stdout's reader gone: read no more
    stop_waiting = asyncio.Event()  # the second Ctrl-C: stop waiting for the records sent

    def stop() -> None:
        stopping.set()
        reader.stop()

    output = ReportOutput(out, stop)
    interrupts = 0
    topic_error: list[MinibrokerError] = []  # a send refused for the topic, not the record: the end of pump

    def on_sigint() -> None:
        nonlocal interrupts
        interrupts += 1
        stop()
        if interrupts > 1:
            stop_waiting.set()

    def failed(line_no: int, value: bytes, exc: BaseException, *, sent: bool = True,
               line_bytes: int | None = None) -> None:
        """``sent``: False for a line refused before it reached the producer's sender (no key separator, too
        large): never written. Else the error says whether it may have been (a timeout, a lost answer)."""
        counts["failed"] += 1
        maybe = sent and not is_definite_failure(exc)
        counts["maybe_written"] += maybe
        name = error_name(exc)
        if not first_error:
            message = str(exc)
            first_error.append(f"line {line_no}: {message if message.startswith(name) else f'{name}: {message}'}")
        if args.delivery_report:
            doc: dict[str, Any] = {"line": line_no, **data_fields("value", value), "error": name,
                                   "maybe_written": maybe}
            if line_bytes is not None:
                doc["line_bytes"] = line_bytes
            output.write(json.dumps(doc) + "\n")

    def report(line_no: int, value: bytes, fut: DeliveryFuture) -> None:
        exc = fut.exception()
        if exc is not None:
            failed(line_no, value, exc)
            return
        counts["acked"] += 1
        meta = fut.result()
        if args.delivery_report:
            output.write(json.dumps({"line": line_no, **data_fields("value", value), "partition": meta.partition,
                                     "offset": meta.offset}) + "\n")

    async def pump() -> int:
        """Send stdin's lines until its end or ``stopping``; returns how many lines read were not sent."""
        parts = await _unless(producer.partitions_for(args.topic), stopping)
        if args.partition is not None and args.partition not in parts:
            raise CliError(f"topic {args.topic!r} has no partition {args.partition} "
                           f"(partitions 0..{len(parts) - 1})")
        reader.start()
        line_no = 0
        while (lines := await reader.next_lines()) is not None:
            for i, item in enumerate(lines):
                if stopping.is_set():
                    return len(lines) - i
                line_no += 1
                if isinstance(item, LongLine):  # as an oversized record: this line alone fails
                    counts["sent"] += 1
                    too_large = error_for(ErrorCode.MESSAGE_TOO_LARGE, f"a {item.size}-byte line makes a "
                                          f"record larger than {producer.record_limit}")
                    failed(line_no, item.head, too_large, sent=False, line_bytes=item.size)
                    continue
                try:
                    key, value = split_key(item, separator)
                except NoKeySeparatorError as exc:  # this line alone fails, as an oversized one does
                    counts["sent"] += 1
                    failed(line_no, item.removesuffix(b"\r"), exc, sent=False)
                    continue
                try:
                    fut = producer.send_nowait(args.topic, value, key=key, partition=args.partition)
                    while fut is None:  # metadata or buffer.memory: wait, unless interrupted
                        try:
                            await _unless(producer.wait_for_room(args.topic), stopping)
                        except _Stopped:
                            return len(lines) - i
                        fut = producer.send_nowait(args.topic, value, key=key, partition=args.partition)
                except MinibrokerError as exc:
                    if exc.code not in RECORD_ERRORS:
                        # the topic itself failed (deleted meanwhile): read no more; the records already sent
                        # are still waited for and counted in the summary, then this error ends the command
                        topic_error.append(exc)
                        return len(lines) - i
                    # this record alone is refused (too large): report it and go on with the next line, as
                    # Kafka's console producer does (its send hands the error to the record's callback)
                    counts["sent"] += 1
                    failed(line_no, value, exc, sent=False)
                    continue
                fut.add_done_callback(functools.partial(report, line_no, value))
                counts["sent"] += 1
                if fut.index == 0:
                    await asyncio.sleep(0)  # a batch was opened: let the sender run
        return 0

    async def settle() -> None:
        """Wait for the records sent: all of them; after a Ctrl-C (or a broken stdout) at most
        INTERRUPT_WAIT_MS, and not after a second Ctrl-C."""
        with contextlib.suppress(_Stopped):
            if not stopping.is_set():
                await _unless(producer.flush(), stopping)
                return
        outstanding = counts["sent"] - counts["acked"] - counts["failed"]
        if interrupts and outstanding and not stop_waiting.is_set():
            print(f"minibroker: interrupted: waiting up to {INTERRUPT_WAIT_MS // 1000} s for {outstanding} "
                  f"record{'s' if outstanding != 1 else ''} sent (Ctrl-C again to stop waiting)",
                  file=sys.stderr, flush=True)
        if not stop_waiting.is_set():
            with contextlib.suppress(_Stopped, TimeoutError):
                await _unless(asyncio.wait_for(producer.flush(), INTERRUPT_WAIT_MS / 1000), stop_waiting)

    unsent = 0
    restore_sigint = _handle_sigint(on_sigint)
    progress = asyncio.create_task(report_progress(counts, args.progress_interval_ms))
    try:
        await producer.start()
        with contextlib.suppress(_Stopped):
            unsent = await pump()
        # a stop after stdin's end (a report that broke stdout while the last ones were answered) is no stop
        stopped_reading = (stopping.is_set() or bool(topic_error)) and not reader.at_end
        if stopped_reading:
            reader.stop()
            unsent += reader.unread_lines()
        await settle()
        await asyncio.sleep(0)  # let the last done-callbacks run
    finally:
        progress.cancel()
        try:
            # after a stop, records still unanswered fail now (their reports say whether they may be written)
            await producer.close(timeout_ms=0 if stopping.is_set() else None)
            await asyncio.sleep(0)
            output.flush()
        finally:
            restore_sigint()
    not_acked = counts["sent"] - counts["acked"]
    if not_acked:
        maybe = counts["maybe_written"] + (not_acked - counts["failed"])  # (none unanswered after close)
        print(f"minibroker: {not_acked} of {counts['sent']} records were not acknowledged "
              f"({not_acked - maybe} not written, {maybe} maybe written"
              + (f"; first error: {first_error[0]})" if first_error else ")"), file=sys.stderr)
    if interrupts or (output.broken and stopped_reading):
        # `| head` stops reading stdin as Ctrl-C does (the reports' reader is gone); the lines left are not
        # sent, which is said, and is no success (it used to end quietly with status 0)
        print(f"minibroker: {'interrupted' if interrupts else 'stdout closed'}: {_not_sent(unsent)}"
              + ("" if interrupts else " (and stdin was not read to its end)"), file=sys.stderr)
        return 130 if interrupts else 1
    if topic_error:
        print(f"minibroker: {_not_sent(unsent)}" + (" (and stdin was not read to its end)" if stopped_reading else ""),
              file=sys.stderr)
        raise topic_error[0]
    return 1 if not_acked else 0


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
        return json.dumps({"partition": rec.partition, "offset": rec.offset, **data_fields("key", rec.key),
                           **data_fields("value", rec.value), "timestamp": rec.timestamp})
    # a null key or value prints as null, as Kafka's console consumer does
    value = "null" if rec.value is None else rec.value.decode("utf-8", "backslashreplace")
    if print_key:
        key = "null" if rec.key is None else rec.key.decode("utf-8", "backslashreplace")
        return f"{key}{key_separator}{value}"
    return value


async def consume_main(args: argparse.Namespace, out: TextIO) -> int:
    from client.consumer import Consumer, ConsumerConfig
    from client.fetch_state import OffsetReset
    from common.errors import ErrorCode, error_for
    from common.wire import TopicPartition

    # --offset earliest / latest (Kafka's console consumer takes both) pick where to start, as --from-beginning
    # and the default do; a number is sought to in every consumed partition
    start = args.offset if isinstance(args.offset, str) else None
    reset = OffsetReset.EARLIEST if args.from_beginning or start == "earliest" else OffsetReset.LATEST
    consumer = Consumer(bootstrap_of(args), ConsumerConfig(auto_offset_reset=reset,
                                                           fetch_max_wait_ms=args.fetch_max_wait_ms))
    count = 0
    try:
        unknown_after_ms = min(UNKNOWN_TOPIC_GRACE_MS, args.metadata_timeout_ms)
        if args.partition is None:
            tps = await consumer.assign_topic(args.topic, timeout_ms=args.metadata_timeout_ms,
                                              unknown_after_ms=unknown_after_ms)
        else:
            parts = await consumer.metadata.wait_for_topic(args.topic, args.metadata_timeout_ms,
                                                           unknown_after_ms=unknown_after_ms)
            if args.partition not in parts:
                raise CliError(f"topic {args.topic!r} has no partition {args.partition} "
                               f"(partitions 0..{len(parts) - 1})")
            tps = [TopicPartition(args.topic, args.partition)]
            consumer.assign(tps)
        if isinstance(args.offset, int):
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
        # a leader that metadata names but that did not answer (killed, before the controller noticed) or
        # answered an error: what the consumer's last fetch from it said
        errors = consumer.fetch_errors()
        unreachable = [(tp, errors[tp]) for tp in tps if tp in errors and tp not in leaderless]
    except asyncio.CancelledError:  # Ctrl-C (asyncio.run cancels this task): the count still, as Kafka's does
        print(f"consumed {count} messages", file=sys.stderr)
        raise
    finally:
        await consumer.close()
    if leaderless:  # Kafka's consumer warns LEADER_NOT_AVAILABLE in its log; say it where it is seen
        print(f"warning: no leader for partition{'s' if len(leaderless) > 1 else ''} "
              f"{', '.join(f'{tp.topic}-{tp.partition}' for tp in leaderless)}: records there could not be read",
              file=sys.stderr)
    if unreachable:
        print(f"warning: could not fetch from the leader of partition{'s' if len(unreachable) > 1 else ''} "
              f"{', '.join(f'{tp.topic}-{tp.partition} ({error})' for tp, error in unreachable)}: "
              "records there could not be read", file=sys.stderr)
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


def _not_sent(lines: int) -> str:
    return f"{lines} line{'s' if lines != 1 else ''} read from stdin {'was' if lines == 1 else 'were'} not sent"


def start_offset(text: str) -> int | str:
    """--offset: an offset, or 'earliest' / 'latest' as Kafka's console consumer takes them."""
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    if not text.lstrip("+-").isdigit():
        raise argparse.ArgumentTypeError(f"--offset must be an offset (an integer >= 0), 'earliest' or 'latest', "
                                         f"got {text!r}")
    return non_negative("--offset")(text)


# kafka-get-offsets.sh's --time words; a number below -3 (Kafka's -4 earliest-local and -5 latest-tiered are
# for tiered storage, which minibroker has not) is refused
_OFFSET_TIMES = {"earliest": -2, "latest": -1, "max-timestamp": -3}


def offset_time(text: str) -> int:
    """--time: 'earliest' (-2), 'latest' (-1), 'max-timestamp' (-3), or a timestamp in ms."""
    word = _OFFSET_TIMES.get(text.lower())
    if word is not None:
        return word
    try:
        value = int(text) if text.isascii() else None
    except ValueError:
        value = None
    if value is None or not -3 <= value <= 2**63 - 1:
        raise argparse.ArgumentTypeError(f"--time must be a timestamp in ms (>= 0), -1 or 'latest', -2 or "
                                         f"'earliest', -3 or 'max-timestamp', got {text!r}")
    return value


def partition_ids(text: str) -> list[tuple[int, int | None]]:
    """--partitions: comma-separated ids and ranges (``0,2,5-7``; ``5-`` is 5 and up), as kafka-get-offsets.sh
    takes them; -> (first, last) pairs, last None for an open range and first itself for a single id."""
    ranges: list[tuple[int, int | None]] = []
    for item in text.split(","):
        low, dash, high = item.strip().partition("-")
        try:
            first = int_range("--partitions", 0, 2**31 - 1)(low)
            last = int_range("--partitions", 0, 2**31 - 1)(high) if dash and high else (None if dash else first)
        except argparse.ArgumentTypeError:
            first, last = 0, -1
        if last is not None and last < first:
            raise argparse.ArgumentTypeError(f"--partitions must be partition ids and ranges like 0,2,5-7 or 5-, "
                                             f"got {text!r}")
        ranges.append((first, last))
    return ranges


async def get_offsets_main(args: argparse.Namespace, out: TextIO) -> int:
    from client.consumer import Consumer
    from common.wire import TopicPartition

    consumer = Consumer(bootstrap_of(args))
    try:
        parts = await consumer.metadata.wait_for_topic(args.topic, args.metadata_timeout_ms,
                                                       unknown_after_ms=min(UNKNOWN_TOPIC_GRACE_MS,
                                                                            args.metadata_timeout_ms))
        wanted = sorted(parts)
        if args.partitions is not None:
            absent = sorted({first for first, last in args.partitions if first == last and first not in parts})
            if absent:
                raise CliError(f"topic {args.topic!r} has no partition {', '.join(map(str, absent))} "
                               f"(partitions 0..{len(parts) - 1})")
            wanted = [p for p in wanted if any(first <= p and (last is None or p <= last)
                                               for first, last in args.partitions)]
        tps = [TopicPartition(args.topic, p) for p in wanted]
        offsets = await consumer.list_offsets(tps, args.time, timeout_ms=args.timeout_ms) if tps else {}
    finally:
        await consumer.close()
    # as kafka-get-offsets.sh: topic:partition:offset, leaving out a partition with no such record (a time
    # after its last record below the high watermark, or -3 on an empty partition); they are named on stderr
    out.write("".join(f"{tp.topic}:{tp.partition}:{offsets[tp]}\n" for tp in tps if offsets[tp] >= 0))
    out.flush()
    none = [str(tp.partition) for tp in tps if offsets[tp] < 0]
    if none:
        print(f"no offset for that time in partition{'s' if len(none) > 1 else ''} {', '.join(none)}",
              file=sys.stderr)
    return 0


def cmd_get_offsets(args: argparse.Namespace) -> int:
    return run_client(get_offsets_main(args, sys.stdout))


def cmd_consume(args: argparse.Namespace) -> int:
    if args.from_beginning and args.offset is not None:
        raise CliError("use either --from-beginning or --offset, not both")
    return run_client(consume_main(args, sys.stdout))


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("produce", help="produce one record per stdin line",
                       description="Produce one record per line of stdin. Exit status 0 only when every "
                                   "record was acknowledged, 1 when some were not (the summary on stderr counts "
                                   "those not written and those maybe written), 2 for a bad argument (a "
                                   "partition the topic does not have). Ctrl-C stops reading stdin at once, waits "
                                   f"up to {INTERRUPT_WAIT_MS // 1000} s for the records already sent (a second "
                                   "Ctrl-C stops waiting: those still unanswered fail, as PRODUCER_CLOSED), prints "
                                   "their delivery reports, says on stderr how many lines read were not sent, and "
                                   "exits with status 130. When stdout's reader goes away (| head), produce stops "
                                   "reading stdin as Ctrl-C does, waits for the records sent, says on stderr "
                                   "how many lines read were not sent and exits with status 1 (0 if stdin had "
                                   "already been read to its end and every record was acknowledged).")
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
                        '"offset"} or {"line","value","error","maybe_written"}, line being its 1-based line number '
                        'on stdin. maybe_written false: the record was certainly not written (refused before it '
                        'was sent, or refused by the leader before appending); true: it may have been written '
                        '(a timeout, a lost connection or answer, NOT_ENOUGH_REPLICAS_AFTER_APPEND), so a consumer '
                        'may still see it. A value that is not UTF-8 is given as base64 in "value_base64" '
                        'instead of "value". A line too long to be a record is not kept: its report has its '
                        f'first {LONG_LINE_HEAD_BYTES} bytes as value and its length in "line_bytes"')
    p.add_argument("--linger-ms", type=non_negative("--linger-ms"), default=5, help="linger.ms (default 5)")
    p.add_argument("--batch-size", type=positive("--batch-size"), default=16_384,
                   help="batch.size in bytes (default 16384)")
    p.add_argument("--max-in-flight", type=positive("--max-in-flight"), default=5,
                   help="max.in.flight.requests.per.connection (default 5)")
    p.add_argument("--delivery-timeout-ms", type=positive("--delivery-timeout-ms"), default=120_000,
                   help="delivery.timeout.ms: how long a record may wait for its acknowledgement, retries "
                        "included (default 120000); each request's request.timeout.ms is the smaller of this "
                        "less --linger-ms and 30000")
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
                        "fail. request.timeout.ms defaults to the smaller of --delivery-timeout-ms less --linger-ms "
                        "and 30000")
    p.set_defaults(func=cmd_produce)

    c = sub.add_parser("consume", help="print records of a topic",
                       description="Print records; stops after --max-messages or --timeout-ms without new data. "
                                   "At the end, a warning on stderr names the partitions that could not be read "
                                   "(no leader, or a leader that did not answer).")
    c.add_argument("topic", metavar="TOPIC", help="topic to consume")
    add_bootstrap(c)
    c.add_argument("--partition", "-p", type=non_negative("--partition"), default=None,
                   help="only this partition (default: all)")
    start = c.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the log start (default: the end)")
    start.add_argument("--offset", type=start_offset, default=None,
                       help="start at this offset in every consumed partition (where it is past a partition's "
                            "end or before its start, that partition starts at its end, as Kafka's console "
                            "consumer does), or 'earliest' (as --from-beginning) or 'latest' (the default)")
    c.add_argument("--max-messages", type=positive("--max-messages"), default=None,
                   help="stop after this many records (default: no limit)")
    c.add_argument("--timeout-ms", type=positive("--timeout-ms"), default=None,
                   help="stop after this long without new data (default: never)")
    c.add_argument("--format", choices=["text", "json"], default="text",
                   help='text: the value (null for a null value; bytes that are not UTF-8 as \\xNN escapes); '
                        'json: {"partition","offset","key","value","timestamp"} per line, a null key or value as '
                        'null, and a key or value that is not UTF-8 as base64 in "key_base64" / "value_base64" '
                        'instead of "key" / "value"')
    c.add_argument("--print-key", action="store_true", help="text format: key<TAB>value (null for a null key)")
    c.add_argument("--fetch-max-wait-ms", type=non_negative("--fetch-max-wait-ms"), default=500,
                   help="fetch.max.wait.ms (default 500)")
    c.add_argument("--metadata-timeout-ms", type=positive("--metadata-timeout-ms"), default=10_000,
                   help="how long to wait for the topic and its partition leaders (default 10000); a topic the "
                        f"brokers keep saying does not exist for {UNKNOWN_TOPIC_GRACE_MS} ms is reported then "
                        "(UNKNOWN_TOPIC_OR_PARTITION)")
    c.set_defaults(func=cmd_consume)

    g = sub.add_parser("get-offsets", help="print partitions' offsets for a time (kafka-get-offsets.sh)",
                       description="Print topic:partition:offset for each partition of a topic: its end (the high "
                                   "watermark), its start, the record with the largest timestamp, or the first "
                                   "record at or after a time, as Kafka's kafka-get-offsets.sh. A partition "
                                   "with no such record is left out of the output and named on stderr.")
    g.add_argument("topic", metavar="TOPIC", help="the topic")
    add_bootstrap(g)
    g.add_argument("--time", type=offset_time, default=-1,
                   help="latest or -1 (the default: the offset after the last committed record), earliest or -2 "
                        "(the log start), max-timestamp or -3 (the record with the largest timestamp), or a "
                        "timestamp in ms since the epoch (the first record at or after it)")
    g.add_argument("--partitions", type=partition_ids, default=None, metavar="LIST",
                   help="only these partitions: ids and ranges, e.g. 0,2,5-7 or 5- (default: all)")
    g.add_argument("--metadata-timeout-ms", type=positive("--metadata-timeout-ms"), default=10_000,
                   help="how long to wait for the topic and its partition leaders (default 10000)")
    g.add_argument("--timeout-ms", type=positive("--timeout-ms"), default=30_000,
                   help="how long to keep asking partitions' leaders, through leader changes (default 30000)")
    g.set_defaults(func=cmd_get_offsets)
