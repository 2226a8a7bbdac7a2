"""``minibroker produce`` / ``consume`` / ``perf`` as real subprocesses against fake brokers (real HTTP)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import signal
import sys
from collections.abc import AsyncIterator

import pytest

from common.errors import ErrorCode
from common.wire import TopicPartition
from tests.cli.helpers import minibroker, run
from tests.client.fake_broker import FakeCluster, running

TOPIC = "lines"


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    async with running(TOPIC, 2) as cluster:
        yield cluster


async def test_produce_with_keys_and_delivery_reports_then_consume_json(fake: FakeCluster) -> None:
    lines = b"".join(f"k{i % 3}:value {i}\n".encode() for i in range(50))
    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--key-separator", ":",
                                 "--delivery-report", stdin=lines)
    assert status == 0, err
    reports = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["value"] for r in reports) == sorted(f"value {i}" for i in range(50))
    assert all(r["value"] == f"value {r['line'] - 1}" for r in reports)  # each report names its stdin line
    assert all("offset" in r and "error" not in r for r in reports)
    status, out, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--from-beginning",
                                 "--format", "json", "--max-messages", "50", "--timeout-ms", "5000")
    assert status == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 50
    assert set(records[0]) == {"partition", "offset", "key", "value", "timestamp"}
    for r in records:
        i = int(r["value"].split()[1])
        assert r["key"] == f"k{i % 3}"
        assert {"partition": r["partition"], "offset": r["offset"]} in [
            {"partition": x["partition"], "offset": x["offset"]} for x in reports if x["value"] == r["value"]]


async def produce_to_partition_1(fake: FakeCluster, lines: bytes) -> None:
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "1", stdin=lines)
    assert status == 0, err


async def consume_partition_1_from(fake: FakeCluster, offset: str) -> tuple[str, str]:
    """``consume --partition 1 --offset OFFSET`` until idle for 500 ms: its stdout and stderr (status 0)."""
    status, out, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "1",
                                 "--offset", offset, "--timeout-ms", "500")
    assert status == 0, err
    return out, err


async def test_consume_text_from_an_offset_on_one_partition_stops_when_idle(fake: FakeCluster) -> None:
    await produce_to_partition_1(fake, b"a\nb\nc\nd\n")
    out, err = await consume_partition_1_from(fake, "2")
    assert out.splitlines() == ["c", "d"]
    assert "consumed 2 messages" in err


async def test_consume_offset_earliest_starts_at_the_log_start_and_latest_at_the_end(fake: FakeCluster) -> None:
    # Kafka's console consumer takes --offset earliest / latest besides a number
    await produce_to_partition_1(fake, b"a\nb\n")
    out, _ = await consume_partition_1_from(fake, "earliest")
    assert out.splitlines() == ["a", "b"]
    out, err = await consume_partition_1_from(fake, "LATEST")
    assert out == "" and "consumed 0 messages" in err


async def test_a_line_without_the_key_separator_fails_alone(fake: FakeCluster) -> None:
    # Kafka's console producer refuses it ("No key separator found"); it used to go with a null key
    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "-K", ":", "--partition", "0",
                                 "--delivery-report", stdin=b"k1:a\nno separator\nk2:b\n")
    assert status == 1 and "Traceback" not in err
    reports = [json.loads(line) for line in out.splitlines()]
    assert {"line": 2, "value": "no separator", "error": "NO_KEY_SEPARATOR", "maybe_written": False} in reports
    assert sorted(r["value"] for r in reports if "offset" in r) == ["a", "b"]
    assert ("1 of 3 records were not acknowledged (1 not written, 0 maybe written; first error: line 2: "
            "NO_KEY_SEPARATOR: no key separator ':'") in err


async def test_consume_says_which_partitions_had_no_leader(fake: FakeCluster) -> None:
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0", stdin=b"a\n")
    assert status == 0, err
    fake.move_leader(TopicPartition(TOPIC, 1), -1)
    status, out, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--from-beginning",
                                 "--metadata-timeout-ms", "300", "--timeout-ms", "500")
    assert status == 0, err
    assert out.splitlines() == ["a"]
    assert f"warning: no leader for partition {TOPIC}-1: records there could not be read" in err
    assert "consumed 1 messages" in err


async def test_produce_reports_failures_and_exits_non_zero(fake: FakeCluster) -> None:
    from common.errors import ErrorCode

    # the batch of both, then each half once split (Kafka's producer splits a batch refused as too large)
    fake.errors[TopicPartition(TOPIC, 0)].extend([ErrorCode.MESSAGE_TOO_LARGE] * 3)
    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                                 "--delivery-report", "--linger-ms", "50", stdin=b"x\ny\n")
    assert status == 1
    # the leader refused them before appending: certainly not written
    assert [json.loads(line) for line in out.splitlines()] == [
        {"line": 1, "value": "x", "error": "MESSAGE_TOO_LARGE", "maybe_written": False},
        {"line": 2, "value": "y", "error": "MESSAGE_TOO_LARGE", "maybe_written": False}]
    assert "2 of 2 records were not acknowledged (2 not written, 0 maybe written" in err and "Traceback" not in err


async def test_an_oversized_line_fails_alone_and_the_next_lines_are_still_sent(fake: FakeCluster) -> None:
    # as Kafka's console producer: the too-large record gets its error, the lines around it are delivered
    big = b"z" * (1024 * 1024 + 10)
    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                                 "--delivery-report", stdin=b"first\n" + big + b"\nlast\n")
    assert status == 1 and "Traceback" not in err
    reports = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["value"][:5] for r in reports) == ["first", "last", "zzzzz"]
    assert [r["error"] for r in reports if "error" in r] == ["MESSAGE_TOO_LARGE"]
    assert "1 of 3 records were not acknowledged (1 not written, 0 maybe written; first error: line 2: " \
           "MESSAGE_TOO_LARGE" in err
    status, out, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                                 "--offset", "0", "--timeout-ms", "500")
    assert status == 0, err
    assert out.splitlines() == ["first", "last"]


async def test_produce_is_idempotent_by_default_and_producer_properties_turn_it_off(fake: FakeCluster) -> None:
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0", stdin=b"a\n")
    assert status == 0, err
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                               "--producer-property", "enable.idempotence=false", "--producer-property", "retries=3",
                               stdin=b"b\n")
    assert status == 0, err
    pids = [h.producer_id for h in fake.headers(TopicPartition(TOPIC, 0))]
    assert pids[0] >= 0 and pids[1] == -1 and fake.init_requests == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--acks", "1", "--producer-property", "enable.idempotence=true"], "enable.idempotence=true needs acks=all"),
    (["--producer-property", "enable.idempotence=maybe"], "enable.idempotence: expected true or false"),
    (["--producer-property", "linger.ms=3"], "linger.ms: use --linger-ms"),
    (["--producer-property", "compression.type=zstd"], "unknown producer setting 'compression.type'"),
    (["--producer-property", "retries"], "expected key=value"),
    (["--producer-property", "retries=-1"], "retries must be an int in [0, "),
])
async def test_bad_producer_properties_are_one_line_errors(fake: FakeCluster, argv: list[str], message: str) -> None:
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, *argv, stdin=b"x\n")
    assert status != 0 and message in err and "Traceback" not in err, err
    assert fake.produce_requests == 0


async def test_unknown_topic_and_partition_are_one_line_errors(fake: FakeCluster) -> None:
    status, _, err = await run("produce", "nope", "--bootstrap", fake.bootstrap, "--max-block-ms", "300",
                               stdin=b"x\n")
    assert status == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err and "Traceback" not in err
    # a partition the topic does not have is a bad argument for both commands: status 2 (produce said 1)
    status, _, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "7",
                               "--timeout-ms", "100")
    assert status == 2 and f"topic '{TOPIC}' has no partition 7 (partitions 0..1)" in err, err
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "7", stdin=b"x\n")
    assert status == 2 and f"topic '{TOPIC}' has no partition 7 (partitions 0..1)" in err, err
    assert "Traceback" not in err and fake.produce_requests == 0


@pytest.mark.parametrize("partition", [[], ["--partition", "0"]])
async def test_consume_reports_a_topic_the_brokers_say_does_not_exist_without_waiting_out_the_timeout(
        fake: FakeCluster, partition: list[str]) -> None:
    # it once waited the whole --metadata-timeout-ms (10 s by default): here 10 minutes, far past run's 30 s
    status, out, err = await run("consume", "nosuch", "--bootstrap", fake.bootstrap, *partition,
                                 "--metadata-timeout-ms", "600000", "--timeout-ms", "1000", timeout_s=30)
    assert status == 1 and out == ""
    assert "UNKNOWN_TOPIC_OR_PARTITION: topic 'nosuch' does not exist" in err and "Traceback" not in err


async def test_consume_still_finds_a_topic_created_just_after_the_brokers_said_it_did_not_exist(
        fake: FakeCluster) -> None:
    # a topic just created reaches the brokers a moment after the controller answered: a first "does not
    # exist" answer is not the end
    consume = asyncio.create_task(run("consume", "late", "--bootstrap", fake.bootstrap, "--from-beginning",
                                      "--max-messages", "1", "--timeout-ms", "10000"))
    for _ in range(300):
        if fake.metadata_requests["late"] or consume.done():
            break
        await asyncio.sleep(0.02)
    assert fake.metadata_requests["late"], "consume never asked for the topic"
    fake.create_topic("late", 1)
    status, _, err = await run("produce", "late", "--bootstrap", fake.bootstrap, stdin=b"x\n")
    assert status == 0, err
    status, out, err = await consume
    assert status == 0, err
    assert out.splitlines() == ["x"]


async def test_perf_produce_and_consume_print_kafka_style_figures(fake: FakeCluster) -> None:
    status, out, err = await run("perf", "produce", "--topic", TOPIC, "--num-records", "3000", "--record-size",
                                 "100", "--bootstrap", fake.bootstrap, "--reporting-interval", "100")
    assert status == 0, err
    final = out.splitlines()[-1]
    assert final.startswith("3000 records sent,") and "records/sec" in final and "99.9th" in final
    status, out, err = await run("perf", "consume", "--topic", TOPIC, "--num-records", "3000", "--bootstrap",
                                 fake.bootstrap)
    assert status == 0, err
    assert "data.consumed.in.nMsg" in out and "3000 records consumed" in out


async def test_perf_e2e_reports_latency_percentiles(fake: FakeCluster) -> None:
    status, out, err = await run("perf", "e2e", "--topic", TOPIC, "--num-records", "200", "--throughput", "400",
                                 "--bootstrap", fake.bootstrap, "--fetch-max-wait-ms", "100")
    assert status == 0, err
    assert "200 of 200 records received" in out and "99th" in out


# -- produce: Ctrl-C, a closed stdout, long lines, delivery reports ------------------------------------------

@contextlib.asynccontextmanager
async def producing(fake: FakeCluster, *argv: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``produce`` with stdin a pipe that this test keeps open (as ``tail -f x | minibroker produce``); closed,
    and the process killed if it has not ended, when the block ends."""
    proc = await asyncio.create_subprocess_exec(
        *minibroker(), "produce", TOPIC, "--bootstrap", fake.bootstrap, *argv, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        yield proc
    finally:
        proc.stdin.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def a_and_b_delivered(proc: asyncio.subprocess.Process) -> None:
    """Write lines a and b and read their two delivery reports (each with an offset)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"a\nb\n")
    await proc.stdin.drain()
    reports = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 20)) for _ in range(2)]
    assert sorted((r["line"], r["value"]) for r in reports) == [(1, "a"), (2, "b")]
    assert all(r["offset"] >= 0 for r in reports)


async def stderr_line(proc: asyncio.subprocess.Process, prefix: str, seen: list[str]) -> str:
    """The next stderr line starting with ``prefix`` (the lines read meanwhile go to ``seen``)."""
    assert proc.stderr is not None
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        assert line, f"stderr ended before a line starting with {prefix!r}: {seen}"
        seen.append(line)
        if line.startswith(prefix):
            return line


async def finish(proc: asyncio.subprocess.Process) -> tuple[int, str, str]:
    """Wait (at most 20 s) for ``proc`` to exit by itself, its stdin still open; its status, stdout, stderr."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err, status = await asyncio.wait_for(asyncio.gather(proc.stdout.read(), proc.stderr.read(), proc.wait()),
                                              20)
    return status, out.decode(), err.decode()


