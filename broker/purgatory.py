"""Delayed operations with keyed waiters (Kafka ``DelayedOperation`` / ``DelayedOperationPurgatory``).

An operation waits under one or more keys (a ``TopicPartition``). Whoever
changes what it waits for (an append, a HW move, a leadership change) calls
``check_and_complete(key)``; the operation's ``try_complete`` decides whether
it can finish. Every operation completes exactly once: by its condition, by
expiry (``expire``) or by ``complete_all`` on shutdown.

No asyncio here: an operation reports its result through a callback, which
the shell wires to a future. The broker's shell expires each operation with an
event-loop timer of its own (``ReplicaManager._await_op``: real time, not
the injected clock); ``expire_due`` / ``next_deadline_ms`` serve a caller that
drives the clock itself (the unit tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from common.clock import Clock

R = TypeVar("R")


class DelayedOperation(Generic[R]):
    """Subclasses implement ``check`` (result or None) and ``expired_result``."""

    def __init__(self, deadline_ms: int, on_done: Callable[[R], None]) -> None:
        self.deadline_ms = deadline_ms
        self._on_done = on_done
        self.completed = False
        self.result: R | None = None
        self.keys: tuple[Hashable, ...] = ()  # set when watched

    def check(self) -> R | None:
        """The result if the operation can complete now, else None."""
        raise NotImplementedError

    def expired_result(self) -> R:
        raise NotImplementedError

    def force_complete(self, result: R) -> bool:
        """Complete with ``result`` unless already complete; True if this call completed it."""
        if self.completed:
            return False
        self.completed = True
        self.result = result
        self._on_done(result)
        return True

    def try_complete(self) -> bool:
        if self.completed:
            return False
        result = self.check()
        return result is not None and self.force_complete(result)


class Purgatory:
    """Operations watched by key; a bounded number of waiters overall."""

    def __init__(self, name: str, clock: Clock, *, max_waiting: int = 100_000) -> None:
        self.name = name
        self._clock = clock
        self._max_waiting = max_waiting
        self._watchers: dict[Hashable, list[DelayedOperation[object]]] = {}
        self._ops: set[DelayedOperation[object]] = set()

    def __len__(self) -> int:
        return len(self._ops)

    def try_complete_else_watch(self, op: DelayedOperation[R], keys: Iterable[Hashable]) -> bool:
        """Complete now if possible; else watch under ``keys``. True if completed now."""
        if op.try_complete():
            return True
        if len(self._ops) >= self._max_waiting:
            op.force_complete(op.expired_result())
            return True
        any_op: DelayedOperation[object] = op  # type: ignore[assignment]
        self._ops.add(any_op)
        op.keys = tuple(keys)
        watchers = self._watchers
        for key in op.keys:
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = [any_op]
            else:
                ops.append(any_op)
        return False

    def watch_entries(self) -> int:
        """How many (key, operation) pairs are watched: an operation waiting under k keys counts k times."""
        return sum(len(ops) for ops in self._watchers.values())

    def check_and_complete(self, key: Hashable) -> int:
        """Try every operation watching ``key``; a finished one stops being watched under *every* key it
        waits for, not only ``key``: a fetch over a busy and an idle partition, completed by the busy one,
        must not stay in the idle one's list until that changes. (Kafka purges such entries in bulk
        once enough accumulate, ``DelayedOperationPurgatory.purgeCompleted``; here each goes at once.)
        Returns how many this call completed."""
        ops = self._watchers.get(key)
        if not ops:
            return 0
        done = 0
        finished = []
        for op in list(ops):
            if op.try_complete():
                done += 1
            if op.completed:
                finished.append(op)
        for op in finished:
            self._forget(op)
        return done

    def expire(self, op: DelayedOperation[R]) -> bool:
        """Complete ``op`` with its expired result (its deadline passed, or its requester went away) and stop
        watching it; True if this call completed it. The shell calls this from the op's own timer."""
        done = op.force_complete(op.expired_result())
        self._forget(op)
        return done

    def _forget(self, op: DelayedOperation[R]) -> None:
        any_op: DelayedOperation[object] = op  # type: ignore[assignment]
        self._ops.discard(any_op)
        for key in op.keys:
            ops = self._watchers.get(key)
            if ops is None:
                continue
            with contextlib.suppress(ValueError):
                ops.remove(any_op)
            if not ops:
                del self._watchers[key]

    def expire_due(self) -> int:
        """Complete every operation whose deadline has passed with its expired result."""
        now = self._clock.monotonic_ms()
        due = [op for op in self._ops if not op.completed and op.deadline_ms <= now]
        for op in due:
            op.force_complete(op.expired_result())
        self.purge()
        return len(due)

    def next_deadline_ms(self) -> int | None:
        live = [op.deadline_ms for op in self._ops if not op.completed]
        return min(live) if live else None

    def complete_all(self, result_for: Callable[[DelayedOperation[object]], object]) -> int:
        """Complete every waiting operation with ``result_for(op)`` (shutdown: a retriable error)."""
        n = 0
        for op in list(self._ops):
            if op.force_complete(result_for(op)):
                n += 1
        self.purge()
        return n

    def _prune(self, key: Hashable) -> None:
        """Drop the finished operations watching ``key``, from its list and from the set of all (only those:
        this runs after every append and follower fetch)."""
        ops = self._watchers.get(key)
        if ops is None:
            return
        live = [op for op in ops if not op.completed]
        if len(live) == len(ops) and live:
            return
        for op in ops:
            if op.completed:
                self._ops.discard(op)
        if live:
            self._watchers[key] = live
        else:
            del self._watchers[key]

    def purge(self) -> None:
        self._ops = {op for op in self._ops if not op.completed}
        for key in list(self._watchers):
            self._prune(key)
