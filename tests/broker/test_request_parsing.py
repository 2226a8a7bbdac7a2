"""Produce request parsing: the fast path for well-formed bodies agrees with the general parser, and
bad bodies still get the general parser's error; the broker's hot-path metrics keep Prometheus semantics."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import requests as rq
from broker.metrics import LATENCY_BUCKETS, BrokerMetrics
from common.wire import MAX_INT32, BadRequest, TopicPartition, decode, encode

_ANY = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.text(max_size=3), st.binary(max_size=3),
                 st.lists(st.none(), max_size=1), st.dictionaries(st.text(max_size=2), st.none(), max_size=1))
_INT = st.one_of(st.integers(-3, 3), st.sampled_from([-MAX_INT32 - 1, -MAX_INT32, MAX_INT32, MAX_INT32 + 1,
                                                      rq.MAX_TIMEOUT_MS, rq.MAX_TIMEOUT_MS + 1]))


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a well-typed value (so that whole bodies are often well-formed), sometimes anything else."""
    return st.integers(0, 11).flatmap(lambda i: value if i else _ANY)


_PARTITION = st.fixed_dictionaries({"partition": _maybe(st.integers(-1, 2)), "records": _maybe(st.binary(max_size=4))})
_TOPIC = st.fixed_dictionaries({"topic": _maybe(st.sampled_from(["a", "b"])),
                                "partitions": _maybe(st.lists(_maybe(_PARTITION), max_size=3))})
_BODY = st.fixed_dictionaries({"acks": _maybe(_INT), "topics": _maybe(st.lists(_maybe(_TOPIC), max_size=3))},
                              optional={"timeout_ms": _maybe(_INT)})


def _outcome(parse: Any, body: dict[str, Any]) -> Any:
    try:
        return parse(body)
    except BadRequest as exc:
        return f"BadRequest: {exc}"


@settings(max_examples=600, deadline=None)
@given(_BODY)
def test_fast_produce_parser_agrees_with_the_general_one(body: dict[str, Any]) -> None:
    body = decode(encode(body))  # as the broker sees it: msgpack's types
    general = _outcome(rq._parse_produce_general, body)
    fast = rq._parse_produce_fast(body)
    if fast is not None:
        assert fast == general
    assert _outcome(rq.parse_produce, body) == general


def test_fast_produce_parser_takes_the_common_body_and_leaves_bad_ones() -> None:
    body = {"acks": -1, "timeout_ms": 500,
            "topics": [{"topic": "t", "partitions": [{"partition": 0, "records": b"x"},
                                                     {"partition": 1, "records": b"y"}]}]}
    assert rq._parse_produce_fast(body) == rq.ProduceRequest(
        -1, 500, {TopicPartition("t", 0): b"x", TopicPartition("t", 1): b"y"})
    assert rq._parse_produce_fast({k: v for k, v in body.items() if k != "timeout_ms"}).timeout_ms == 30_000
    for bad in ({**body, "acks": True}, {**body, "timeout_ms": -1},
                {**body, "topics": [body["topics"][0], body["topics"][0]]}):
        assert rq._parse_produce_fast(bad) is None
        with pytest.raises(BadRequest):
            rq.parse_produce(bad)


def _sample(m: BrokerMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_request_counts_and_latency_buckets_follow_prometheus() -> None:
    m = BrokerMetrics()
    stats = m.requests["produce"]
    stats.observe(200, 0.0005)  # on a bound: counted in that bucket ("less than or equal")
    stats.observe(200, 0.0007)
    stats.observe(400, 100.0)  # beyond the last bound: +Inf only
    stats.observe(413, 0.003)
    stats.errors += 1
    m.bytes_in += 300
    m.messages_in += 3
    m.bytes_out += 7
    m.replication_bytes_out += 11
    assert _sample(m, "minibroker_requests_total", api="produce", status="200") == 2
    assert _sample(m, "minibroker_requests_total", api="produce", status="400") == 1
    assert _sample(m, "minibroker_requests_total", api="produce", status="413") == 1
    assert _sample(m, "minibroker_request_errors_total", api="produce") == 1
    assert _sample(m, "minibroker_requests_total", api="fetch", status="200") == 0
    assert _sample(m, "minibroker_requests_total", api="fetch", status="400") == 0  # present before any
    bucket = "minibroker_request_latency_seconds_bucket"
    assert _sample(m, bucket, api="produce", le="0.0005") == 1
    assert _sample(m, bucket, api="produce", le="0.001") == 2
    assert _sample(m, bucket, api="produce", le=str(LATENCY_BUCKETS[-1])) == 3
    assert _sample(m, bucket, api="produce", le="+Inf") == 4
    assert _sample(m, "minibroker_request_latency_seconds_count", api="produce") == 4
    assert _sample(m, "minibroker_request_latency_seconds_sum", api="produce") == pytest.approx(100.0042)
    assert _sample(m, "minibroker_bytes_in_total") == 300
    assert _sample(m, "minibroker_messages_in_total") == 3
    assert _sample(m, "minibroker_bytes_out_total") == 7
    assert _sample(m, "minibroker_replication_bytes_out_total") == 11
    text = m.render().decode()
    assert "# TYPE minibroker_request_latency_seconds histogram" in text
    assert "# TYPE minibroker_requests_total counter" in text
