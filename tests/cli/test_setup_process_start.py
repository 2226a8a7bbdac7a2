"""Starting the server processes: a data dir that is a regular file is one clear line (not "[Errno 17] File
exists"), and a controller stopped while it starts (``docker stop`` right after ``up``) stops cleanly with
status 0 instead of dying of the signal (or, as a container's PID 1, ignoring it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROC = Path("/proc")


def minibroker(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.mark.parametrize("kind", ["broker", "controller"])
def test_a_data_dir_that_is_a_file_is_one_clear_line(tmp_path: Path, kind: str) -> None:
    f = tmp_path / "file"
    f.write_text("not a directory")
    extra = ["--node-id", "1", "--controller", "127.0.0.1:1"] if kind == "broker" else []
    r = minibroker(kind, "--listen", "127.0.0.1:0", "--data-dir", str(f), *extra)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("minibroker: error:") and r.stderr.count("\n") == 1, r.stderr
    assert f"--data-dir {f} exists and is not a directory" in r.stderr
    assert "Errno" not in r.stderr and "Traceback" not in r.stderr
    assert f.read_text() == "not a directory"


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (its SigCgt mask in /proc)."""
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@pytest.mark.skipif(not (PROC / "self" / "status").exists(), reason="needs /proc")
def test_sigterm_while_the_controller_starts_stops_it_with_status_0(tmp_path: Path) -> None:
    data_dir = tmp_path / "controller"
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "controller", "--listen", "127.0.0.1:0",
                             "--data-dir", str(data_dir)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not _catches_sigterm(proc.pid):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the controller never handled SIGTERM"
            time.sleep(0.001)
        # the handler is there before the replay and the bind: the controller is still starting
        assert not (data_dir / "endpoint").exists(), "SIGTERM is handled only once the controller listens"
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
