"""The controller's durable metadata: an append-only journal plus periodic snapshots.

On-disk format (both files in the controller's data dir)::

    metadata.journal    frame*            appended, fsynced before a change is acknowledged
    metadata.snapshot   one frame         written to a temp file, fsynced, renamed, dir fsynced
    .lock               empty             flock held while open: one controller per data dir

    frame   = length:u32 (big endian, payload bytes) | crc32(payload):u32 | payload
    journal payload  = msgpack {offset: int, records: [record map, ...]}
    snapshot payload = msgpack {offset: int, image: MetadataImage.to_snapshot()}

One frame holds all the records of one controller operation, so a crash never
leaves half an operation: the frame is either whole (length and CRC match) or a
torn tail that replay truncates away. A damaged frame with whole frames after it
cannot come from a crash (each frame is fsynced before the next is written): it
is disk damage, and replay refuses to start rather than cut acknowledged frames. ``offset`` grows by one per frame and
continues across snapshots; replay is the snapshot plus the journal frames with
a larger offset. After a snapshot the journal is replaced by an empty one (temp
file + rename); a crash between the two only leaves frames the snapshot already
covers, which replay skips.

Blocking I/O: the shell calls these methods through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.fsutil import DirLockedError, lock_dir
from common.wire import decode, encode
from controller.state import MetadataImage, Record, record_from_dict, record_to_dict
from storage.checkpoint import fsync_dir, write_atomic

JOURNAL_NAME = "metadata.journal"
SNAPSHOT_NAME = "metadata.snapshot"
_FRAME = struct.Struct(">II")


class JournalCorruptError(Exception):
    """A snapshot that fails its checksum, or a damaged journal frame with whole frames after it: the data
    dir is damaged, not torn by a crash."""


# Another process already owns this data dir (two controllers on one journal would fork it).
DataDirLockedError = DirLockedError


class JournalBrokenError(Exception):
    """A write or fsync failed; nothing more is appended (and so nothing more acknowledged)."""


def encode_frame(payload: dict[str, Any]) -> bytes:
    body = encode(payload)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def read_frames(buf: bytes) -> tuple[list[dict[str, Any]], int]:
    """Whole, valid frames from the start of ``buf`` and the byte length they cover.

    A frame's length has no cap other than the bytes there: the writer has none either (one operation's
    records, or the whole image, are one frame), and a cap here would turn a complete, fsynced frame above it
    into a "torn tail" and cut it and every acknowledged frame after it."""
    frames: list[dict[str, Any]] = []
    pos = 0
    while pos + _FRAME.size <= len(buf):
        length, crc = _FRAME.unpack_from(buf, pos)
        end = pos + _FRAME.size + length
        if end > len(buf):
            break
        body = buf[pos + _FRAME.size:end]
        if zlib.crc32(body) != crc:
            break
        try:
            doc = decode(body)
        except Exception:  # a CRC-valid frame that does not decode: treat as the torn tail
            break
        if not isinstance(doc, dict):
            break
        frames.append(doc)
        pos = end
    return frames, pos


class Journal:
    """Owns the two files; not thread-safe (the shell serialises calls)."""

    def __init__(self, data_dir: Path, *, offset: int, records_since_snapshot: int, lock_fd: int = -1) -> None:
        self.data_dir = data_dir
        self._lock_fd = lock_fd
        self.offset = offset  # offset of the last frame written or covered by the snapshot
        self.records_since_snapshot = records_since_snapshot
        self.truncated_bytes = 0
        self.broken: str | None = None
        created = not (data_dir / JOURNAL_NAME).exists()
        # unbuffered: a failed write leaves nothing behind in a buffer that a later close could flush
        self._file = open(data_dir / JOURNAL_NAME, "ab", buffering=0)  # noqa: SIM115 - held for the process lifetime
        if created:  # the new file's directory entry must be durable before a frame in it is acknowledged
            fsync_dir(data_dir)

    @classmethod
    def open(cls, data_dir: Path) -> tuple[Journal, MetadataImage]:
        """Replay the snapshot and the journal after it; truncate a torn tail."""
        data_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = lock_dir(data_dir, "controller")
        try:
            return cls._replay(data_dir, lock_fd)
        except BaseException:
            os.close(lock_fd)
            raise

    @classmethod
    def _replay(cls, data_dir: Path, lock_fd: int) -> tuple[Journal, MetadataImage]:
        image, offset = _load_snapshot(data_dir / SNAPSHOT_NAME)
        path = data_dir / JOURNAL_NAME
        raw = path.read_bytes() if path.exists() else b""
        frames, valid = read_frames(raw)
        offset, replayed = _apply_frames(image, frames, offset, path)
        if valid < len(raw):
            _refuse_damage_before_valid_frames(path, raw, valid)
            with open(path, "r+b") as f:
                f.truncate(valid)
                f.flush()
                os.fsync(f.fileno())
        journal = cls(data_dir, offset=offset, records_since_snapshot=replayed, lock_fd=lock_fd)
        journal.truncated_bytes = len(raw) - valid
        return journal, image

    def append(self, records: Sequence[Record]) -> int:
        """Write one frame holding ``records`` and fsync; returns its offset.

        A failed write or fsync leaves the journal refusing every later append: a torn frame
        followed by good ones would hide those from replay, and after a failed fsync the page
        cache cannot be trusted (PostgreSQL's lesson). The process must be restarted to replay.
        """
        if self.broken is not None:
            raise JournalBrokenError(f"journal unusable since an earlier failure: {self.broken}")
        offset = self.offset + 1
        frame = encode_frame({"offset": offset, "records": [record_to_dict(r) for r in records]})
        try:
            view = memoryview(frame)
            while view:
                written = self._file.write(view)
                if not written:
                    raise OSError("journal write made no progress")
                view = view[written:]
            os.fsync(self._file.fileno())
        except OSError as exc:
            self.broken = f"{exc.__class__.__name__}: {exc}"
            raise JournalBrokenError(f"journal append failed: {self.broken}") from exc
        self.offset = offset
        self.records_since_snapshot += len(records)
        return offset

    def snapshot(self, image: MetadataImage) -> str | None:
        """Write the image as of ``self.offset`` atomically, then start an empty journal; None, or why the
        snapshot could not be written.

        A snapshot that fails to be written changes nothing replay relies on (the old snapshot and the
        whole journal still replay), so the journal keeps serving and a later commit tries again. Once the
        snapshot is in place, a failure while starting the empty journal leaves the name pointing at who
        knows which file: the journal is broken (``JournalBrokenError``) and the process must restart,
        where the snapshot and whatever journal is there replay to the same image.
        """
        try:
            write_atomic(self.data_dir / SNAPSHOT_NAME,
                         encode_frame({"offset": self.offset, "image": image.to_snapshot()}))
        except OSError as exc:
            return f"{exc.__class__.__name__}: {exc}"
        try:
            write_atomic(self.data_dir / JOURNAL_NAME, b"")
            new = open(self.data_dir / JOURNAL_NAME, "ab", buffering=0)  # noqa: SIM115
        except OSError as exc:
            self.broken = f"{exc.__class__.__name__}: {exc}"
            raise JournalBrokenError(f"starting the journal after a snapshot failed: {self.broken}") from exc
        old, self._file = self._file, new
        with contextlib.suppress(OSError):
            old.close()
        self.records_since_snapshot = 0
        return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1


def _apply_frames(image: MetadataImage, frames: list[dict[str, Any]], offset: int, path: Path) -> tuple[int, int]:
    """Apply the records of the frames after ``offset`` (a snapshot at ``offset`` covers the others);
    -> (the last frame's offset, records applied). ``JournalCorruptError`` for a frame whose checksum
    holds but whose records do not decode (an unknown record type: written by a newer version)."""
    replayed = 0
    try:
        for frame in frames:
            frame_offset = int(frame.get("offset", -1))
            if frame_offset <= offset:
                continue
            for d in frame.get("records") or []:
                image.apply(record_from_dict(d))
                replayed += 1
            offset = frame_offset
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise JournalCorruptError(f"{path}: a journal frame does not decode: {exc}") from exc
    return offset, replayed


def _refuse_damage_before_valid_frames(path: Path, raw: bytes, bad: int) -> None:
    """``JournalCorruptError`` when the frame at ``bad`` fails its checks but a whole frame follows it.

    Frames are fsynced one after another, so a crash can only tear the last one: a damaged frame with a
    valid one after it is damage on the disk, and cutting the journal there (as for a torn tail) would
    drop acknowledged changes, leader epochs included, which the controller would then hand out again.
    Kafka's KRaft log truncates at the first bad batch too, but it has other voters to catch up from;
    this journal is the only copy, so it refuses to start instead. Only the frame boundary the damaged
    frame's own length gives is checked (a payload bit flip leaves it intact)."""
    if bad + _FRAME.size > len(raw):
        return
    length, _crc = _FRAME.unpack_from(raw, bad)
    after = bad + _FRAME.size + length
    if after >= len(raw):
        return
    following, _ = read_frames(raw[after:])
    if following:
        raise JournalCorruptError(
            f"{path}: the frame at byte {bad} is damaged but {len(following)} whole frame(s) follow it; this "
            "is not a torn tail from a crash, and cutting it would drop acknowledged changes. Refusing to "
            f"start: restore the data dir from a copy, or cut the file at byte {bad} to accept that loss")


def _load_snapshot(path: Path) -> tuple[MetadataImage, int]:
    if not path.exists():
        return MetadataImage(), 0
    raw = path.read_bytes()
    frames, valid = read_frames(raw)
    if len(frames) != 1 or valid != len(raw):
        raise JournalCorruptError(f"{path}: snapshot fails its checksum; refusing to start from damaged metadata")
    doc = frames[0]
    try:
        return MetadataImage.from_snapshot(doc["image"]), int(doc["offset"])
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalCorruptError(f"{path}: snapshot does not decode: {exc}") from exc


def read_image(data_dir: Path) -> MetadataImage:
    """The image replay would give, read-only: no lock, no truncation of a torn tail, nothing written.

    For tools that inspect a controller's data dir offline or while the controller runs (the audit's export):
    a torn tail (perhaps a frame being appended) is left out, as replay leaves it out. The journal is read
    before the snapshot: a controller writes its snapshot before it empties the journal, so whichever pair
    is read replays to an image at least as new as the journal read (frames the snapshot covers are
    skipped). A directory without either file is an empty image. ``JournalCorruptError`` for a damaged
    snapshot, a damaged frame with whole frames after it (as ``Journal.open``), or records that do not
    decode; ``OSError`` when a file cannot be read.
    """
    path = data_dir / JOURNAL_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raw = b""
    image, offset = _load_snapshot(data_dir / SNAPSHOT_NAME)
    frames, valid = read_frames(raw)
    if valid < len(raw):
        _refuse_damage_before_valid_frames(path, raw, valid)
    _apply_frames(image, frames, offset, path)
    return image
