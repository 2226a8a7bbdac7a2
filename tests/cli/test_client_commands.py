"""``minibroker produce`` / ``consume`` / ``perf`` as real subprocesses against fake brokers (real HTTP)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from common.wire import TopicPartition
from tests.cli.helpers import run
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


async def test_consume_text_from_an_offset_on_one_partition_stops_when_idle(fake: FakeCluster) -> None:
    status, _, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "1",
                               stdin=b"a\nb\nc\nd\n")
    assert status == 0, err
    status, out, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "1",
                                 "--offset", "2", "--timeout-ms", "500")
    assert status == 0, err
    assert out.splitlines() == ["c", "d"]
    assert "consumed 2 messages" in err


async def test_a_line_without_the_key_separator_fails_alone(fake: FakeCluster) -> None:
    # Kafka's console producer refuses it ("No key separator found"); it used to go with a null key
    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "-K", ":", "--partition", "0",
                                 "--delivery-report", stdin=b"k1:a\nno separator\nk2:b\n")
    assert status == 1 and "Traceback" not in err
    reports = [json.loads(line) for line in out.splitlines()]
    assert {"line": 2, "value": "no separator", "error": "NO_KEY_SEPARATOR"} in reports
    assert sorted(r["value"] for r in reports if "offset" in r) == ["a", "b"]
    assert "1 of 3 records were not acknowledged (first error: line 2: NO_KEY_SEPARATOR: no key separator ':'" in err


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

    fake.errors[TopicPartition(TOPIC, 0)].append(ErrorCode.MESSAGE_TOO_LARGE)
    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                                 "--delivery-report", "--linger-ms", "50", stdin=b"x\ny\n")
    assert status == 1
    assert [json.loads(line) for line in out.splitlines()] == [
        {"line": 1, "value": "x", "error": "MESSAGE_TOO_LARGE"},
        {"line": 2, "value": "y", "error": "MESSAGE_TOO_LARGE"}]
    assert "2 of 2 records were not acknowledged" in err and "Traceback" not in err


async def test_an_oversized_line_fails_alone_and_the_next_lines_are_still_sent(fake: FakeCluster) -> None:
    # as Kafka's console producer: the too-large record gets its error, the lines around it are delivered
    big = b"z" * (1024 * 1024 + 10)
    status, out, err = await run("produce", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "0",
                                 "--delivery-report", stdin=b"first\n" + big + b"\nlast\n")
    assert status == 1 and "Traceback" not in err
    reports = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["value"][:5] for r in reports) == ["first", "last", "zzzzz"]
    assert [r["error"] for r in reports if "error" in r] == ["MESSAGE_TOO_LARGE"]
    assert "1 of 3 records were not acknowledged (first error: line 2: MESSAGE_TOO_LARGE" in err
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
    assert status != 0 and "UNKNOWN_TOPIC_OR_PARTITION" in err and "Traceback" not in err
    status, _, err = await run("consume", TOPIC, "--bootstrap", fake.bootstrap, "--partition", "7",
                               "--timeout-ms", "100")
    assert status != 0 and "no partition 7" in err


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
