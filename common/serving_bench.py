"""CPU per request body read: ``common.serving.read_body`` (with its idle deadline) against the plain loop it
replaced, on aiohttp ``StreamReader``s fed as a 100 KiB produce body arrives.

    .venv/bin/python -m common.serving_bench [--reads 20000] [--rounds 3]

Two cases: the body all in before the read starts (``buffered``), and the last 40 KB arriving after it (the
read waits once, which arms the idle timer). Prints microseconds per read, each round of each reader in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.base_protocol import BaseProtocol
from aiohttp.streams import StreamReader

from common.serving import read_body

FIRST, REST = b"x" * 65536, b"y" * 40000


async def plain_read(request: Any, max_bytes: int) -> bytes:
    """The loop before the idle deadline (broker/server.py until this session)."""
    content = request.content
    chunks: list[bytes] = []
    while not content.at_eof():
        chunk = await content.readany()
        if not chunk:
            break
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Transport:
    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


class _Handler:
    keepalive_timeout = 600.0


class _Request:
    def __init__(self, content: StreamReader) -> None:
        self.content, self.protocol, self.transport = content, _Handler(), None


def _rest(reader: StreamReader) -> None:
    reader.feed_data(REST)
    reader.feed_eof()


async def _time(read: Callable[[Any, int], Awaitable[bytes]], waits: bool, n: int) -> float:
    loop = asyncio.get_running_loop()
    protocol = BaseProtocol(loop)
    protocol.transport = _Transport()  # type: ignore[assignment]
    started = time.perf_counter()
    for _ in range(n):
        reader = StreamReader(protocol, 2**20, loop=loop)
        reader.feed_data(FIRST)
        if waits:
            loop.call_soon(_rest, reader)
        else:
            _rest(reader)
        await read(_Request(reader), 1 << 26)
    return (time.perf_counter() - started) / n * 1e6


async def _main(reads: int, rounds: int) -> None:
    for waits in (False, True):
        for _ in range(rounds):
            plain = await _time(plain_read, waits, reads)
            new = await _time(read_body, waits, reads)
            print(f"{'waits once' if waits else 'buffered':10}  plain loop {plain:6.2f} us   read_body {new:6.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(_main(args.reads, args.rounds))


if __name__ == "__main__":
    main()
