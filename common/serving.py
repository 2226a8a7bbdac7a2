"""Server-side request reading shared by the broker and the controller (both aiohttp servers).

``connections.max.idle.ms`` (Kafka's name and default, 10 minutes) bounds how long a client connection may
hold this process's resources without making progress, as Kafka's socket server closes connections idle for
that long:

- a connection with no request (never one, or none since the last answer) is closed by aiohttp's keep-alive
  timer: the server's ``keepalive_timeout`` is set from it;
- a request whose body stops coming (headers in, part of the body, then nothing) is answered HTTP 408 and its
  connection closed by ``read_body``: aiohttp has no deadline there, so such a request held its connection,
  and the handler waiting on it, for ever.

Without them, clients that open connections and go quiet (or a slow-loris sender) used up the process's file
descriptors; a broker then failed to open a segment file and halted for a data dir failure."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from common.logging import get_logger
from common.wire import BadRequest

log = get_logger("common.serving")


class _ClientFaultsAtInfo(logging.Filter):
    """A request aiohttp's parser refuses (a bad request line or header, a header line too long, a broken chunked
    encoding) is answered HTTP 400 before any handler runs, and aiohttp logs it as "Error handling request" at
    ERROR with a traceback. That is the client's fault, not this process's: one line at INFO, with what was
    wrong, as our handlers log the 400s they give. Errors of 500 and up keep their level and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500:
            # aiohttp's message shows the offending bytes on their own line, then a caret line under them
            reason = " ".join(line.strip() for line in (exc.message or "").splitlines() if line.strip(" ^"))
            reason = reason[:200] or type(exc).__name__
            record.msg = f"bad_http_request: {record.getMessage()}: HTTP {exc.code}, {reason}"
            record.args = None
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.exc_info, record.exc_text = None, None
        return True


# Both our servers (broker.server, controller.server) import this module; aiohttp logs through this logger.
_CLIENT_FAULTS_AT_INFO = _ClientFaultsAtInfo()
logging.getLogger("aiohttp.server").addFilter(_CLIENT_FAULTS_AT_INFO)


class BodyStalled(Exception):
    """The request body stopped coming for ``connections.max.idle.ms``."""

    def response(self) -> web.Response:
        """HTTP 408 that closes the connection (the rest of the body will never be read)."""
        resp = web.Response(status=408, text=str(self))
        resp.force_close()
        return resp


class ClientGone(BadRequest):
    """The client closed the connection before its request body was in: there is nobody to answer, and
    nothing to log above info. A ``BadRequest``: the guards answer it HTTP 400 (to nobody, aiohttp drops it)
    and log nothing."""


class _IdleWatch:
    """The deadline of a body read that waits for the client: ``idle_s`` after the read began waiting, pushed
    on by ``waiting``. When it passes with nothing of the body come meanwhile, the body is ended early and
    reading from the connection stops (the parser must not feed a body it has been told is over). Bytes that
    came count even when the timer runs first in the same loop pass (after a stall of the event loop, as
    aiohttp's keep-alive timer checks its waiter): the read will wake, and its next wait arms the timer again."""

    __slots__ = ("content", "handle", "idle_s", "last", "loop", "seen", "stalled", "transport")

    def __init__(self, request: web.BaseRequest, idle_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.content, self.transport, self.idle_s = request.content, request.transport, idle_s
        self.stalled = False
        self.handle: asyncio.TimerHandle | None = None
        self.last, self.seen = 0.0, 0
        self.waiting()

    def waiting(self) -> None:
        self.last, self.seen = self.loop.time(), self.content.total_bytes
        if self.handle is None:
            self.handle = self.loop.call_later(self.idle_s, self._check)

    def _check(self) -> None:
        self.handle = None
        if self.content.total_bytes != self.seen or self.content.is_eof():
            return  # more came: not stalled
        due = self.last + self.idle_s - self.loop.time()
        if due > 0:
            self.handle = self.loop.call_later(due, self._check)
            return
        self.stalled = True
        if self.transport is not None:
            self.transport.pause_reading()
        self.content.feed_eof()

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()


async def read_body(request: web.BaseRequest, max_bytes: int) -> bytes:
    """The request body, copied once; HTTP 413 above ``max_bytes``; ``BodyStalled`` when it stops coming for
    the server's keep-alive timeout (``connections.max.idle.ms``); ``BadRequest`` (HTTP 400) for a body
    aiohttp cannot decode (a ``Content-Encoding`` it does not match, a broken chunked encoding);
    ``ClientGone`` when the client closes the connection before the body is in.

    aiohttp's ``request.read()`` grows a ``bytearray`` and then copies it into ``bytes``: two copies,
    and with both buffers alive at once glibc grows and trims its heap for every 108 KiB produce
    body, ~22 page faults (42 us against 3 us for a join, measured in a loop). Joining the chunks
    as they come is one copy, none when the body arrived in one chunk. A body already in costs no timer;
    one the read must wait for gets one per request (~3 us, docs/benchmarks/broker.md)."""
    content = request.content
    chunks: list[bytes] = []
    size = 0
    watch: _IdleWatch | None = None
    try:
        while not content.at_eof():  # at_eof: the whole body is in and read, so no empty read to end the loop
            if content.total_bytes == size and not content.is_eof():  # nothing buffered: this read will wait
                if watch is not None:
                    watch.waiting()
                elif request.protocol.keepalive_timeout:
                    watch = _IdleWatch(request, float(request.protocol.keepalive_timeout))
            chunk = await content.readany()
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise web.HTTPRequestEntityTooLarge(max_bytes, size)
            chunks.append(chunk)
    except web.RequestPayloadError as exc:
        raise _unreadable(request, size, exc) from None
    except ConnectionError as exc:
        raise _gone(request, size, exc) from None
    finally:
        if watch is not None:
            watch.cancel()
    if watch is not None and watch.stalled:
        raise BodyStalled(f"the request body stopped coming: nothing for {watch.idle_s:g} s after {size} bytes "
                          f"(connections.max.idle.ms); the connection is closed")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _unreadable(request: web.BaseRequest, size: int, exc: web.RequestPayloadError) -> BadRequest:
    """aiohttp's parser failed on the body (it raised RequestPayloadError out of the read, and the guards
    answered error -1 with a traceback). The parser is in error for the rest of the connection: the body is
    ended here, so that aiohttp does not read it again after the answer (which raised the same error as an
    "Unhandled exception"), and the connection is closed once the 400 is written."""
    request.content.feed_eof()
    request.protocol.close()
    detail = " ".join(str(getattr(exc.__cause__, "message", None) or exc).split())
    return BadRequest(f"the request body cannot be read after {size} bytes: {detail}; the connection is closed")


def _gone(request: web.BaseRequest, size: int, exc: ConnectionError) -> ClientGone:
    log.info("request_body_lost", path=request.path, peer=request.remote, bytes_read=size,
             error=f"{exc.__class__.__name__}: {exc}")
    return ClientGone(f"the client closed the connection after {size} bytes of the request body")
