"""Checks that a server closes client connections that make no progress for ``connections.max.idle.ms``
(common.serving), shared by the broker's and the controller's tests. Raw sockets on 127.0.0.1; every wait is
bounded."""

from __future__ import annotations

import asyncio

from common.http import RpcClient

PARTIAL_HEADERS = b"POST /v1/metadata HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/"
HEADERS_OF_A_100_BYTE_BODY = (b"POST /v1/metadata HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              b"Content-Type: application/msgpack\r\nContent-Length: 100\r\n\r\n")


async def _open_and_send(address: str, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def assert_idle_connections_are_closed(address: str, *, within_s: float = 20) -> None:
    """With ``connections.max.idle.ms`` well under ``within_s``: a connection that sends nothing, one that
    stops within its headers, and one that stops within its body are all closed by the server (the last with
    HTTP 408); a normal request on a fresh connection is still answered."""
    quiet = await _open_and_send(address, b"")
    half_headers = await _open_and_send(address, PARTIAL_HEADERS)
    half_body = await _open_and_send(address, HEADERS_OF_A_100_BYTE_BODY + b"\x81" + b"x" * 9)
    try:
        for reader, _ in (quiet, half_headers):
            assert await asyncio.wait_for(reader.read(), within_s) == b""  # EOF: closed by the server
        answer = await asyncio.wait_for(half_body[0].read(), within_s)  # to EOF
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"connections.max.idle.ms" in answer, answer
    finally:
        for _, writer in (quiet, half_headers, half_body):
            writer.close()
    rpc = RpcClient(timeout_s=10)
    try:
        await rpc.call(address, "metadata", {"topics": []})
    finally:
        await rpc.close()
