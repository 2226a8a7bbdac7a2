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

from aiohttp import web


class BodyStalled(Exception):
    """The request body stopped coming for ``connections.max.idle.ms``."""

    def response(self) -> web.Response:
        """HTTP 408 that closes the connection (the rest of the body will never be read)."""
        resp = web.Response(status=408, text=str(self))
        resp.force_close()
        return resp


async def read_body(request: web.BaseRequest, max_bytes: int) -> bytes:
    """The request body, copied once; HTTP 413 above ``max_bytes``; ``BodyStalled`` when it stops coming for
    the server's keep-alive timeout (``connections.max.idle.ms``).

    aiohttp's ``request.read()`` grows a ``bytearray`` and then copies it into ``bytes``: two copies,
    and with both buffers alive at once glibc grows and trims its heap for every 108 KiB produce
    body, ~22 page faults (42 us against 3 us for a join, measured in a loop). Joining the chunks
    as they come is one copy, none when the body arrived in one chunk."""
    content = request.content
    chunks: list[bytes] = []
    size = 0
    # A body already all in (the usual case) is read without a timer; one still arriving gets one, pushed on
    # by every chunk. When it fires, the body is ended early and reading from the connection stops (the
    # parser must not feed a body it has been told is over); the 408 then closes the connection.
    timer: asyncio.TimerHandle | None = None
    stalled = False
    idle_s = float(request.protocol.keepalive_timeout or 0)
    loop = asyncio.get_running_loop()
    last = loop.time()

    def check() -> None:
        nonlocal timer, stalled
        due = last + idle_s - loop.time()
        if due > 0:
            timer = loop.call_later(due, check)
            return
        timer, stalled = None, True
        if request.transport is not None:
            request.transport.pause_reading()
        content.feed_eof()

    try:
        while not content.at_eof():  # at_eof: the whole body is in and read, so no empty read to end the loop
            if timer is None and idle_s > 0 and not content.is_eof() and not stalled:
                timer = loop.call_later(idle_s, check)
            chunk = await content.readany()
            if not chunk:
                break
            if timer is not None:
                last = loop.time()
            size += len(chunk)
            if size > max_bytes:
                raise web.HTTPRequestEntityTooLarge(max_bytes, size)
            chunks.append(chunk)
    finally:
        if timer is not None:
            timer.cancel()
    if stalled:
        raise BodyStalled(f"the request body stopped coming: nothing for {idle_s:g} s after {size} bytes "
                          f"(connections.max.idle.ms); the connection is closed")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
