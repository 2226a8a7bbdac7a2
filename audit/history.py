"""The workload history: what clients tried and what they saw.

Chaos runs record every produce attempt and every record a consumer read, one
JSON object per line, in a file whose name contains ``history`` (for example
``history.jsonl``). The export turns it into the ``sends`` and ``polls``
Parquet tables that the Spark audit joins against the brokers' own logs.

Line format (all times are wall-clock milliseconds; unknown fields are kept
out of the tables but tolerated, so the writer may add context)::

    {"type": "send", "process": "p3", "seq": 17, "topic": "t", "key": "k17", "value": "p3-17",
     "start_ms": 1700000000000, "time_ms": 1700000000012,
     "outcome": "ok", "partition": 0, "offset": 42, "error": null}
    {"type": "poll", "process": "c1", "seq": 9, "topic": "t", "partition": 0, "offset": 42,
     "key": "k17", "value": "p3-17", "time_ms": 1700000000050}
    {"type": "nemesis", "time_ms": 1700000000100, "fault": "kill", "target": "broker-2", "detail": "..."}

- ``process`` names one logical client: the audit checks that the offsets one
  process reads on one partition only move forward by one, as Jepsen's Kafka
  workload does, so a client that repositions on purpose (a seek, a restart)
  should continue under a new process name. The chaos consumer (``c0``) keeps
  its name through the client's own reset after OFFSET_OUT_OF_RANGE, which
  happens only when records it was positioned on vanished: the audit then
  reports ``non_monotonic_polls``, on purpose. When the export merges several
  history files, it prefixes each file's process names with the file's stem.
- ``seq`` orders the events of one process (``time_ms`` may tie).
- ``outcome`` is ``ok`` (acknowledged with acks=all; ``partition`` and
  ``offset`` are the acknowledged position), ``fail`` (definitely not written,
  e.g. NOT_ENOUGH_REPLICAS before the append) or ``info`` (indeterminate: a
  timeout or a connection lost after sending; the record may or may not be in
  the log). ``error`` is a short text for ``fail``/``info``.
- ``key`` and ``value`` are UTF-8 text (the bytes the producer sent), or null.
  A null ``key`` is not compared by the audit (the chaos workload records none).
- Integers must fit a signed 64-bit integer (``partition`` 32-bit), the Parquet
  columns they end up in; text must be valid Unicode (no lone surrogate such as
  ``"\\ud800"``).

The reader is strict: a malformed line (or one that is not UTF-8) is a
``HistoryFormatError`` naming the file and line (numbered from 1), except a
torn last line (no trailing newline, e.g. the writer was killed), which is
skipped and counted.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


class Outcome(enum.Enum):
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


class HistoryFormatError(ValueError):
    """A history line that is not what the format above describes."""

    def __init__(self, path: Path | str, line_no: int, reason: str) -> None:
        super().__init__(f"{path}:{line_no}: {reason}")
        self.path = str(path)
        self.line_no = line_no
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SendEvent:
    process: str
    seq: int
    topic: str
    key: str | None
    value: str | None
    start_ms: int
    time_ms: int
    outcome: Outcome
    partition: int | None = None
    offset: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PollEvent:
    process: str
    seq: int
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None
    time_ms: int


@dataclass(frozen=True, slots=True)
class NemesisEvent:
    time_ms: int
    fault: str
    target: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class History:
    sends: list[SendEvent] = field(default_factory=list)
    polls: list[PollEvent] = field(default_factory=list)
    nemesis: list[NemesisEvent] = field(default_factory=list)
    torn_lines: int = 0


# ---------------------------------------------------------------- encoding

def event_to_dict(event: SendEvent | PollEvent | NemesisEvent) -> dict[str, Any]:
    if isinstance(event, SendEvent):
        return {"type": "send", "process": event.process, "seq": event.seq, "topic": event.topic,
                "key": event.key, "value": event.value, "start_ms": event.start_ms,
                "time_ms": event.time_ms, "outcome": event.outcome.value,
                "partition": event.partition, "offset": event.offset, "error": event.error}
    if isinstance(event, PollEvent):
        return {"type": "poll", "process": event.process, "seq": event.seq, "topic": event.topic,
                "partition": event.partition, "offset": event.offset, "key": event.key,
                "value": event.value, "time_ms": event.time_ms}
    return {"type": "nemesis", "time_ms": event.time_ms, "fault": event.fault,
            "target": event.target, "detail": event.detail}


def _checked(name: str, value: Any, kind: type, bits: int) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"field {name!r} has the wrong type ({type(value).__name__})")
    if isinstance(value, int) and not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ValueError(f"field {name!r} is out of range for a signed {bits}-bit integer")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"field {name!r} is not valid Unicode text (a lone surrogate)") from None
    return value


def _req(obj: dict[str, Any], name: str, kind: type, *, bits: int = 64) -> Any:
    if name not in obj:
        raise ValueError(f"missing field {name!r}")
    return _checked(name, obj[name], kind, bits)


def _opt(obj: dict[str, Any], name: str, kind: type, *, bits: int = 64) -> Any:
    value = obj.get(name)
    return None if value is None else _checked(name, value, kind, bits)


def _parse_send(obj: dict[str, Any]) -> SendEvent:
    outcome_text = _req(obj, "outcome", str)
    try:
        outcome = Outcome(outcome_text)
    except ValueError:
        raise ValueError(f"outcome must be ok, fail or info, not {outcome_text!r}") from None
    time_ms = _req(obj, "time_ms", int)
    partition = _opt(obj, "partition", int, bits=32)
    offset = _opt(obj, "offset", int)
    if outcome is Outcome.OK and (partition is None or offset is None or offset < 0):
        raise ValueError("an ok send needs its partition and offset")
    return SendEvent(process=_req(obj, "process", str), seq=_req(obj, "seq", int),
                     topic=_req(obj, "topic", str), key=_opt(obj, "key", str),
                     value=_opt(obj, "value", str), start_ms=_opt(obj, "start_ms", int) or time_ms,
                     time_ms=time_ms, outcome=outcome, partition=partition, offset=offset,
                     error=_opt(obj, "error", str))


def _parse_poll(obj: dict[str, Any]) -> PollEvent:
    offset = _req(obj, "offset", int)
    if offset < 0:
        raise ValueError("a poll offset is never negative")
    return PollEvent(process=_req(obj, "process", str), seq=_req(obj, "seq", int),
                     topic=_req(obj, "topic", str), partition=_req(obj, "partition", int, bits=32),
                     offset=offset, key=_opt(obj, "key", str), value=_opt(obj, "value", str),
                     time_ms=_req(obj, "time_ms", int))


def _parse_nemesis(obj: dict[str, Any]) -> NemesisEvent:
    return NemesisEvent(time_ms=_req(obj, "time_ms", int), fault=_req(obj, "fault", str),
                        target=str(obj.get("target", "")), detail=str(obj.get("detail") or ""))


def parse_event(line: str) -> SendEvent | PollEvent | NemesisEvent:
    """One line -> one event; ``ValueError`` with a readable reason otherwise."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError("a history line is a JSON object")
    kind = obj.get("type")
    if kind == "send":
        return _parse_send(obj)
    if kind == "poll":
        return _parse_poll(obj)
    if kind == "nemesis":
        return _parse_nemesis(obj)
    raise ValueError(f"unknown event type {kind!r} (send, poll or nemesis)")