async def test_ctrl_c_ends_produce_reading_a_pipe_whose_writer_stays_open(fake: FakeCluster) -> None:
    # the read used to run in asyncio's executor thread, which asyncio.run waits for at exit: Ctrl-C hung
    # until the next line or the end of stdin
    async with producing(fake, "--delivery-report") as proc:
        await a_and_b_delivered(proc)
        proc.send_signal(signal.SIGINT)
        status, out, err = await finish(proc)
    assert status == 130, err
    assert out == ""
    assert err.strip().splitlines()[-1] == "minibroker: interrupted: 0 lines read from stdin were not sent"
    assert "Traceback" not in err and "not acknowledged" not in err


async def test_ctrl_c_ends_consume_with_the_count_of_records_consumed(fake: FakeCluster) -> None:
    # as Kafka's console consumer ("Processed a total of N messages"); Ctrl-C used to end it without a count
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                               stdin=b"a\nb\n")
    assert status == 0, err
    proc = await asyncio.create_subprocess_exec(
        *minibroker(), "consume", TOPIC, "--bootstrap", fake.bootstrap, "--from-beginning",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert [await asyncio.wait_for(proc.stdout.readline(), 20) for _ in range(2)] == [b"a\n", b"b\n"]
        proc.send_signal(signal.SIGINT)
        status, out, err = await finish(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert status == 130 and out == ""
    assert err.strip().splitlines()[-1] == "consumed 2 messages" and "Traceback" not in err


async def test_produce_names_the_first_error_once(fake: FakeCluster) -> None:
    # "first error: line 1: INVALID_TOPIC_EXCEPTION: INVALID_TOPIC_EXCEPTION" once
    fake.errors[TopicPartition(TOPIC, 0)].append(ErrorCode.INVALID_TOPIC_EXCEPTION)
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0", stdin=b"a\n")
    assert status == 1
    assert "; first error: line 1: INVALID_TOPIC_EXCEPTION)" in err, err


async def test_ctrl_c_while_produce_waits_counts_the_lines_not_sent_and_a_second_stops_waiting(
        fake: FakeCluster) -> None:
    # partition 0 has no leader: its records wait in the producer, and buffer.memory=60 takes 5 of them (14
    # bytes each with the per-record overhead); the sixth send waits for room
    fake.move_leader(TopicPartition(TOPIC, 0), -1)
    seen: list[str] = []
    async with producing(fake, "--partition", "0", "--delivery-report", "--producer-property", "buffer.memory=60",
                         "--max-block-ms", "60000", "--progress-interval-ms", "50") as proc:
        assert proc.stdin is not None
        proc.stdin.write(b"".join(b"l%d\n" % i for i in range(1, 11)))
        await proc.stdin.drain()
        await stderr_line(proc, "minibroker: 5 sent, 0 acknowledged", seen)
        proc.send_signal(signal.SIGINT)
        line = await stderr_line(proc, "minibroker: interrupted: waiting", seen)
        assert "for 5 records sent (Ctrl-C again to stop waiting)" in line
        proc.send_signal(signal.SIGINT)
        status, out, err = await finish(proc)
    err = "".join(seen) + err
    assert status == 130, err
    # never sent (no leader): PRODUCER_CLOSED, certainly not written; not a Python class name
    assert sorted(json.loads(line)["line"] for line in out.splitlines()) == [1, 2, 3, 4, 5]
    for line in out.splitlines():
        report = json.loads(line)
        assert report == {"line": report["line"], "value": f"l{report['line']}", "error": "PRODUCER_CLOSED",
                          "maybe_written": False}
    assert "minibroker: 5 of 5 records were not acknowledged (5 not written, 0 maybe written" in err
    assert err.strip().splitlines()[-1] == "minibroker: interrupted: 5 lines read from stdin were not sent"
    assert "Traceback" not in err


async def test_delivery_reports_tell_maybe_written_failures_from_certain_ones(fake: FakeCluster) -> None:
    # NOT_ENOUGH_REPLICAS_AFTER_APPEND: the leader appended, then could not replicate: the record may be read
    fake.errors[TopicPartition(TOPIC, 0)].append(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
    big = b"z" * (1024 * 1024 + 10)
    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                                 "--delivery-report", "--producer-property", "enable.idempotence=false",
                                 "--producer-property", "retries=0", stdin=b"x\n" + big + b"\n")
    assert status == 1, err
    reports = sorted((json.loads(line) for line in out.splitlines()), key=lambda r: r["line"])
    assert reports == [
        {"line": 1, "value": "x", "error": "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "maybe_written": True},
        {"line": 2, "value": "z" * 64, "error": "MESSAGE_TOO_LARGE", "maybe_written": False, "line_bytes": len(big)}]
    assert "minibroker: 2 of 2 records were not acknowledged (1 not written, 1 maybe written; first error: " \
           f"line 2: MESSAGE_TOO_LARGE: a {len(big)}-byte line makes a record larger than max.request.size=" in err


async def test_produce_stops_when_its_delivery_reports_reader_goes_away_and_says_what_was_not_sent(
        fake: FakeCluster) -> None:
    # `produce --delivery-report | head -1` once wrote a BrokenPipeError traceback per record, then ended
    # quietly with status 0 though the rest of stdin was never sent. Here stdin never ends: lines keep coming
    # (at most 2,000 a second for 60 s) until produce stops reading and exits.
    script = '"$@" | head -1; echo "status ${PIPESTATUS[0]}" >&2'
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", script, "bash", *minibroker(), "produce", TOPIC, "--bootstrap", fake.bootstrap,
        "--delivery-report", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def feed(stdin: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):  # produce has exited: its stdin is closed
            for n in range(6_000):
                stdin.write(b"%d\n" % n * 20)
                await stdin.drain()
                await asyncio.sleep(0.01)
    feeding = asyncio.ensure_future(feed(proc.stdin))
    try:
        out, err = await asyncio.wait_for(asyncio.gather(proc.stdout.read(), proc.stderr.read()), 60)
        await proc.wait()
    finally:
        feeding.cancel()
        proc.stdin.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    *said, status = err.decode().splitlines()
    assert status == "status 1", err
    [unsent] = [line for line in said if line.startswith("minibroker: stdout closed: ")]
    assert unsent.endswith("not sent (and stdin was not read to its end)"), unsent
    (report,) = out.decode().splitlines()
    assert set(json.loads(report)) == {"line", "value", "partition", "offset"}
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", script, "bash", *minibroker(), "consume", TOPIC, "--bootstrap", fake.bootstrap,
        "--from-beginning", "--timeout-ms", "1000", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # quiet (or, when its last write still went out whole, its usual count), status 0, no traceback
    assert err.decode().splitlines()[-1] == "status 0" and "Traceback" not in err.decode()
    assert len(out.decode().splitlines()) == 1


async def test_a_huge_line_is_not_kept_whole(fake: FakeCluster) -> None:
    # a line was assembled by concatenating each chunk to all that came before (quadratic; a 40 MB line took
    # seconds) and kept whole; now only its first bytes are kept. Measured: the peak memory of the produce
    # process, with a 48 MB line and without, through a wrapper that reports its child's ru_maxrss
    wrapper = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:]); "
               "print('maxrss', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")

    async def produce(stdin: bytes) -> tuple[list[str], int]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", wrapper, *minibroker(), "produce", TOPIC, "--bootstrap", fake.bootstrap,
            "--partition", "1", "--delivery-report", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(stdin), 120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        *reports, last = out.decode().splitlines()
        assert last.startswith("maxrss ")
        return reports, int(last.split()[1])  # KiB

    size = 48 * 1024 * 1024
    _, small_kib = await produce(b"first\nzz\nlast\n")
    reports, big_kib = await produce(b"first\n" + b"z" * size + b"\nlast\n")
    by_line = {r["line"]: r for r in map(json.loads, reports)}
    assert by_line[2] == {"line": 2, "value": "z" * 64, "error": "MESSAGE_TOO_LARGE", "maybe_written": False,
                          "line_bytes": size}
    assert by_line[1]["value"] == "first" and by_line[3]["value"] == "last" and "offset" in by_line[3]
    assert big_kib - small_kib < size // 1024 // 4, (small_kib, big_kib)


