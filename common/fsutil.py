"""``mkdir -p`` that remembers what it made, so that a command which then fails can leave no directory
of its own behind (``cluster up``, ``chaos run --out``, ``export --out``)."""

from __future__ import annotations

from pathlib import Path


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
