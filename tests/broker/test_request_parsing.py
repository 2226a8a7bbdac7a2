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
from controller.propagator import partition_state_wire
from tests.controller.test_model import Model
from tests.controller.test_model import step as controller_step

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


# --- partition states of leader_and_isr / update_metadata -------------------------------------------------------

_GOOD = {"topic": "t", "partition": 0, "leader": 1, "leader_epoch": 0, "isr": [1, 2], "partition_epoch": 0,
         "replicas": [1, 2], "is_new": False}


def _control(**fields: Any) -> dict[str, Any]:
    return {"controller_id": 3000, "controller_epoch": 1, "broker_epoch": -1, **fields}


def _parse_states(api: str, states: list[dict[str, Any]]) -> list[rq.PartitionStateMsg]:
    if api == "leader_and_isr":
        return rq.parse_leader_and_isr(_control(partition_states=states, live_leaders=[], topic_configs={}))\
            .partition_states
    return rq.parse_update_metadata(_control(partition_states=states, brokers=[])).partition_states


@pytest.mark.parametrize("api", ["leader_and_isr", "update_metadata"])
@pytest.mark.parametrize(("change", "problem"), [
    ({"leader": 1, "isr": [2]}, r"leader 1 is not in the isr \[2\]"),
    ({"isr": []}, "leader 1 with an empty isr"),
    ({"isr": [1, 99]}, r"isr \[1, 99\] is not a subset of replicas \[1, 2\] \(has \[99\]\)"),
    ({"isr": [1, 1, 2]}, r"isr \[1, 1, 2\] names a broker more than once"),
    ({"replicas": [1, 1, 2]}, r"replicas \[1, 1, 2\] names a broker more than once"),
    ({"replicas": [1, 2, -5]}, r"replicas \[1, 2, -5\]: broker id -5 outside \[0, 2147483647\]"),
    ({"isr": [1, -5]}, r"isr \[1, -5\]: broker id -5 outside"),
    ({"replicas": [1, 2, 2**31]}, r"replicas \[1, 2, 2147483648\]: broker id 2147483648 outside"),
    ({"leader": -5}, r"leader -5 is not a broker id \(>= 0\) nor -1 \(no leader\)"),
    ({"leader": 3}, r"leader 3 is not one of the replicas \[1, 2\]"),
    ({"leader": 3, "isr": [1, 2, 3]}, r"isr \[1, 2, 3\] is not a subset of replicas"),
    ({"leader_epoch": -1}, "leader_epoch -1 is negative: a leader epoch"),
    ({"leader": -1, "leader_epoch": -1}, "leader_epoch -1 is negative"),
    ({"partition_epoch": -1}, "partition_epoch -1 is negative"),
    # offline (no leader): the ISR kept need not hold a leader, but is still a duplicate-free subset of the replicas
    ({"leader": -1, "isr": [1, 99]}, r"isr \[1, 99\] is not a subset of replicas"),
    ({"leader": -1, "isr": [2, 2]}, r"isr \[2, 2\] names a broker more than once"),
])
def test_partition_states_no_broker_could_leave_are_refused(api: str, change: dict[str, Any], problem: str) -> None:
    """Each was applied: a broker led outside its own ISR, or counted brokers holding no replica in the ISR,
    and no later request could repair it. Refused whole (HTTP 400), naming the partition."""
    with pytest.raises(BadRequest, match=rf"^partition state of t-0: {problem}"):
        _parse_states(api, [{**_GOOD, "topic": "u"}, {**_GOOD, **change}])


@pytest.mark.parametrize("api", ["leader_and_isr", "update_metadata"])
@pytest.mark.parametrize("change", [
    {},
    {"isr": [2, 1]},  # any order
    {"leader": 2, "isr": [2], "leader_epoch": 3, "partition_epoch": 7},  # after an unclean election
    {"leader": -1, "isr": [1]},  # offline: the last ISR kept, without a leader
    {"leader": -1, "isr": [2, 1]},
    {"leader": -1, "isr": []},
    {"replicas": [3, 1, 2], "leader": 3, "isr": [3]},
])
def test_partition_states_the_controller_sends_are_taken(api: str, change: dict[str, Any]) -> None:
    [msg] = _parse_states(api, [{**_GOOD, **change}])
    state = {**_GOOD, **change}
    assert (msg.leader, list(msg.isr), list(msg.replicas)) == (state["leader"], state["isr"], state["replicas"])


@settings(max_examples=60, deadline=None)
@given(unclean=st.booleans(), steps=st.lists(controller_step, max_size=30))
def test_every_partition_state_the_real_controller_makes_is_taken(unclean: bool, steps: list[tuple[str, int]]) -> None:
    """The controller's own operations (controller/ops.py: creation, fencing, unfencing, re-registration,
    controlled shutdown, ISR changes, preferred and unclean elections), as the propagator puts them on the wire."""
    model = Model(unclean=unclean)
    for i in range(len(steps) + 1):
        if i:
            model.step(*steps[i - 1])
        states = [partition_state_wire(tp, p) for tp, p in sorted(model.image.partitions.items())]
        for api in ("leader_and_isr", "update_metadata"):
            assert len(_parse_states(api, states)) == len(states)


@pytest.mark.parametrize("api", ["leader_and_isr", "update_metadata"])
def test_a_partition_state_listed_twice_is_refused(api: str) -> None:
    with pytest.raises(BadRequest, match=r"^partition t-0 appears more than once in one request"):
        _parse_states(api, [_GOOD, {**_GOOD, "topic": "u"}, {**_GOOD, "leader": 2}])


def test_a_stop_replica_listing_a_partition_twice_is_refused() -> None:
    one = {"topic": "t", "partition": 0, "leader_epoch": -2, "delete": True}
    _, parts = rq.parse_stop_replica(_control(partitions=[one, {**one, "partition": 1}]))
    assert [p.tp for p in parts] == [TopicPartition("t", 0), TopicPartition("t", 1)]
    with pytest.raises(BadRequest, match=r"^partition t-0 appears more than once in one request"):
        rq.parse_stop_replica(_control(partitions=[one, {**one, "partition": 1}, {**one, "delete": False}]))


@pytest.mark.parametrize("host", ["x y", "a/b", "u@h", "h#f", "h?q", "", "h\u00e9"])
def test_broker_addresses_in_control_requests_must_be_host_names_or_addresses(host: str) -> None:
    """'x y' was taken, and every request to that broker then failed."""
    good = {"node_id": 2, "host": "broker-2", "port": 9092}
    bad = {**good, "host": host}
    with pytest.raises(BadRequest, match="field 'host' must be a host name or IP address"):
        rq.parse_update_metadata(_control(brokers=[good, bad]))
    with pytest.raises(BadRequest, match="field 'host' must be a host name or IP address"):
        rq.parse_leader_and_isr(_control(live_leaders=[bad]))
    brokers = [{**good, "host": h} for h in ("127.0.0.1", "[::1]", "::1", "kafka_2.local")]
    assert [b.host for b in rq.parse_update_metadata(_control(brokers=brokers)).brokers] == [
        "127.0.0.1", "[::1]", "::1", "kafka_2.local"]
