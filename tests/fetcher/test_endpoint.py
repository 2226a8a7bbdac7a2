"""HttpLeaderEndpoint against a real aiohttp server on 127.0.0.1 (canned protocol answers)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from broker.requests import FetchPartitionRequest
from common.clock import SystemClock
from common.errors import ErrorCode
from common.wire import CONTENT_TYPE, TopicPartition, decode, encode
from fetcher.api import BrokerEndpoint, InitialFetchState
from fetcher.endpoint import (
    EARLIEST_TIMESTAMP,
    EpochRequest,
    FetchRequest,
    HttpLeaderEndpoint,
    LeaderUnavailableError,
)
from fetcher.state import EpochEndOffset
from fetcher.task import FetcherConfig, FetcherTask

A, B, C = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


class CannedLeader:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, Any] = {}
        self.status = 200

    async def handle(self, request: web.Request) -> web.Response:
        api = request.match_info["api"]
        self.requests.append((api, decode(await request.read())))
        if self.status != 200:
            return web.Response(status=self.status, text="missing field 'topics'")
        body = self.answers[api]
        return web.Response(body=body if isinstance(body, bytes) else encode(body), content_type=CONTENT_TYPE)


@pytest.fixture
async def served() -> AsyncIterator[tuple[CannedLeader, HttpLeaderEndpoint]]:
    leader = CannedLeader()
    app = web.Application()
    app.router.add_post("/v1/{api}", leader.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    endpoint = HttpLeaderEndpoint(BrokerEndpoint(1, "127.0.0.1", port), timeout_ms=5_000)
    try:
        yield leader, endpoint
    finally:
        await endpoint.close()
        await runner.cleanup()


def fetch_request() -> FetchRequest:
    parts = {tp: FetchPartitionRequest(10 * i, 3, 2, 0, 1024) for i, tp in enumerate((A, C, B))}
    return FetchRequest(replica_id=2, broker_epoch=9, max_wait_ms=10, min_bytes=1, max_bytes=4096, partitions=parts)


async def test_fetch_encodes_request_and_decodes_answer(served: tuple[CannedLeader, HttpLeaderEndpoint]) -> None:
    leader, endpoint = served
    leader.answers["fetch"] = {"error": 0, "topics": [
        {"topic": "a", "partitions": [
            {"partition": 0, "error": 0, "high_watermark": 5, "log_start_offset": 0, "log_end_offset": 7,
             "diverging_epoch": None, "records": b"xyz"},
            {"partition": 1, "error": 74, "high_watermark": -1, "log_start_offset": -1, "log_end_offset": -1,
             "diverging_epoch": None, "records": b""}]},
        {"topic": "b", "partitions": [
            {"partition": 0, "error": 0, "high_watermark": 5, "log_start_offset": 0, "log_end_offset": 7,
             "diverging_epoch": {"epoch": 2, "end_offset": 4}, "records": b""}]}]}
    response = await endpoint.fetch(fetch_request())
    api, body = leader.requests[-1]
    assert api == "fetch"
    assert (body["replica_id"], body["broker_epoch"], body["max_wait_ms"], body["max_bytes"]) == (2, 9, 10, 4096)
    assert [t["topic"] for t in body["topics"]] == ["a", "b"]
    first = body["topics"][0]["partitions"][0]
    assert first == {"partition": 0, "fetch_offset": 0, "current_leader_epoch": 3, "last_fetched_epoch": 2,
                     "log_start_offset": 0, "partition_max_bytes": 1024}
    assert response.error is ErrorCode.NONE
    assert response.partitions[A].records == b"xyz" and response.partitions[A].high_watermark == 5
    assert response.partitions[B].error is ErrorCode.FENCED_LEADER_EPOCH
    assert response.partitions[C].diverging_epoch == EpochEndOffset(2, 4)


async def test_offsets_for_leader_epoch_and_missing_partitions(
        served: tuple[CannedLeader, HttpLeaderEndpoint]) -> None:
    leader, endpoint = served
    leader.answers["offsets_for_leader_epoch"] = {"topics": [
        {"topic": "a", "partitions": [{"partition": 0, "error": 0, "leader_epoch": 2, "end_offset": 40}]}]}
    answers = await endpoint.offsets_for_leader_epoch(2, {A: EpochRequest(3, 2), B: EpochRequest(3, 1)})
    assert answers[A].error is ErrorCode.NONE and answers[A].epoch_end == EpochEndOffset(2, 40)
    assert answers[B].error is not ErrorCode.NONE  # left out by the leader: never "no truncation"
    _, body = leader.requests[-1]
    assert body["replica_id"] == 2
    assert body["topics"][0]["partitions"][1] == {"partition": 1, "current_leader_epoch": 3, "leader_epoch": 1}


async def test_list_offset(served: tuple[CannedLeader, HttpLeaderEndpoint]) -> None:
    leader, endpoint = served
    leader.answers["list_offsets"] = {"topics": [{"topic": "a", "partitions": [
        {"partition": 0, "error": 0, "timestamp": -1, "offset": 123, "leader_epoch": 3}]}]}
    answer = await endpoint.list_offset(2, A, 3, EARLIEST_TIMESTAMP)
    assert (answer.error, answer.offset) == (ErrorCode.NONE, 123)
    _, body = leader.requests[-1]
    assert body["replica_id"] == 2 and body["topics"][0]["partitions"][0]["timestamp"] == EARLIEST_TIMESTAMP


async def test_list_offset_reads_only_the_answer_for_its_partition(
        served: tuple[CannedLeader, HttpLeaderEndpoint]) -> None:
    # an answer for another partition is none for this one; and a missing answer is an error, never
    # (NONE, -1), which a follower would take as an offset to start from
    leader, endpoint = served
    leader.answers["list_offsets"] = {"topics": [{"topic": "a", "partitions": [
        {"partition": 1, "error": 0, "offset": 77}]}]}
    answer = await endpoint.list_offset(2, A, 0, EARLIEST_TIMESTAMP)
    assert (answer.error, answer.offset) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)


async def test_a_top_level_error_applies_to_partitions_answered_without_one(
        served: tuple[CannedLeader, HttpLeaderEndpoint]) -> None:
    leader, endpoint = served
    leader.answers["offsets_for_leader_epoch"] = {"error": int(ErrorCode.NOT_LEADER_OR_FOLLOWER), "topics": [
        {"topic": "a", "partitions": [{"partition": 0, "leader_epoch": -1, "end_offset": -1}]}]}
    answers = await endpoint.offsets_for_leader_epoch(2, {A: EpochRequest(3, 2)})
    assert answers[A].error is ErrorCode.NOT_LEADER_OR_FOLLOWER


@pytest.mark.parametrize("answer", [b"\xc1 not msgpack", encode([1, 2]), encode({"topics": "x"}),
                                    encode({"topics": [{"topic": "a", "partitions": [{"partition": "0"}]}]}),
                                    encode({"topics": [{"topic": "a", "partitions": [
                                        {"partition": 0, "error": 0, "records": "text"}]}]})])
async def test_malformed_answer_is_a_whole_request_failure(
        served: tuple[CannedLeader, HttpLeaderEndpoint], answer: bytes) -> None:
    leader, endpoint = served
    leader.answers["fetch"] = answer
    with pytest.raises(LeaderUnavailableError):
        await endpoint.fetch(fetch_request())


async def test_http_400_is_a_whole_request_failure(served: tuple[CannedLeader, HttpLeaderEndpoint]) -> None:
    leader, endpoint = served
    leader.status = 400
    with pytest.raises(LeaderUnavailableError, match="missing field"):
        await endpoint.fetch(fetch_request())


async def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = HttpLeaderEndpoint(BrokerEndpoint(1, "127.0.0.1", port), timeout_ms=2_000)
    try:
        with pytest.raises(LeaderUnavailableError):
            await endpoint.fetch(fetch_request())
    finally:
        await endpoint.close()


class LongPollLeader:
    """A leader over real HTTP whose fetch long-polls (answers nothing) until released."""

    def __init__(self) -> None:
        self.fetch_bodies: list[dict[str, Any]] = []
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        api = request.match_info["api"]
        body = decode(await request.read())
        if api == "fetch":
            self.fetch_bodies.append(body)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), body["max_wait_ms"] / 1000)
            answer: dict[str, Any] = {"error": 0, "topics": [
                {"topic": t["topic"], "partitions": [
                    {"partition": p["partition"], "error": 0, "high_watermark": 0, "log_start_offset": 0,
                     "log_end_offset": 0, "diverging_epoch": None, "records": b""} for p in t["partitions"]]}
                for t in body["topics"]]}
        else:  # offsets_for_leader_epoch: the follower's logs are empty, so it is never asked
            answer = {"topics": []}
        return web.Response(body=encode(answer), content_type=CONTENT_TYPE)


class EmptyLogs:
    """FollowerPartitions over empty logs (a log-like object with nothing in it)."""

    broker_id = 2
    broker_epoch = 3

    class _Log:
        log_start_offset = 0
        log_end_offset = 0

        def latest_epoch(self) -> None:
            return None

    def follower_log(self, tp: TopicPartition, leader_epoch: int) -> Any:
        return self._Log()

    def on_follower_appended(self, tp: TopicPartition, leader_high_watermark: int,
                             leader_log_start_offset: int) -> None:
        pass

    def on_follower_truncated(self, tp: TopicPartition, offset: int, reason: str) -> None:
        raise AssertionError("nothing to truncate")


async def test_added_partition_interrupts_http_long_poll_and_stop_is_clean() -> None:
    leader = LongPollLeader()
    app = web.Application()
    app.router.add_post("/v1/{api}", leader.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    broker = BrokerEndpoint(1, "127.0.0.1", runner.addresses[0][1])
    task = FetcherTask(0, HttpLeaderEndpoint(broker, timeout_ms=5_000), EmptyLogs(),
                       FetcherConfig(wait_max_ms=30_000, backoff_ms=50), SystemClock())
    try:
        task.add_partitions({A: InitialFetchState(broker, 0, 0)})
        task.start()
        for _ in range(3000):  # bounded: 30 s on a loaded machine
            if leader.fetch_bodies:
                break
            await asyncio.sleep(0.01)
        assert len(leader.fetch_bodies) == 1
        task.add_partitions({B: InitialFetchState(broker, 0, 0)})  # while the first fetch long-polls
        for _ in range(3000):  # bounded: 30 s on a loaded machine
            if len(leader.fetch_bodies) >= 2:
                break
            await asyncio.sleep(0.01)
        assert task.stats.fetches_interrupted == 1
        parts = {(t["topic"], p["partition"]) for t in leader.fetch_bodies[-1]["topics"] for p in t["partitions"]}
        assert parts == {("a", 0), ("a", 1)}
    finally:
        await task.stop()
        leader.release.set()
        await runner.cleanup()
    assert not task.running
