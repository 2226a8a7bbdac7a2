"""A small msgpack-over-HTTP client shared by brokers, fetchers, the controller and clients.

``call`` posts a msgpack body to ``/v1/<api>`` and returns the decoded map;
``get_json`` reads a JSON status page. Connection failures and timeouts raise
``RpcConnectionError`` (the caller decides how to back off), and so does an
HTTP 5xx (an overloaded or failing server, or a proxy: the request may or may
not have been acted on, and a retry may succeed); HTTP 4xx on ``call`` raises
``RpcBadRequest`` with the server's message (retrying the same body cannot
help); any other answer that is not a 2xx msgpack map raises ``RpcError``
(never msgpack's own exceptions). A response larger than the call's
``max_response_bytes`` (or with more than 64 KiB of headers) fails the call
as soon as that is known, before it is buffered: a peer that never ends its
body cannot exhaust this process's memory.

Why hand-written: ``aiohttp.ClientSession`` costs ~150-200 us of CPU per
request in Python (ClientRequest/ClientResponse objects, multidicts, timers,
tracing hooks, connector bookkeeping), which made it the largest cost of
replication (a follower's Fetch round trip) and of the producer. This client is
an ``asyncio.Protocol`` per connection with ``httptools`` (llhttp, in C) parsing
the responses. Client CPU per sequential call against the same local aiohttp
server (``python -m common.http_bench``; 2 cores shared with other work, so the
range over three runs, each the median of 3 rounds of 1000 calls):

    case                  aiohttp session   this client
    small request/answer   185-244 us        48-92 us
    100 KiB request        240-363 us        90-191 us
    100 KiB answer         218-261 us        80-187 us

Under cProfile most of what remains is the socket send and epoll system calls
and the event loop; this module's own Python is a small part.

It speaks only to our own aiohttp servers (``broker``, ``controller``): plain
HTTP/1.1, no TLS, proxies, redirects, cookies, compression or ``Expect:
100-continue``; the response parser is a real one, so chunked bodies,
``Connection: close`` and bodies delimited by EOF are handled.

Connections: one pool per address, at most ``limit_per_host`` connections
(0: no limit), kept alive between calls. A caller that finds them all busy
waits its turn (FIFO): a released connection, or the right to open a new one,
is handed to the first waiter. A connection whose call failed, timed out or
was cancelled is closed, never reused, so a late answer can never be read as
the answer to the next request. A pooled connection that the server closed
while it was idle (aiohttp's keep-alive timeout, a restart) is dropped before
any request is written on it: ``connection_lost`` marks it dead, and a
non-blocking poll catches a close that the event loop has not read yet (one
cheap system call per request). One idle for ``max_idle_s`` (9 minutes, below
the servers' 10-minute ``connections.max.idle.ms``) is closed rather than
reused, so a request is not written just as the server closes it. After an
HTTP error status the connection is closed too (the server may not have read
the whole body). A request that
was written is never sent again: a produce is not idempotent, so a connection
that breaks after the write is the caller's ``RpcConnectionError``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import json
import select
import socket
import time
from typing import Any, cast

import httptools

from common.wire import CONTENT_TYPE, decode, encode


class RpcError(Exception):
    pass


class RpcConnectionError(RpcError):
    """The peer could not be reached, the connection broke, or the call timed out."""


class RpcBadRequest(RpcError):
    """The peer rejected the body (HTTP 4xx); the message is the server's."""


DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024 * 1024
_MAX_HEADER_BYTES = 64 * 1024


def fetch_response_limit(max_bytes: int) -> int:
    """``max_response_bytes`` for a fetch asking for ``max_bytes``: an answer may pass it by one batch (the first
    is always whole), so room for a large setting too."""
    return max(DEFAULT_MAX_RESPONSE_BYTES, 2 * max_bytes)


# Below this, headers and body are joined and written with one send; above it they are written
# separately so that a large body is not copied (Python 3.11's ``writelines`` joins too).
_JOIN_MAX_BYTES = 16 * 1024