# ---------------------------------------------------------------- files

class HistoryWriter:
    """Appends events as JSON lines; each line is flushed so a killed run leaves whole lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = path.open("a", encoding="utf-8")

    def write(self, event: SendEvent | PollEvent | NemesisEvent) -> None:
        self._file.write(json.dumps(event_to_dict(event), separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number from 1, text, complete) for every non-blank line; ``HistoryFormatError`` for a
    whole line that is not UTF-8 (decoded line by line so that the error names its line)."""
    with path.open("rb") as f:
        for line_no, data in enumerate(f, start=1):
            try:
                raw = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                if exc.reason == "unexpected end of data" and not data.endswith(b"\n"):
                    yield line_no, data[:exc.start].decode("utf-8"), False  # torn inside a character
                    continue
                raise HistoryFormatError(path, line_no, f"not UTF-8 text ({exc.reason} at byte {exc.start} "
                                                        "of the line)") from None
            if raw.strip():
                yield line_no, raw, raw.endswith("\n")


def read_history(path: Path) -> History:
    """Every event of a history file; ``HistoryFormatError`` for a bad line."""
    sends: list[SendEvent] = []
    polls: list[PollEvent] = []
    nemesis: list[NemesisEvent] = []
    torn = 0
    for line_no, text, complete in iter_lines(path):
        try:
            event = parse_event(text)
        except ValueError as exc:
            if not complete:  # the writer died mid-line: the last line is torn
                torn += 1
                continue
            raise HistoryFormatError(path, line_no, str(exc)) from None
        if isinstance(event, SendEvent):
            sends.append(event)
        elif isinstance(event, PollEvent):
            polls.append(event)
        else:
            nemesis.append(event)
    return History(sends=sends, polls=polls, nemesis=nemesis, torn_lines=torn)


def find_history_files(path: Path) -> list[Path]:
    """A history file, or the files in a directory whose names contain ``history``."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and "history" in p.name)
    return [path]