async def test_buffer_memory_bounds_a_record_as_max_request_size_does(fake: FakeCluster) -> None:
    # Kafka refuses a record larger than buffer.memory (RecordTooLargeException): it could never be buffered
    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--delivery-report",
                                 "--producer-property", "buffer.memory=10", stdin=b"a\n")
    assert status == 1
    assert [json.loads(line) for line in out.splitlines()] == [
        {"line": 1, "value": "a", "error": "MESSAGE_TOO_LARGE", "maybe_written": False}]
    assert "a 13-byte record is larger than the whole buffer.memory=10" in err
    assert fake.produce_requests == 0


# -- consume: unreachable leaders, output formats ----------------------------------------------------------

async def test_consume_warns_about_partitions_whose_leader_does_not_answer(fake: FakeCluster) -> None:
    # partition 1's leader (broker 2) was killed and the metadata still names it (the controller has not
    # noticed yet): consume used to say "consumed 1 messages" and nothing else
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0", stdin=b"a\n")
    assert status == 0, err
    await fake.kill_broker(2)
    status, out, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--from-beginning",
                                 "--timeout-ms", "1000")
    assert status == 0, err
    assert out.splitlines() == ["a"]
    warning = next(line for line in err.splitlines() if line.startswith("warning:"))
    assert warning.startswith(f"warning: could not fetch from the leader of partition {TOPIC}-1 (")
    assert fake.addresses[2] in warning and warning.endswith("): records there could not be read")
    assert f"{TOPIC}-0" not in warning
    assert err.splitlines()[-1] == "consumed 1 messages"


