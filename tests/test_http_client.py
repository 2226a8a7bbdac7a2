"""``common.http.RpcClient`` against real servers on 127.0.0.1 port 0: aiohttp apps as our
brokers run them, and a raw asyncio server for responses aiohttp never sends."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from common.http import RpcBadRequest, RpcClient, RpcConnectionError, RpcError
from common.wire import CONTENT_TYPE, decode, encode


@dataclass
class Recorder:
    """What the server saw: the client's port per request, handlers running now and at most."""
    ports: list[int] = field(default_factory=list)
    arrivals: list[Any] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    transports: list[asyncio.BaseTransport] = field(default_factory=list)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(predicate), 10)

    async def note(self) -> None:
        async with self.changed:
            self.changed.notify_all()


def msgpack_response(obj: Any) -> web.Response:
    return web.Response(body=encode(obj), content_type=CONTENT_TYPE)


def build_app(rec: Recorder) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        body = decode(await request.read())
        peer = request.transport.get_extra_info("peername") if request.transport else None
        rec.ports.append(peer[1] if peer else -1)
        if request.transport is not None:
            rec.transports.append(request.transport)
        return msgpack_response({"echo": body, "port": rec.ports[-1]})

    async def gated(request: web.Request) -> web.Response:
        body = decode(await request.read())
        rec.arrivals.append(body.get("i"))
        rec.active += 1
        rec.max_active = max(rec.max_active, rec.active)
        await rec.note()
        try:
            await rec.gate.wait()
        finally:
            rec.active -= 1
        return msgpack_response({"i": body.get("i")})

    async def bad(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=400, text="field 'x' must be an integer " + "y" * 1000)

    async def chunked(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        data = encode({"chunks": list(range(1000)), "blob": b"z" * 50_000})
        for start in range(0, len(data), 7_000):
            await resp.write(data[start:start + 7_000])
        await resp.write_eof()
        return resp

    async def blob(request: web.Request) -> web.Response:
        body = decode(await request.read())
        return msgpack_response({"size": len(body["data"]), "data": b"\xab" * body["want"]})

    async def not_a_map(request: web.Request) -> web.Response:
        await request.read()
        return msgpack_response([1, 2, 3])

    async def html(request: web.Request) -> web.Response:
        """A 200 that is no answer of ours: a proxy's login page, another service on the port."""
        await request.read()
        return web.Response(text="<html>proxy login</html>", content_type="text/html")

    async def undecodable(request: web.Request) -> web.Response:
        body = decode(await request.read())
        return web.Response(body=bytes(body["raw"]), content_type=CONTENT_TYPE)

    async def status(request: web.Request) -> web.Response:
        return web.json_response({"broker_id": 7})

    async def text_status(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application(client_max_size=32 * 1024 * 1024)
    app.router.add_post("/v1/echo", echo)
    app.router.add_post("/v1/gated", gated)
    app.router.add_post("/v1/bad", bad)
    app.router.add_post("/v1/chunked", chunked)
    app.router.add_post("/v1/blob", blob)
    app.router.add_post("/v1/not_a_map", not_a_map)
    app.router.add_post("/v1/html", html)
    app.router.add_post("/v1/undecodable", undecodable)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/text", text_status)
    return app


@asynccontextmanager
async def aiohttp_server(rec: Recorder, port: int = 0) -> AsyncIterator[str]:
    runner = web.AppRunner(build_app(rec), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        rec.gate.set()
        await runner.cleanup()


@asynccontextmanager
async def raw_server(reply: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> AsyncIterator[str]:
    """A bare asyncio server: reads one request head and body, then ``reply`` writes what it likes."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            await reply(writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def client() -> AsyncIterator[RpcClient]:
    c = RpcClient(limit_per_host=2, timeout_s=10)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def client1() -> AsyncIterator[RpcClient]:
    """One connection per address: a second call must wait for (or reuse) the first one's."""
    c = RpcClient(limit_per_host=1, timeout_s=10)
    try:
        yield c
    finally:
        await c.close()


async def busy_and_queued(client: RpcClient, rec: Recorder,
                          address: str) -> tuple[asyncio.Task[dict[str, Any]], asyncio.Task[dict[str, Any]]]:
    """A call held in the server's handler, and an echo call queued behind it (``client1``)."""
    busy = asyncio.create_task(client.call(address, "gated", {"i": 1}))
    await rec.wait_for(lambda: rec.active == 1)
    queued = asyncio.create_task(client.call(address, "echo", {"queued": 1}))
    await asyncio.sleep(0)
    return busy, queued


async def test_round_trip_reuses_one_keep_alive_connection(client: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        for i in range(5):
            resp = await client.call(address, "echo", {"i": i, "s": "x"})
            assert resp["echo"] == {"i": i, "s": "x"}
        assert len(set(rec.ports)) == 1
        assert await client.get_json(address, "/v1/status") == {"broker_id": 7}
        by_name = address.replace("127.0.0.1", "localhost")  # resolved, trying each address
        assert (await client.call(by_name, "echo", {"n": 1}))["echo"] == {"n": 1}


async def test_concurrency_is_bounded_by_limit_per_host(client: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        calls = [asyncio.create_task(client.call(address, "gated", {"i": i})) for i in range(6)]
        await rec.wait_for(lambda: rec.active == 2)
        for _ in range(20):  # give a third request every chance to arrive
            await asyncio.sleep(0.005)
        assert rec.active == 2 and len(rec.arrivals) == 2
        rec.gate.set()
        results = await asyncio.gather(*calls)
        assert [r["i"] for r in results] == list(range(6))
        assert rec.max_active == 2 and sorted(rec.arrivals) == list(range(6))


async def test_waiting_callers_are_served_in_order(client1: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        first = asyncio.create_task(client1.call(address, "gated", {"i": 0}))
        await rec.wait_for(lambda: rec.active == 1)
        rest = []
        for i in range(1, 5):
            rest.append(asyncio.create_task(client1.call(address, "gated", {"i": i})))
            await asyncio.sleep(0)  # each queues before the next starts
        rec.gate.set()
        await asyncio.gather(first, *rest)
        assert rec.arrivals == [0, 1, 2, 3, 4]


async def test_http_400_raises_bad_request_with_the_server_message(client: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        with pytest.raises(RpcBadRequest, match=r"bad to 127\.0\.0\.1:\d+: HTTP 400: field 'x'") as info:
            await client.call(address, "bad", {"x": "1"})
        assert len(str(info.value)) < 600
        assert (await client.call(address, "echo", {"after": 1}))["echo"] == {"after": 1}


async def test_non_map_response_raises_rpc_error(client: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        with pytest.raises(RpcError, match="not a map") as info:
            await client.call(address, "not_a_map", {})
        assert not isinstance(info.value, RpcConnectionError)


async def test_a_200_answer_that_is_not_msgpack_is_a_failed_call(client: RpcClient) -> None:
    """msgpack's own errors (ExtraData, FormatError, OutOfData: ValueErrors) escaped ``call``, so callers
    that handle ``RpcError`` (the broker's controller link) died on them instead of retrying."""
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        with pytest.raises(RpcError, match=r"html to 127\.0\.0\.1:\d+: response is not msgpack") as info:
            await client.call(address, "html", {})
        assert "proxy login" in str(info.value)
        for raw in (b"\xc1", b"\x92\x01", b"\x81\xa1k\x01trailing"):  # reserved byte, cut short, extra data
            with pytest.raises(RpcError, match="response is not msgpack"):
                await client.call(address, "undecodable", {"raw": raw})
        assert (await client.call(address, "echo", {"after": 1}))["echo"] == {"after": 1}


async def test_timeout_closes_the_connection_and_the_late_answer_is_never_read(client1: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        await client1.call(address, "echo", {"warm": 1})
        with pytest.raises(RpcConnectionError, match=r"gated to 127\.0\.0\.1:\d+: TimeoutError"):
            await client1.call(address, "gated", {"i": 1}, timeout_s=0.2)
        rec.gate.set()  # the late answer goes to a closed connection
        resp = await client1.call(address, "echo", {"next": 2})
        assert resp["echo"] == {"next": 2}
        assert rec.ports[0] != rec.ports[1]


async def test_a_cancelled_call_frees_its_connection_slot(client1: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        busy, queued = await busy_and_queued(client1, rec, address)
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy
        assert (await queued)["echo"] == {"queued": 1}


async def test_a_connection_the_server_closed_while_idle_is_replaced(client: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        await client.call(address, "echo", {"i": 1})
        first_port = rec.ports[0]
        # the server closes the idle keep-alive connection, as aiohttp does after keepalive_timeout
        rec.transports[0].close()
        for _ in range(200):
            await asyncio.sleep(0.005)
            if not any(c.usable() for pool in client._pools.values() for c in pool.idle):
                break
        resp = await client.call(address, "echo", {"i": 2})
        assert resp["echo"] == {"i": 2} and rec.ports[1] != first_port


async def test_a_close_the_event_loop_has_not_read_yet_is_caught_before_reuse(client: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        await client.call(address, "echo", {"i": 1})
        (conn,) = [c for pool in client._pools.values() for c in pool.idle]
        assert conn.still_open()
        # the server's FIN reaches the client's socket at once (loopback), but this task does not yield,
        # so the event loop has not read it: only the poll in still_open can see it
        rec.transports[0].get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        assert conn.usable() and not conn.still_open()
        resp = await client.call(address, "echo", {"i": 2})
        assert resp["echo"] == {"i": 2} and rec.ports[1] != rec.ports[0]


async def test_calls_work_after_the_server_restarts_on_the_same_port(client: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        await client.call(address, "echo", {"i": 1})
    port = int(address.rpartition(":")[2])
    with pytest.raises(RpcConnectionError, match="ConnectionRefusedError"):
        await client.call(address, "echo", {"i": 2})
    async with aiohttp_server(rec, port=port) as again:
        assert again == address
        assert (await client.call(address, "echo", {"i": 3}))["echo"] == {"i": 3}


async def test_chunked_response_is_parsed(client: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        for _ in range(2):  # and the connection stays usable after it
            resp = await client.call(address, "chunked", {})
            assert resp["chunks"] == list(range(1000)) and resp["blob"] == b"z" * 50_000


async def test_large_bodies_both_ways(client: RpcClient) -> None:
    rec = Recorder()
    size = 8 * 1024 * 1024
    async with aiohttp_server(rec) as address:
        resp = await client.call(address, "blob", {"data": b"\x01" * size, "want": size})
        assert resp["size"] == size and resp["data"] == b"\xab" * size
        resp = await client.call(address, "blob", {"data": b"", "want": 10})
        assert resp == {"size": 0, "data": b"\xab" * 10}


async def test_connection_refused(client: RpcClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RpcConnectionError, match=rf"produce to 127\.0\.0\.1:{port}: ConnectionRefusedError"):
        await client.call(f"127.0.0.1:{port}", "produce", {})
    with pytest.raises(RpcConnectionError, match=rf"GET /v1/status from 127\.0\.0\.1:{port}"):
        await client.get_json(f"127.0.0.1:{port}", "/v1/status")


async def test_get_json_errors(client: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        with pytest.raises(RpcConnectionError, match="HTTP 404"):
            await client.get_json(address, "/v1/nothing")
        with pytest.raises(RpcConnectionError, match="expected application/json"):
            await client.get_json(address, "/v1/text")
        assert await client.get_json(address, "/v1/status") == {"broker_id": 7}


async def test_body_delimited_by_connection_close(client: RpcClient) -> None:
    body = encode({"ok": True})

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-msgpack\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()

    async with raw_server(reply) as address:
        assert await client.call(address, "x", {}) == {"ok": True}
        assert await client.call(address, "x", {}) == {"ok": True}  # a new connection for the second


async def test_close_during_a_body_delimited_by_eof_is_an_error_not_a_short_body(client: RpcClient) -> None:
    sent = asyncio.Event()

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + encode({"ok": True})[:2])
        await writer.drain()
        sent.set()
        await asyncio.sleep(10)  # the rest never comes; the client closes first

    async with raw_server(reply) as address:
        call = asyncio.create_task(client.call(address, "fetch", {}))
        await asyncio.wait_for(sent.wait(), 10)
        await asyncio.sleep(0.05)  # let the client read what was sent
        await client.close()
        with pytest.raises(RpcConnectionError, match="connection closed before the response was complete"):
            await call


async def test_connection_closed_mid_response(client: RpcClient) -> None:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()

    async with raw_server(reply) as address:
        with pytest.raises(RpcConnectionError, match=r"fetch to 127\.0\.0\.1:\d+: connection closed before"):
            await client.call(address, "fetch", {})


async def test_malformed_response(client: RpcClient) -> None:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"SPDY/9 banana\r\n\r\n")
        await writer.drain()

    async with raw_server(reply) as address:
        with pytest.raises(RpcConnectionError, match="malformed HTTP response"):
            await client.call(address, "fetch", {})


async def test_close_fails_calls_in_flight_and_the_client_stays_usable(client1: RpcClient) -> None:
    rec = Recorder()
    async with aiohttp_server(rec) as address:
        busy, queued = await busy_and_queued(client1, rec, address)
        await client1.close()
        for task in (busy, queued):
            with pytest.raises(RpcConnectionError):
                await task
        assert (await client1.call(address, "echo", {"again": 1}))["echo"] == {"again": 1}


async def test_a_response_above_the_limit_fails_before_it_is_buffered(client: RpcClient) -> None:
    """Announced too large (Content-Length), or a chunked body that never ends: the call fails as soon as the
    limit is passed, and the connection is closed, not read to the end (memory stays bounded)."""
    async def announced(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-msgpack\r\nContent-Length: 600000000\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(10)

    endless_written = 0

    async def endless(writer: asyncio.StreamWriter) -> None:
        nonlocal endless_written
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-msgpack\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (64 * 1024, b"z" * 64 * 1024)
        with contextlib.suppress(ConnectionError):
            for _ in range(2_000):  # 128 MiB at most; the client hangs up long before
                writer.write(chunk)
                await writer.drain()
                endless_written += 64 * 1024

    async with raw_server(announced) as address:
        with pytest.raises(RpcConnectionError, match="response of 600000000 bytes, above the limit of 1048576"):
            await client.call(address, "fetch", {}, max_response_bytes=1 << 20)
    async with raw_server(endless) as address:
        with pytest.raises(RpcConnectionError, match="response body above the limit of 1048576 bytes"):
            await client.call(address, "fetch", {}, max_response_bytes=1 << 20)
    assert endless_written < 64 << 20, "the client stopped reading"


async def test_endless_response_headers_fail_the_call(client: RpcClient) -> None:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        with contextlib.suppress(ConnectionError):
            for i in range(10_000):
                writer.write(b"X-Filler-%d: %s\r\n" % (i, b"f" * 200))
                await writer.drain()

    async with raw_server(reply) as address:
        with pytest.raises(RpcConnectionError, match="response headers longer than 65536 bytes"):
            await client.call(address, "x", {})


@pytest.mark.parametrize(("status", "error", "retriable"), [
    (500, RpcConnectionError, True), (503, RpcConnectionError, True), (302, RpcError, False),
    (404, RpcBadRequest, False)])
async def test_only_2xx_is_an_answer_and_5xx_is_retriable(client: RpcClient, status: int, error: type[RpcError],
                                                          retriable: bool) -> None:
    """A 5xx (an overloaded server, a proxy) may succeed later: a connection-level failure, not "retrying
    cannot help"; a 3xx carrying msgpack is still no answer of ours."""
    async def reply(writer: asyncio.StreamWriter) -> None:
        body = encode({"error": 0})
        writer.write(b"HTTP/1.1 %d Whatever\r\nContent-Type: application/x-msgpack\r\nContent-Length: %d\r\n\r\n"
                     % (status, len(body)) + body)
        await writer.drain()

    async with raw_server(reply) as address:
        with pytest.raises(error, match=f"HTTP {status}") as info:
            await client.call(address, "x", {})
    assert type(info.value) is error
    assert isinstance(info.value, RpcConnectionError) is retriable


async def test_a_connection_idle_for_max_idle_s_is_not_reused() -> None:
    """Closed by the client below the server's connections.max.idle.ms (as Kafka's clients, 9 minutes against
    10), so a request is never written on a connection the server is closing just then."""
    rec = Recorder()
    client = RpcClient(limit_per_host=1, timeout_s=10, max_idle_s=0.05)
    try:
        async with aiohttp_server(rec) as address:
            await client.call(address, "echo", {"i": 1})
            await client.call(address, "echo", {"i": 2})  # at once: the same connection
            await asyncio.sleep(0.1)
            await client.call(address, "echo", {"i": 3})
            assert rec.ports[0] == rec.ports[1] != rec.ports[2]
    finally:
        await client.close()


async def test_an_address_no_longer_used_keeps_no_connection() -> None:
    # its pool kept an idle socket for good (the server closed its end after its idle time; we never did): now
    # it is closed, and the pool forgotten, when a new address is first used
    rec = Recorder()
    client = RpcClient(limit_per_host=1, timeout_s=10, max_idle_s=0.05)
    try:
        async with aiohttp_server(rec) as first, aiohttp_server(rec) as second:
            await client.call(first, "echo", {"i": 1})
            connection = next(iter(client._pools[first].conns))
            await asyncio.sleep(0.1)
            await client.call(second, "echo", {"i": 2})
            assert first not in client._pools and second in client._pools
            assert connection.transport is None or connection.transport.is_closing()
            await client.call(first, "echo", {"i": 3})  # used again: a new pool, a new connection
            assert rec.ports[0] != rec.ports[2]
    finally:
        await client.close()
