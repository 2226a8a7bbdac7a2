"""``mkdir -p`` that remembers what it made, so that a command which then fails can leave no directory
of its own behind (``cluster up``, ``chaos run --out``, ``export --out``); the lock that gives a data
directory to one process."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"


class DirLockedError(Exception):
    """Another process holds the directory's lock."""


def lock_dir(path: Path, owner: str) -> int:
    """Take ``path/.lock`` (``flock``, exclusive, not waiting) for this process and return its descriptor;
    closing it (or exiting) releases the lock. ``DirLockedError`` when another process holds it: two
    processes appending to one log, or one journal, would fork it (Kafka's ``LogManager.lockLogDirs``)."""
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise DirLockedError(f"{path} is in use by another {owner} process") from None
    return fd


def make_dirs(path: Path) -> Path | None:
    """``mkdir -p path``; the topmost directory it created (None if ``path`` existed), for the caller to
    remove if what follows fails. On ``OSError`` nothing it made stays, and the error is raised."""
    top = None
    for p in (path, *path.parents):
        if p.is_dir():
            break
        top = p
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        remove_empty_dirs(path, top)  # a partly made chain (a later mkdir refused)
        raise
    return top


def remove_empty_dirs(path: Path, created: Path | None) -> None:
    """Remove ``path`` and its parents up to ``created`` (what ``make_dirs`` made) while they are empty:
    anything written into them since, another run's data dir say, is never removed."""
    if created is None:
        return
    for d in (path, *path.parents):
        try:
            d.rmdir()
        except OSError:
            return
        if d == created:
            return