async def test_json_output_gives_values_that_are_not_utf8_as_base64_and_text_prints_null(
        fake: FakeCluster) -> None:
    from client.producer import Producer

    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                                 "--delivery-report", stdin=b"\xff\xfe\n\\xff\\xfe\n")
    assert status == 0, err
    # the bytes ff fe and the text \xff\xfe were both shown as "\\xff\\xfe"
    assert [{k: v for k, v in json.loads(line).items() if k not in ("partition", "offset")}
            for line in sorted(out.splitlines())] == [{"line": 1, "value_base64": "//4="},
                                                      {"line": 2, "value": "\\xff\\xfe"}]
    async with Producer(fake.bootstrap) as producer:
        await producer.send_and_wait(TOPIC, None, key=b"k", partition=0)
    status, out, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                                 "--from-beginning", "--format", "json", "--timeout-ms", "500")
    assert status == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [{k: v for k, v in r.items() if k not in ("partition", "offset", "timestamp")} for r in records] == [
        {"key": None, "value_base64": "//4="}, {"key": None, "value": "\\xff\\xfe"}, {"key": "k", "value": None}]
    assert base64.b64decode(records[0]["value_base64"]) == b"\xff\xfe"
    # text: a null key or value prints as null, as Kafka's console consumer
    status, out, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                                 "--from-beginning", "--print-key", "--timeout-ms", "500")
    assert status == 0, err
    assert out.splitlines() == ["null\t\\xff\\xfe", "null\t\\xff\\xfe", "k\tnull"]


