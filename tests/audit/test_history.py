"""The workload history format: writer, strict reader, torn last line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.history import (
    HistoryFormatError,
    HistoryWriter,
    NemesisEvent,
    Outcome,
    PollEvent,
    SendEvent,
    find_history_files,
    parse_event,
    read_history,
)


def test_round_trip(tmp_path: Path) -> None:
    events: list[SendEvent | PollEvent | NemesisEvent] = [SendEvent("p0", 0, "t", "k", "v", 10, 12, Outcome.OK, 1, 5),
              SendEvent("p0", 1, "t", None, "w", 13, 14, Outcome.INFO, error="timeout"),
              SendEvent("p1", 0, "t", "k", "x", 13, 14, Outcome.FAIL, error="NOT_ENOUGH_REPLICAS"),
              PollEvent("c0", 0, "t", 1, 5, "k", "v", 20),
              NemesisEvent(30, "kill", "broker-2", "SIGKILL")]
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as w:
        for e in events:
            w.write(e)
    h = read_history(path)
    assert h.sends == events[:3]
    assert h.polls == [events[3]]
    assert h.nemesis == [events[4]]
    assert h.torn_lines == 0
    first = json.loads(path.read_text().splitlines()[0])
    assert first == {"type": "send", "process": "p0", "seq": 0, "topic": "t", "key": "k", "value": "v",
                     "start_ms": 10, "time_ms": 12, "outcome": "ok", "partition": 1, "offset": 5, "error": None}


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as w:
        w.write(PollEvent("c0", 0, "t", 0, 0, None, "v", 1))
    with path.open("a") as f:
        f.write('{"type": "poll", "process": "c0", "se')
    h = read_history(path)
    assert len(h.polls) == 1 and h.torn_lines == 1


@pytest.mark.parametrize(("line", "reason"), [
    ("not json", "not JSON"),
    ("[1, 2]", "a history line is a JSON object"),
    ('{"type": "delete"}', "unknown event type"),
    ('{"type": "send", "process": "p", "seq": 0, "topic": "t", "time_ms": 1, "outcome": "maybe"}',
     "outcome must be ok, fail or info"),
    ('{"type": "send", "process": "p", "seq": 0, "topic": "t", "time_ms": 1, "outcome": "ok"}',
     "an ok send needs its partition and offset"),
    ('{"type": "send", "process": "p", "seq": "0", "topic": "t", "time_ms": 1, "outcome": "fail"}',
     "field 'seq' has the wrong type"),
    ('{"type": "poll", "process": "c", "seq": 0, "topic": "t", "partition": 0, "offset": -1, "time_ms": 1}',
     "never negative"),
    ('{"type": "poll", "process": "c", "seq": 0, "topic": "t", "partition": true, "offset": 1, "time_ms": 1}',
     "field 'partition' has the wrong type"),
    ('{"type": "poll", "process": "c", "seq": 0, "topic": "t", "partition": 2147483648, "offset": 1, "time_ms": 1}',
     "field 'partition' is out of range for a signed 32-bit integer"),
    ('{"type": "poll", "process": "c", "seq": 0, "topic": "t", "partition": 0, "offset": 9223372036854775808, '
     '"time_ms": 1}', "field 'offset' is out of range for a signed 64-bit integer"),
    ('{"type": "send", "process": "p", "seq": 0, "topic": "t", "time_ms": 1, "outcome": "fail", "key": "\\ud800"}',
     "field 'key' is not valid Unicode text"),
])
def test_bad_lines_are_clear_errors(tmp_path: Path, line: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_event(line)
    path = tmp_path / "history.jsonl"
    path.write_text('{"type": "nemesis", "time_ms": 1, "fault": "kill"}\n' + line + "\n")
    with pytest.raises(HistoryFormatError) as info:
        read_history(path)
    assert info.value.line_no == 2
    assert str(info.value).startswith(f"{path}:2: ")


def test_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_bytes(b"\xff\xfe\n")
    with pytest.raises(HistoryFormatError, match="not UTF-8") as info:
        read_history(path)
    assert info.value.line_no == 1  # numbered from 1, as for every other bad line


def test_find_history_files(tmp_path: Path) -> None:
    (tmp_path / "history.jsonl").write_text("")
    (tmp_path / "p2-history.jsonl").write_text("")
    (tmp_path / "summary.json").write_text("")
    assert [p.name for p in find_history_files(tmp_path)] == ["history.jsonl", "p2-history.jsonl"]
    assert find_history_files(tmp_path / "summary.json") == [tmp_path / "summary.json"]
