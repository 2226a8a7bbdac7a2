"""Producer ids for ``init_producer_id``: blocks from the controller, handed out one id at a time.

Kafka's ``RPCProducerIdManager``: the broker asks the controller for a block of ids
(``allocate_producer_ids``, docs/protocol.md), hands them out in order, and asks for
the next block once 90% of the current one is used, so a busy broker rarely waits.
While it has no id to give (before the first block, or the controller is
unreachable) ``generate`` returns None and the handler answers
COORDINATOR_LOAD_IN_PROGRESS (retriable); the request that found no id starts
the fetch. A failed fetch is retried no sooner than ``RETRY_BACKOFF_MS`` later.
At most one fetch is in flight. A block that does not start at or after the end
of the last one is refused (Kafka: "not monotonic"): ids must never repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from common.clock import Clock
from common.logging import get_logger

log = get_logger("broker.producer_ids")

PREFETCH_FRACTION = 0.9  # Kafka's RPCProducerIdManager.PID_PREFETCH_THRESHOLD
RETRY_BACKOFF_MS = 100


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


FetchBlock = Callable[[], Awaitable[ProducerIdBlock | None]]


class ProducerIdManager:
    def __init__(self, fetch_block: FetchBlock, clock: Clock, *, retry_backoff_ms: int = RETRY_BACKOFF_MS) -> None:
        self._fetch_block = fetch_block
        self._clock = clock
        self._retry_backoff_ms = retry_backoff_ms
        self._current: ProducerIdBlock | None = None
        self._next_id = -1
        self._prefetched: ProducerIdBlock | None = None
        self._highest_end = 0  # end of the last block accepted: later blocks must start at or after it
        self._task: asyncio.Task[None] | None = None
        self._retry_at_ms = 0
        self._closed = False

    def generate(self) -> int | None:
        """The next producer id, or None while there is none to give (a block is being fetched)."""
        if self._current is None or self._next_id >= self._current.end:
            self._current, self._prefetched = self._prefetched, None
            self._next_id = -1 if self._current is None else self._current.start
        current = self._current
        if current is None:
            self.prefetch()
            return None
        pid = self._next_id
        self._next_id += 1
        if self._prefetched is None and self._next_id - current.start >= current.length * PREFETCH_FRACTION:
            self.prefetch()
        return pid

    def prefetch(self) -> None:
        """Start fetching a block unless one is in flight, one is waiting, or a failure is being backed off."""
        if self._closed or self._prefetched is not None or (self._task is not None and not self._task.done()):
            return
        if self._clock.monotonic_ms() < self._retry_at_ms:
            return
        self._task = asyncio.get_running_loop().create_task(self._fetch())

    async def _fetch(self) -> None:
        try:
            block = await self._fetch_block()
        except Exception as exc:  # the link maps RPC failures to None; anything else is a bug, logged
            log.exception("producer_id_block_failed", error=str(exc))
            block = None
        if block is not None and (block.length <= 0 or block.start < self._highest_end):
            log.error("producer_id_block_refused", start=block.start, length=block.length,
                      highest_end=self._highest_end)
            block = None
        if block is None:
            self._retry_at_ms = self._clock.monotonic_ms() + self._retry_backoff_ms
            return
        self._highest_end = block.end
        if self._current is None or self._next_id >= self._current.end:
            self._current, self._next_id = block, block.start
        else:
            self._prefetched = block
        log.info("producer_id_block_received", start=block.start, length=block.length)

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