async def test_perf_consume_stops_at_num_records(fake: FakeCluster) -> None:
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap,
                               stdin=b"".join(b"%d\n" % i for i in range(50)))
    assert status == 0, err
    status, out, err = await run("perf", "consume", "--topic", TOPIC, "--num-records", "10", "--bootstrap",
                                 fake.bootstrap)
    assert status == 0, err
    header, figures, summary = out.splitlines()[-3:]
    assert dict(zip(header.split(", "), figures.split(", "), strict=True))["data.consumed.in.nMsg"] == "10"
    assert summary.startswith("10 records consumed in")


async def test_the_line_reader_tells_the_end_of_stdin_from_a_stop() -> None:
    # produce decides by this whether a broken stdout stopped it before the end of stdin (lines unsent, status
    # 1) or came after it (every line sent): a stop makes next_lines answer None too, so None alone cannot say
    from cli.clients import LineReader

    whole = LineReader(io.BytesIO(b"a\nb\n"), 1 << 10)
    whole.start()
    while await whole.next_lines() is not None:
        pass
    assert whole.at_end
    r, w = os.pipe()  # a writer that stays open: no end
    try:
        os.write(w, b"a\n")
        with open(r, "rb", closefd=False) as stream:
            stopped = LineReader(stream, 1 << 10)
            stopped.start()
            assert await stopped.next_lines() == [b"a"]
            stopped.stop()
            assert await stopped.next_lines() is None and not stopped.at_end
    finally:
        os.close(w)  # the reader thread sees the end and stops; then its descriptor goes
        await asyncio.sleep(0.1)
        os.close(r)


