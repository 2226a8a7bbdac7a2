"""``minibroker demo`` refuses what it cannot use before it starts anything: a --data-dir that is not empty
(a second demo there once failed with TOPIC_ALREADY_EXISTS after starting its cluster), a port in use (which
once left an empty temp directory behind)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from cli.main import build_parser
from tests.cli.helpers import free_base_port, kill_pids, member_pids, run, subcommands


def one_line_error(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("minibroker: error:") and message in err, err
    assert len(err.strip().splitlines()) == 1, err


async def test_a_non_empty_data_dir_is_refused_before_anything_starts(tmp_path: Path) -> None:
    d = tmp_path / "demo"
    d.mkdir()
    (d / "broker-1.log").write_text("an earlier demo\n")
    try:
        code, out, err = await run("demo", "--records", "10", "--base-port", str(free_base_port()),
                                   "--data-dir", str(d), timeout_s=120)
        one_line_error(code, err, f"--data-dir {d} is not empty")
        assert "starting a controller" not in out
        assert os.listdir(d) == ["broker-1.log"]
    finally:
        kill_pids(member_pids(d))


async def test_a_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    code, _, err = await run("demo", "--base-port", str(free_base_port()), "--data-dir", str(f))
    one_line_error(code, err, "exists and is not a directory")


def test_help_says_the_data_dir_must_be_empty() -> None:
    text = subcommands(build_parser())["demo"].format_help()
    assert "empty or new directory" in " ".join(text.split())


async def test_a_port_in_use_leaves_no_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # where the demo's default data dir goes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, _, err = await run("demo", "--base-port", str(port))
    one_line_error(code, err, "already in use")
    assert os.listdir(tmp) == []
