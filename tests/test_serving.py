"""common.serving.read_body's idle deadline (connections.max.idle.ms) on a real aiohttp server on 127.0.0.1: a
body that keeps coming is read whole however slowly, one that stops gets HTTP 408, and one that came while the
event loop was stalled past the deadline is not taken for stalled. The clients are raw sockets in threads, so
that they go on sending while the test blocks the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web

from broker.metrics import BrokerMetrics
from broker.server import _endpoint, low_level_server
from common import serving
from controller.server import CONTROLLER_KEY, _guard

IDLE_S = 0.3


async def _handler(request: web.BaseRequest) -> web.StreamResponse:
    try:
        body = await serving.read_body(request, 1 << 20)
    except serving.BodyStalled as exc:
        return exc.response()
    return web.Response(text=f"ok {len(body)}")


@contextlib.asynccontextmanager
async def _serving(runner: web.BaseRunner) -> AsyncIterator[int]:
    """``runner`` set up and listening on 127.0.0.1; its port, cleaned up after."""
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with _serving(web.ServerRunner(low_level_server(_handler, keepalive_timeout=IDLE_S),
                                         handle_signals=False)) as bound:
        yield bound


def _post(port: int, length: int, pieces: list[tuple[float, bytes]], answer: list[bytes]) -> None:
    """Headers for a body of ``length`` bytes, then each piece after its pause; the answer read to EOF."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % length)
        for pause_s, data in pieces:
            time.sleep(pause_s)
            s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        answer.append(got)


async def _answer(port: int, length: int, pieces: list[tuple[float, bytes]], *, block_loop_s: float = 0) -> bytes:
    answer: list[bytes] = []
    client = threading.Thread(target=_post, args=(port, length, pieces, answer))
    client.start()
    if block_loop_s:
        await asyncio.sleep(0.1)  # the handler waits for the rest of the body
        time.sleep(block_loop_s)  # the event loop stalls (a long fsync, a paused process) past the deadline
    await asyncio.to_thread(client.join, 20)
    assert answer, "no answer"
    return answer[0]


async def test_a_body_that_keeps_coming_is_read_whole(port: int) -> None:
    answer = await _answer(port, 60, [(0.1, b"x" * 10)] * 6)  # 0.6 s in all, never 0.3 s without a byte
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok 60"), answer


async def test_a_body_that_stops_gets_408(port: int) -> None:
    answer = await _answer(port, 100, [(0, b"x" * 10)])
    assert answer.startswith(b"HTTP/1.1 408") and b"nothing for 0.3 s after 10 bytes" in answer, answer


async def test_a_body_that_came_while_the_event_loop_stalled_is_read(port: int) -> None:
    # the rest comes at 0.25 s, inside the deadline, but the loop sees it only after 0.6 s, in the same pass
    # as the deadline's timer: it was answered 408 though the whole body was in
    answer = await _answer(port, 20, [(0, b"x" * 10), (0.25, b"y" * 10)], block_loop_s=0.5)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok 20"), answer


# Both servers' guards around read_body: a body aiohttp cannot decode, or a client gone mid-body, reached them
# as aiohttp's RequestPayloadError or ConnectionResetError: answered error -1 and logged as an error with a
# traceback (and aiohttp read the broken body again after the answer: "Unhandled exception").

async def _answered(rm: Any, body: dict[str, Any]) -> dict[str, Any]:
    return {"error": 0}