_POLLRDHUP = getattr(select, "POLLRDHUP", 0)  # Linux: the peer closed its side (POLLIN shows it too)


class _Broken(ConnectionError):
    """The connection broke, or the response could not be parsed; the message says which."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: at most one request in flight, the response parsed by ``httptools``.

    ``begin`` arms it for one response; ``answer`` is resolved with the body when the response is
    complete (``status``, ``keep_alive`` and ``content_type`` are then set), or fails with ``_Broken``.
    """

    __slots__ = ("_body", "_framed", "_header_bytes", "_headers_done", "_lost", "_parser", "_peer_eof",
                 "_received", "alive", "answer", "content_type", "idle_since", "keep_alive", "max_bytes", "poller",
                 "status", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.poller: select.poll | None = None  # the transport's socket, for ``still_open``
        self.alive = True  # False once closed, closing, broken or sent something unasked
        self.idle_since = 0.0  # monotonic time it went back to its pool
        self.answer: asyncio.Future[bytes] | None = None
        self.status = 0
        self.keep_alive = False
        self.content_type = b""
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._received = 0  # body bytes of this response so far
        self._header_bytes = 0
        self.max_bytes = DEFAULT_MAX_RESPONSE_BYTES  # of one response's body; set per call by ``begin``
        self._framed = False  # Content-Length or Transfer-Encoding seen; else the body ends at EOF
        self._headers_done = False
        self._peer_eof = False
        self._lost: asyncio.Future[None] | None = None

    def usable(self) -> bool:
        return self.alive and self.transport is not None and not self.transport.is_closing()

    def still_open(self) -> bool:
        """``usable``, and no close (or stray byte) from the server waiting in the socket that the
        event loop has not read yet: one non-blocking ``poll``, so that a connection the server closed
        a moment ago (keep-alive timeout, restart) is dropped before a request is written on it.

        It polls the transport's own socket, registered when the connection was made, and keeps no
        socket object of its own: only the transport ever closes the fd (an event loop that manages
        fds itself, such as uvloop, would not know about a second owner)."""
        if not self.usable() or self.poller is None:
            return False
        if not self.poller.poll(0):
            return True
        self.alive = False
        return False

    def begin(self, answer: asyncio.Future[bytes], max_bytes: int) -> None:
        self.answer = answer
        self.max_bytes = max_bytes
        self.status = 0
        self.keep_alive = False

    def abort(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.abort()

    async def wait_closed(self) -> None:
        if self._lost is not None and not self._lost.done():
            await asyncio.shield(self._lost)

    def _fail(self, message: str) -> None:
        self.alive = False
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(_Broken(message))

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not necessarily a subclass of asyncio.Transport (uvloop's is not).
        self.transport = cast(asyncio.Transport, transport)
        self._lost = asyncio.get_running_loop().create_future()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.poller = select.poll()
            self.poller.register(sock.fileno(), select.POLLIN | select.POLLPRI | _POLLRDHUP)

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None or answer.done():  # nothing asked: stray or late bytes; trust it no more
            self.abort()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"malformed HTTP response: {exc}")
            self.abort()
            return
        if not self.alive:  # a callback refused the response (too large) or saw one nobody asked for
            self.abort()

    def eof_received(self) -> bool | None:
        self.alive = False
        self._peer_eof = True
        return None  # let the transport close; connection_lost settles an unfinished answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        answer = self.answer
        if answer is not None and not answer.done():
            if self._peer_eof and exc is None and self._headers_done and not self._framed:
                self.status = self._parser.get_status_code()  # a body delimited by the close
                answer.set_result(b"".join(self._body))
            else:
                reason = f": {exc.__class__.__name__}: {exc}" if exc is not None else ""
                self._fail(f"connection closed before the response was complete{reason}")
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.answer is None or self.answer.done():
            self.alive = False  # a second response in one read: nothing asked for it
        self._body = []
        self._received = 0
        self._header_bytes = 0
        self._framed = False
        self._headers_done = False
        self.content_type = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > _MAX_HEADER_BYTES:
            self._fail(f"response headers longer than {_MAX_HEADER_BYTES} bytes")
            return
        name = name.lower()
        if name == b"content-type":
            self.content_type = value
        elif name in (b"content-length", b"transfer-encoding"):
            self._framed = True
            value = value.strip()
            if name == b"content-length" and value.isdigit() and (len(value) > 18 or int(value) > self.max_bytes):
                self._fail(f"response of {value[:20].decode()} bytes, above the limit of {self.max_bytes}")

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        if not self.alive:
            return  # refused already: keep nothing more
        self._received += len(body)
        if self._received > self.max_bytes:
            self._body = []
            self._fail(f"response body above the limit of {self.max_bytes} bytes")
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        answer = self.answer
        if answer is None or answer.done():
            self.alive = False
            return
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        body = self._body
        self._body = []
        answer.set_result(body[0] if len(body) == 1 else b"".join(body))


# A pooled connection idle this long is closed rather than reused: below the servers' connections.max.idle.ms
# (10 minutes), so that a request is not written on a connection the server is closing just then (lost as a
# connection error, never resent). Kafka's clients default to 9 minutes against the broker's 10 for this.
CLIENT_MAX_IDLE_S = 540.0


class _Pool:
    """The connections to one address; at most ``limit`` of them, open, opening or idle."""

    def __init__(self, address: str, limit: int, max_idle_s: float = CLIENT_MAX_IDLE_S) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"address must be host:port, got {address!r}")
        self.host = host.strip("[]")
        self.port = int(port)
        self.address = address
        self.limit = limit if limit > 0 else 1 << 30
        self.max_idle_s = max_idle_s
        self.size = 0  # connections counted against the limit: open, opening, in use or idle
        self.idle: list[_Connection] = []
        self.conns: set[_Connection] = set()
        self.waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()
        self.closed = False
        self.post_heads: dict[str, bytes] = {}

    def post_head(self, api: str) -> bytes:
        """The request line and headers of a POST to ``api``, up to the Content-Length value."""
        head = self.post_heads.get(api)
        if head is None:
            head = (f"POST /v1/{api} HTTP/1.1\r\nHost: {self.address}\r\n"
                    f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: ").encode("latin-1")
            self.post_heads[api] = head
        return head

    async def acquire(self, deadline: float) -> _Connection:
        while self.idle:  # most recently used first: the least likely to have been closed by the server
            conn = self.idle.pop()
            if self._reusable(conn, time.monotonic()):
                return conn
            conn.abort()
            self.size -= 1  # closed (or idle too long) before any request was written on it
            self.conns.discard(conn)
        if self.size < self.limit and not self.waiters:
            self.size += 1
            return await self._open(deadline)
        waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                handed = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(waiter.result(), reuse=True)  # handed over as we gave up: pass it on
            else:
                self._forget(waiter)
            raise
        if handed is not None and handed.still_open():
            return handed
        if handed is not None:  # died between the hand-over and now: its slot is ours for a new one
            handed.abort()
            self.conns.discard(handed)
        return await self._open(deadline)

    async def _open(self, deadline: float) -> _Connection:
        """Open a connection for a slot already counted in ``size``; the slot is given back on failure."""
        try:
            async with asyncio.timeout_at(deadline):
                conn = await self._connect()
        except BaseException:
            self._free_slot()
            raise
        if self.closed:
            conn.abort()
            self._free_slot()
            raise _Broken("client closed")
        self.conns.add(conn)
        return conn

    async def _connect(self) -> _Connection:
        """Connect to each address in turn; a failure raises the last address's own error (for a refused
        port, ``ConnectionRefusedError``), where ``create_connection(host, port)`` would fold the errors of
        several addresses into one "Multiple exceptions" ``OSError``."""
        loop = asyncio.get_running_loop()
        try:  # an IP address needs no resolver (whose thread pool would cost more than the connect)
            ip = ipaddress.ip_address(self.host)
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            infos: list[tuple[Any, ...]] = [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                                             (self.host, self.port))]
        except ValueError:
            infos = list(await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM))
        error: OSError = OSError(f"no address for {self.host}")
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, addr)
                _, conn = await loop.create_connection(_Connection, sock=sock)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            return conn
        raise error

    def _reusable(self, conn: _Connection, now: float) -> bool:
        return conn.still_open() and now - conn.idle_since < self.max_idle_s

    def drop_idle(self, now: float) -> bool:
        """Close the idle connections ``acquire`` would not reuse; True if none is left idle."""
        keep = []
        for conn in self.idle:
            if self._reusable(conn, now):
                keep.append(conn)
            else:
                conn.abort()
                self.size -= 1
                self.conns.discard(conn)
        self.idle = keep
        return not keep

    def release(self, conn: _Connection | None, *, reuse: bool) -> None:
        """Give back ``conn`` after a call; ``reuse`` only when its response was read in full."""
        if conn is not None and reuse and conn.usable() and not self.closed:
            waiter = self._next_waiter()
            if waiter is not None:
                waiter.set_result(conn)
            else:
                conn.answer = None
                conn.idle_since = time.monotonic()
                self.idle.append(conn)
            return
        if conn is not None:
            conn.abort()
            self.conns.discard(conn)
        self._free_slot()

    def _free_slot(self) -> None:
        waiter = self._next_waiter()
        if waiter is not None:
            waiter.set_result(None)  # the slot passes on: the waiter opens a connection
        else:
            self.size -= 1

    def _next_waiter(self) -> asyncio.Future[_Connection | None] | None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                return waiter
        return None

    def _forget(self, waiter: asyncio.Future[_Connection | None]) -> None:
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)

    async def close(self) -> None:
        self.closed = True
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(_Broken("client closed"))
        conns = list(self.conns)
        for conn in conns:
            conn.abort()
        self.idle.clear()
        for conn in conns:
            await conn.wait_closed()