async def test_a_topic_deleted_while_producing_still_ends_with_the_summary(fake: FakeCluster) -> None:
    # Found by review: the send that found the topic gone raised through the command, which then ended
    # without its summary: the lines read and never sent were not counted, the records in flight not reported
    async with producing(fake, "--delivery-report", "--delivery-timeout-ms", "3000", "--max-block-ms", "1000") as proc:
        assert proc.stdin is not None
        await a_and_b_delivered(proc)
        for tp in [tp for tp in fake.partitions if tp.topic == TOPIC]:
            del fake.partitions[tp]
        for i in range(20):  # until the producer has learnt the topic is gone (bounded: 20 x 0.3 s)
            if proc.returncode is not None:
                break
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(f"after {i}\n".encode())
                await proc.stdin.drain()
            await asyncio.sleep(0.3)
        status, out, err = await finish(proc)
    assert status == 1 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("minibroker: error: UNKNOWN_TOPIC_OR_PARTITION"), err
    assert any(" records were not acknowledged " in line for line in lines), err
    assert any(line.startswith("minibroker: ") and " read from stdin " in line and "not sent" in line
               for line in lines), err
    reported = [json.loads(line) for line in out.splitlines()]  # after the first two, read above
    assert reported and all("error" in r for r in reported), out  # the lines sent after the deletion
