"""``minibroker demo`` stopped while its cluster starts: a temp dir the members already wrote logs into is kept
and named ("data and logs kept in ..."), as after a failed demo; one still empty is removed, leaving no trace."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from cli import cluster, demo
from tests.cli.helpers import free_base_port


def interrupted_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                      *, write_log: bool) -> tuple[int, str, list[str]]:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where the demo's default data dir goes

    def up(spec: cluster.ClusterSpec, **_kw: Any) -> cluster.ClusterSpec:
        if write_log:  # the controller had started and logged
            (Path(spec.data_dir) / "controller.log").write_text("controller_listening\n")
        raise KeyboardInterrupt  # what StopSignals raises for Ctrl-C while `up` runs

    monkeypatch.setattr(cluster, "up", up)
    monkeypatch.setattr("cli.clients.configure_client_logging", lambda: None)
    args = argparse.Namespace(data_dir=None, base_port=free_base_port(4), records=10, keep=False)
    status = demo.cmd_demo(args)
    return status, capsys.readouterr().out, os.listdir(tmp)


def test_ctrl_c_while_starting_names_the_kept_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    status, out, left = interrupted_start(tmp_path, monkeypatch, capsys, write_log=True)
    assert status == 130
    (kept,) = left
    assert kept.startswith("minibroker-demo-")
    assert f"data and logs kept in {tmp_path / 'tmp' / kept}" in out
    assert "while starting the cluster" in out


def test_ctrl_c_before_anything_was_written_leaves_no_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    status, out, left = interrupted_start(tmp_path, monkeypatch, capsys, write_log=False)
    assert status == 130
    assert left == []
    assert "kept in" not in out and "while starting the cluster" in out
