"""Log files are JSON lines, also for records of the standard ``logging`` module: aiohttp rejecting a request
itself (a 20,000-character URL) once wrote a multi-line Python traceback into the broker's and controller's
JSON logs."""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest
import structlog

from common.logging import configure, get_logger
from tests.procs import start_controller, stop


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[tuple[Path, TextIO]]:
    """A file for stderr (as a cluster member's; see ``as_stderr``); logging as it was is restored afterwards."""
    saved_config = structlog.get_config()
    was_configured = structlog.is_configured()
    saved_handlers = list(logging.getLogger().handlers)
    path = tmp_path / "broker.log"
    with path.open("w", encoding="utf-8") as f:
        try:
            yield path, f
        finally:
            root = logging.getLogger()
            for h in list(root.handlers):
                if h not in saved_handlers:
                    root.removeHandler(h)
            structlog.configure(**saved_config)
            if not was_configured:
                structlog.reset_defaults()  # unconfigured again, as get_logger's fallback tells apart
            structlog.contextvars.clear_contextvars()


def as_stderr(monkeypatch: pytest.MonkeyPatch, f: TextIO) -> None:
    # in the test itself: pytest's output capture sets sys.stderr anew for each phase
    monkeypatch.setattr(sys, "stderr", f)


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines
    docs = []
    for line in lines:
        try:
            docs.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line in the log: {line!r}\n--- the log:\n" + "\n".join(lines))
    return docs


def test_library_records_with_tracebacks_are_one_json_line(log_file: tuple[Path, TextIO],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path, f = log_file
    as_stderr(monkeypatch, f)
    configure("broker", 1)  # as `minibroker broker` does, its stderr a file
    get_logger("broker").info("allocator_thresholds", fixed=True)
    try:
        raise ValueError("boom\nwith a second line")
    except ValueError:
        # what aiohttp's server does when its parser refuses a request line
        logging.getLogger("aiohttp.server").error("Error handling request from %s", "127.0.0.1", exc_info=True)
    logging.getLogger("some.library").warning("a warning\nover two lines")
    f.flush()
    docs = json_lines(path)
    assert len(docs) == 3
    ours, error, warning = docs
    # our own events: unchanged (no logger name added, the same keys)
    assert set(ours) == {"fixed", "event", "role", "node_id", "level", "timestamp"}
    assert ours["event"] == "allocator_thresholds" and ours["role"] == "broker" and ours["node_id"] == 1
    assert error["event"] == "Error handling request from 127.0.0.1"
    assert error["level"] == "error" and error["logger"] == "aiohttp.server"
    assert error["role"] == "broker" and error["node_id"] == 1 and "timestamp" in error
    assert error["exception"].startswith("Traceback (most recent call last):")
    assert "ValueError: boom\nwith a second line" in error["exception"]
    assert warning["event"] == "a warning\nover two lines" and warning["level"] == "warning"
    assert warning["logger"] == "some.library"


def test_configure_twice_installs_one_handler(log_file: tuple[Path, TextIO], monkeypatch: pytest.MonkeyPatch) -> None:
    path, f = log_file
    as_stderr(monkeypatch, f)
    configure("broker", 1)
    configure("broker", 2)
    logging.getLogger("aiohttp.server").error("once")
    f.flush()
    docs = json_lines(path)
    assert [d["event"] for d in docs] == ["once"] and docs[0]["node_id"] == 2


def test_level_filters_library_records_too(log_file: tuple[Path, TextIO], monkeypatch: pytest.MonkeyPatch) -> None:
    path, f = log_file
    as_stderr(monkeypatch, f)
    configure("client", level="ERROR")
    logging.getLogger("some.library").warning("not shown")
    logging.getLogger("some.library").error("shown")
    f.flush()
    assert [d["event"] for d in json_lines(path)] == ["shown"]


def test_before_configure_events_go_to_stdlib_logging_never_stdout(
        log_file: tuple[Path, TextIO], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """The client library used from plain Python: structlog's unconfigured default printed every event on stdout.
    A module's logger (made at import, before any configure) follows configure once it is called."""
    structlog.reset_defaults()
    early = get_logger("client.producer")
    with caplog.at_level(logging.INFO, logger="client.producer"):
        early.info("producer_id_assigned", producer_id=7)
        early.warning("producer_id_unavailable", max_block_ms=10)
    assert capsys.readouterr().out == ""
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("client.producer", "INFO", "producer_id_assigned producer_id=7"),
        ("client.producer", "WARNING", "producer_id_unavailable max_block_ms=10")]
    path, f = log_file
    as_stderr(monkeypatch, f)
    configure("client", level="INFO")  # as the CLI does: from now on structlog's JSON lines on stderr
    early.info("configured", n=1)
    f.flush()
    assert capsys.readouterr().out == ""
    (doc,) = json_lines(path)
    assert doc["event"] == "configured" and doc["n"] == 1 and doc["role"] == "client"


def test_a_too_long_request_line_leaves_the_controller_log_json(tmp_path: Path) -> None:
    """A real controller (aiohttp, configured as in a cluster), sent a 20,000-byte request line: aiohttp's record
    of it is one JSON line, at info and without a traceback (the client's fault, common.serving)."""
    proc = start_controller(tmp_path / "ctl")
    log = proc.stderr_path
    try:
        with socket.create_connection((proc.host, proc.port), timeout=10) as s:
            s.sendall(b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.")
        deadline = time.monotonic() + 20
        while "bad_http_request" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        stop(proc)
    docs = json_lines(log)
    [refused] = [d for d in docs if d.get("logger") == "aiohttp.server"]
    assert refused["level"] == "info" and refused["role"] == "controller" and "exception" not in refused
    assert refused["event"].startswith("bad_http_request: Error handling request from 127.0.0.1: HTTP 400, ")
    assert "8190" in refused["event"]
    assert not [d for d in docs if d["level"] in ("error", "critical")]
    assert docs[-1]["event"] == "controller_stopping"
