"""``chaos run``: an ``--out`` (or ``--data-dir``) that cannot be used is one error line before any cluster
starts, and a run that fails to start leaves no ``--out`` behind (these once ended in tracebacks, one of them
only after the whole run)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import cluster as cl
from cli.chaos import check_out
from cli.cluster import make_dirs, remove_empty_dirs
from cli.main import CliError
from tests.cli.helpers import free_base_port, minibroker

PROC = Path("/proc")
needs_proc = pytest.mark.skipif(not (PROC / "self").exists(), reason="no /proc")


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "cluster"
    try:
        yield d
    finally:  # had a cluster started after all, stop what it recorded (by pid)
        if (d / cl.CLUSTER_FILE).exists():
            cl.stop_members(list(reversed(cl.load(d).members)), timeout_s=10)


def chaos_error(cwd: Path, data: Path, out: Path | str) -> str:
    # run in the test's tmp_path: a regression writes there, never into the tree
    proc = subprocess.run([*minibroker(), "chaos", "run", "--duration", "1", "--heal-timeout", "5",
                           "--data-dir", str(data), "--out", str(out), "--base-port", str(free_base_port())],
                          cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("minibroker: error: ")
    assert "starting a cluster" not in proc.stdout
    return lines[0]


def snapshot(root: Path) -> list[tuple[str, bool]]:
    return sorted((str(p.relative_to(root)), p.is_dir()) for p in root.rglob("*"))


@pytest.mark.parametrize(("case", "message"), [
    ("regular file", "exists and is not a directory"),
    ("below a regular file", "is not a directory"),
    ("summary.json is a directory", "summary.json there is a directory"),
    ("history.jsonl is a directory", "history.jsonl there is a directory"),
    ("history.jsonl exists", "already holds a history.jsonl"),
    ("summary.json is a dangling symlink", "summary.json there is a dangling symlink"),
])
def test_unusable_out_is_one_line_before_anything_starts(tmp_path: Path, data: Path, case: str,
                                                         message: str) -> None:
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "out"
    if case == "regular file":
        out = tmp_path / "afile"
    elif case == "below a regular file":
        out = tmp_path / "afile" / "sub"
    else:
        out.mkdir()
        name = case.split()[0]
        if "directory" in case:
            (out / name).mkdir()
        elif "symlink" in case:
            (out / name).symlink_to(tmp_path / "nowhere")
        else:
            (out / name).write_text("")
    before = snapshot(tmp_path)
    assert message in chaos_error(tmp_path, data, out)
    assert snapshot(tmp_path) == before  # nothing created: no --out, no --data-dir
    assert not data.exists()


@needs_proc
def test_out_that_cannot_be_created_is_one_line(tmp_path: Path, data: Path) -> None:
    line = chaos_error(tmp_path, data, PROC / "minibroker-x")
    assert "--out /proc/minibroker-x" in line
    assert not data.exists()


@needs_proc
def test_failed_start_removes_the_out_it_created(tmp_path: Path) -> None:
    """--data-dir passes every check but cannot be created: the --out made meanwhile is removed again."""
    out = tmp_path / "new" / "deeper"
    proc = subprocess.run([*minibroker(), "chaos", "run", "--duration", "1", "--data-dir", "/proc/minibroker-x",
                           "--out", str(out), "--base-port", str(free_base_port())],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minibroker: error: ") and "/proc/minibroker-x" in lines[0]
    assert not (tmp_path / "new").exists()


def test_data_dir_below_a_file_is_refused_before_out_is_created(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "out"
    line = chaos_error(tmp_path, tmp_path / "afile" / "c", out)
    assert "--data-dir" in line and "is not a directory" in line
    assert not out.exists()


def test_empty_out_is_refused(tmp_path: Path, data: Path) -> None:
    assert "--out must not be empty" in chaos_error(tmp_path, data, "")


def test_out_helpers(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    check_out(out)
    created = make_dirs(out, "--out")
    assert created == tmp_path / "a" and out.is_dir()
    check_out(out)  # an empty directory is fine
    (out / "summary.json").write_text("{}")
    check_out(out)  # a previous summary is overwritten
    remove_empty_dirs(out, created)
    assert out.is_dir(), "a directory with files in it stays"
    (out / "summary.json").unlink()
    (out / "cluster").mkdir()
    (out / "cluster" / "broker-1.log").write_text("log")
    remove_empty_dirs(out, created)
    assert (out / "cluster" / "broker-1.log").exists(), "a --data-dir inside --out is never removed with it"
    (out / "cluster" / "broker-1.log").unlink()
    (out / "cluster").rmdir()
    remove_empty_dirs(out, created)
    assert not (tmp_path / "a").exists()
    remove_empty_dirs(out, None)  # nothing created: nothing to do
    (tmp_path / "x").write_text("")
    with pytest.raises(CliError, match="is not a directory"):
        check_out(tmp_path / "x" / "y")
    with pytest.raises(CliError, match="cannot create --out"):
        make_dirs(tmp_path / "x" / "y", "--out")