@pytest.fixture(params=["broker", "controller"])
async def guarded_port(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    if request.param == "broker":
        rm: Any = SimpleNamespace(metrics=BrokerMetrics(), broker_id=1)  # all the guard reads of a replica manager
        runner: web.BaseRunner = web.ServerRunner(low_level_server(_endpoint(rm, "metadata", _answered)),
                                                  handle_signals=False)
    else:
        app = web.Application()
        app[CONTROLLER_KEY] = cast(Any, None)  # never reached: the body is not read
        app.router.add_post("/x", _guard("metadata", _answered))
        runner = web.AppRunner(app, handle_signals=False)
    async with _serving(runner) as bound:
        yield bound


def _exchange(port: int, request: bytes, answer: list[bytes], *, hang_up: bool = False) -> None:
    """``request`` as it is; the answer read to EOF (the server closes the connection), or none at all."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        if hang_up:
            return
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        answer.append(got)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_body_that_is_not_the_gzip_it_claims_is_400_and_closes_the_connection(
        guarded_port: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    body = b"not gzip at all"
    request = (b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
               % (len(body), body))
    following = b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"  # never parsed: the parser is in error
    answer: list[bytes] = []
    await asyncio.to_thread(_exchange, guarded_port, request + following, answer)
    head, _, text = answer[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert text == (b"metadata: the request body cannot be read after 0 bytes: Can not decode content-encoding: gzip; "
                    b"the connection is closed"), answer
    assert b"HTTP/1.1" not in text  # one answer, then the connection closed (not left hanging)
    await asyncio.sleep(0.1)  # what aiohttp does after the answer
    assert _errors(caplog) == []


async def test_a_client_that_hangs_up_mid_body_is_logged_at_info(guarded_port: int,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    request = b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n" + b"x" * 10
    await asyncio.to_thread(_exchange, guarded_port, request, [], hang_up=True)
    deadline = time.monotonic() + 10
    while not any(r.getMessage().startswith("request_body_lost ") for r in caplog.records):
        assert time.monotonic() < deadline, "no request_body_lost event"
        await asyncio.sleep(0.02)
    [lost] = [r for r in caplog.records if r.getMessage().startswith("request_body_lost ")]
    assert lost.levelno == logging.INFO and lost.exc_info is None
    assert "bytes_read=10" in lost.getMessage() and "Connection lost" in lost.getMessage()
    await asyncio.sleep(0.1)
    assert _errors(caplog) == []


# Requests aiohttp's parser refuses are answered 400 before any handler runs; aiohttp logged each as "Error
# handling request" at ERROR with a traceback. They are the client's fault: one line at INFO saying what was wrong.
_REFUSED_BY_THE_PARSER = {
    "broken chunked encoding": (b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                                b"zz\r\nabc\r\n0\r\n\r\n", "Invalid character in chunk size"),
    "bad HTTP version": (b"POST /x HTTP/9.9.9\r\nHost: h\r\n\r\n", "Invalid HTTP version"),
    "header without a colon": (b"POST /x HTTP/1.1\r\nHost h\r\nContent-Length: 3\r\n\r\nabc", "Invalid header token"),
    "header line too long": (b"POST /x HTTP/1.1\r\nHost: h\r\nX: " + b"a" * 20000 + b"\r\nContent-Length: 0\r\n\r\n",
                             "Got more than 8190 bytes"),
    "negative Content-Length": (b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: -3\r\n\r\nabc",
                                "Invalid character in Content-Length"),
}


@pytest.mark.parametrize("case", sorted(_REFUSED_BY_THE_PARSER))
async def test_a_request_the_http_parser_refuses_is_400_logged_at_info(
        guarded_port: int, caplog: pytest.LogCaptureFixture, case: str) -> None:
    caplog.set_level(logging.INFO)
    request, reason = _REFUSED_BY_THE_PARSER[case]
    answer: list[bytes] = []
    await asyncio.to_thread(_exchange, guarded_port, request, answer)
    assert b" 400 Bad Request\r\n" in answer[0], answer
    deadline = time.monotonic() + 10
    while not (logged := [r for r in caplog.records if r.getMessage().startswith("bad_http_request: ")]):
        assert time.monotonic() < deadline, "no bad_http_request line"
        await asyncio.sleep(0.02)
    [line] = logged
    assert line.name == "aiohttp.server" and line.levelno == logging.INFO and line.exc_info is None
    assert "from 127.0.0.1: HTTP 400, " in line.getMessage() and reason in line.getMessage(), line.getMessage()
    assert "\n" not in line.getMessage() and len(line.getMessage()) < 300
    assert _errors(caplog) == []


def test_a_server_error_keeps_its_level_and_traceback(caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp.http_exceptions import HttpProcessingError

    server_log = logging.getLogger("aiohttp.server")
    for exc in (RuntimeError("boom"), HttpProcessingError(code=500, message="server side")):
        caplog.clear()
        try:
            raise exc
        except Exception as raised:
            server_log.exception("Error handling request from %s", "127.0.0.1", exc_info=raised)
        [record] = caplog.records
        assert record.levelno == logging.ERROR and record.exc_info is not None
        assert record.getMessage() == "Error handling request from 127.0.0.1"
