"""Leader-epoch cache: which leader epoch started at which offset (pure; no I/O).

Entries ``(epoch, start_offset)`` are strictly increasing in both fields. The
owner (``Log``) passes ``on_change`` to persist the entries to the
``leader-epoch-checkpoint`` file (see ``storage.checkpoint``) after every change,
as Kafka's ``LeaderEpochFileCache`` flushes on every change.

Semantics follow Kafka:
- ``assign(epoch, start)``: an epoch older than the latest is stale and ignored;
  the latest epoch with a start offset not below its recorded one is a no-op;
  otherwise entries that would break monotonicity (epoch >= new epoch or
  start >= new start) are removed and the entry appended.
- ``end_offset_for(epoch, leo)`` (KIP-279): the largest known epoch <= the
  requested one, and its end offset (the next epoch's start offset, or the LEO
  for the latest epoch); ``(-1, -1)`` if the requested epoch is newer than any
  known or the cache is empty.
- ``truncate_from_end(offset)`` drops entries starting at or after ``offset``;
  ``truncate_from_start(offset)`` drops entries wholly before ``offset`` and
  moves the survivor that covers it to start at ``offset``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    def __init__(self, entries: list[EpochEntry] | None = None,
                 on_change: Callable[[list[EpochEntry]], None] | None = None) -> None:
        self._entries: list[EpochEntry] = []
        self._on_change = on_change
        for e in entries or []:
            # As ``assign``, but a stale or non-monotonic entry is refused rather than dropped or made to
            # truncate its predecessors: initial entries come from a file or a rebuild, and entries that
            # break the cache's order mean the source is damaged (``checkpoint.read_epochs`` says so first).
            if e.epoch < 0 or e.start_offset < 0:
                raise ValueError(f"invalid epoch entry ({e.epoch}, {e.start_offset})")
            last = self._entries[-1] if self._entries else None
            if last is not None and (e.epoch <= last.epoch or e.start_offset <= last.start_offset):
                raise ValueError(f"epoch entry ({e.epoch}, {e.start_offset}) does not follow "
                                 f"({last.epoch}, {last.start_offset})")
            self._entries.append(e)

    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    def latest_epoch(self) -> int | None:
        return self._entries[-1].epoch if self._entries else None

    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the cache changed."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid epoch entry ({epoch}, {start_offset})")
        changed = self._assign(EpochEntry(epoch, start_offset))
        if changed:
            self._changed()
        return changed

    def _assign(self, entry: EpochEntry) -> bool:
        last = self._entries[-1] if self._entries else None
        if last is not None:
            if entry.epoch < last.epoch:
                return False  # stale epoch: ignored
            if entry.epoch == last.epoch and entry.start_offset >= last.start_offset:
                return False
        while self._entries and (self._entries[-1].epoch >= entry.epoch
                                 or self._entries[-1].start_offset >= entry.start_offset):
            self._entries.pop()
        self._entries.append(entry)
        return True

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch whose range holds ``offset`` (None before the first entry)."""
        i = bisect_right([e.start_offset for e in self._entries], offset) - 1
        return self._entries[i].epoch if i >= 0 else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if self._entries[-1].epoch == requested_epoch:
            return requested_epoch, log_end_offset
        epochs = [e.epoch for e in self._entries]
        higher = bisect_right(epochs, requested_epoch)
        if higher == len(self._entries):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._entries[0].start_offset
        return self._entries[higher - 1].epoch, self._entries[higher].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        if end_offset < 0 or not self._entries or self._entries[-1].start_offset < end_offset:
            return
        self._entries = [e for e in self._entries if e.start_offset < end_offset]
        self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        removed = [e for e in self._entries if e.start_offset <= start_offset]
        if not removed or (len(removed) == 1 and removed[0].start_offset == start_offset):
            return
        kept = [e for e in self._entries if e.start_offset > start_offset]
        self._entries = [EpochEntry(removed[-1].epoch, start_offset), *kept]
        self._changed()

    def clear(self) -> None:
        if self._entries:
            self._entries = []
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(list(self._entries))