class RpcClient:
    def __init__(self, *, limit_per_host: int = 8, timeout_s: float = 30.0,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES, max_idle_s: float = CLIENT_MAX_IDLE_S) -> None:
        self._limit_per_host = limit_per_host
        self._max_idle_s = max_idle_s
        self._timeout_s = timeout_s
        self._max_response_bytes = max_response_bytes
        self._pools: dict[str, _Pool] = {}

    def _pool(self, address: str) -> _Pool:
        pool = self._pools.get(address)
        if pool is None:
            self._sweep()
            pool = self._pools[address] = _Pool(address, self._limit_per_host, self._max_idle_s)
        return pool

    def _sweep(self) -> None:
        """When a new address is first used: close the idle connections that are closed or idle too long, and
        forget the pools left with none. The pools of addresses no longer used (a broker gone, its port now
        another's) kept a socket each, closed by the server after its idle time and never by us."""
        now = time.monotonic()
        for address, pool in list(self._pools.items()):
            if pool.drop_idle(now) and not pool.size and not pool.waiters:
                del self._pools[address]

    async def call(self, address: str, api: str, body: dict[str, Any], *,
                   timeout_s: float | None = None, max_response_bytes: int | None = None) -> dict[str, Any]:
        """POST ``body`` to ``http://<address>/v1/<api>``; ``address`` is ``host:port``."""
        data = encode(body)
        try:
            pool = self._pool(address)
            head = pool.post_head(api) + b"%d\r\n\r\n" % len(data)
            status, _, payload = await self._exchange(pool, head, data, timeout_s, max_response_bytes)
        except (TimeoutError, OSError, ValueError) as exc:
            raise RpcConnectionError(f"{api} to {address}: {_describe(exc, timeout_s, self._timeout_s)}") from exc
        if not 200 <= status < 300:
            message = f"{api} to {address}: HTTP {status}: {payload.decode('utf-8', 'replace')[:500]}"
            if 400 <= status < 500:
                raise RpcBadRequest(message)
            if status >= 500:  # acted on or not, unknown; a later call may succeed (Kafka: retriable)
                raise RpcConnectionError(message)
            raise RpcError(message)  # 1xx, 3xx: not an answer of our servers
        try:
            result = decode(payload)
        except Exception as exc:  # msgpack raises several unrelated types (ExtraData, FormatError, ...)
            # Not our peer's answer (a proxy's HTML page, a different service on the port): a failed call,
            # as one that never got an answer, for the caller to log and retry.
            raise RpcError(f"{api} to {address}: response is not msgpack ({exc.__class__.__name__}): "
                           f"{payload[:80]!r}") from exc
        if not isinstance(result, dict):
            raise RpcError(f"{api} to {address}: response is not a map")
        return result

    async def get_json(self, address: str, path: str, *, timeout_s: float | None = None) -> Any:
        """GET ``http://<address><path>`` and decode its JSON; HTTP >= 400, or a body that is not
        ``application/json``, raise ``RpcConnectionError`` (as aiohttp's ``raise_for_status`` and
        ``json()`` did); a malformed JSON body raises ``ValueError``."""
        try:
            pool = self._pool(address)
            head = (f"GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: application/json\r\n\r\n"
                    ).encode("latin-1")
            status, content_type, payload = await self._exchange(pool, head, b"", timeout_s, None)
            if not 200 <= status < 300:
                raise _Broken(f"HTTP {status}: {payload.decode('utf-8', 'replace')[:500]}")
            content_type = content_type.partition(b";")[0].strip().lower()
            if content_type != b"application/json" and not content_type.endswith(b"+json"):
                raise _Broken(f"expected application/json, got {content_type.decode('latin-1')!r}")
        except (TimeoutError, OSError, ValueError) as exc:
            raise RpcConnectionError(
                f"GET {path} from {address}: {_describe(exc, timeout_s, self._timeout_s)}") from exc
        return json.loads(payload)

    async def _exchange(self, pool: _Pool, head: bytes, data: bytes, timeout_s: float | None,
                        max_response_bytes: int | None) -> tuple[int, bytes, bytes]:
        """Write one request on a pooled connection and read its response, all within the timeout;
        return the status, the Content-Type and the body.

        The connection goes back to the pool only when the response was read in full and the server
        keeps it alive; on any failure, timeout or cancellation it is closed. It is also closed after
        an HTTP error status or while part of the request is still unsent: a server that answered
        before reading the whole body would read the rest as the next request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_s if timeout_s is not None else self._timeout_s)
        conn = await pool.acquire(deadline)
        answer: asyncio.Future[bytes] = loop.create_future()
        timer = loop.call_at(deadline, _expire, answer)
        reuse = False
        try:
            conn.begin(answer, max_response_bytes if max_response_bytes is not None else self._max_response_bytes)
            transport = conn.transport
            assert transport is not None
            if len(data) <= _JOIN_MAX_BYTES:
                transport.write(head + data)
            else:
                transport.write(head)
                transport.write(data)
            payload = await answer
            status = conn.status
            reuse = conn.keep_alive and 200 <= status < 300 and not transport.get_write_buffer_size()
        finally:
            timer.cancel()
            pool.release(conn, reuse=reuse)
        return status, conn.content_type, payload

    async def close(self) -> None:
        """Close every connection; calls in flight fail with ``RpcConnectionError``. The client stays
        usable: a later call opens new connections."""
        pools = list(self._pools.values())
        self._pools.clear()
        for pool in pools:
            await pool.close()


def _expire(answer: asyncio.Future[bytes]) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError())


def _describe(exc: BaseException, timeout_s: float | None, default_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"TimeoutError: no response within {timeout_s if timeout_s is not None else default_s}s"
    if isinstance(exc, _Broken):
        return str(exc)
    return f"{exc.__class__.__name__}: {exc}"
