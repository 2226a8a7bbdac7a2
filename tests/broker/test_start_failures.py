"""A broker that cannot start says why in one line and exits non-zero, and touches nothing it never loaded.

Real ``minibroker broker`` processes on prepared data dirs (no root needed): a partition dir that cannot be
opened used to end in a raw traceback; a start that failed after loading the logs (its port taken) wiped
``replication-offset-checkpoint``; a ``meta.properties`` that could not be written was reported without its
name and left ``meta.properties.tmp`` behind.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from common.clock import ManualClock
from storage.log import Log, LogConfig
from storage.record_batch import build_batch
from tests import procs as P
from tests.procs import REPO


def make_partition(data_dir: Path, name: str = "s-1", records: int = 50) -> Path:
    """A closed partition log with ``records`` one-record batches (leader epoch 0)."""
    pdir = data_dir / name
    the_log = Log.open(pdir, LogConfig(), ManualClock(1_700_000_000_000))
    for i in range(records):
        the_log.append_as_leader(build_batch([(None, f"v{i}".encode())], timestamp_ms=1_700_000_000_000), 0)
    the_log.close()
    return pdir


def run_broker(data_dir: Path, listen: str = "127.0.0.1:0") -> subprocess.CompletedProcess[str]:
    # --controller names a closed port: every case here fails before the controller matters
    return subprocess.run([sys.executable, "-m", "cli.main", "broker", "--node-id", "1", "--listen", listen,
                           "--controller", "127.0.0.1:1", "--data-dir", str(data_dir)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def plain_lines(stderr: str) -> list[str]:
    """The lines that are not structlog JSON events."""
    return [line for line in stderr.splitlines() if not line.startswith("{")]


def _epoch_checkpoint_is_a_directory(pdir: Path) -> str:
    (pdir / "leader-epoch-checkpoint").unlink()
    (pdir / "leader-epoch-checkpoint").mkdir()
    return "Is a directory"


def _a_directory_named_like_a_segment(pdir: Path) -> str:
    (pdir / "00000000000000000050.log").mkdir()
    return "Is a directory"


def _a_segment_that_is_a_dangling_link(pdir: Path) -> str:
    (pdir / "00000000000000000050.log").symlink_to(pdir / "gone")
    return "No such file or directory"


@pytest.mark.parametrize("damage", [_epoch_checkpoint_is_a_directory, _a_directory_named_like_a_segment,
                                    _a_segment_that_is_a_dangling_link])
def test_a_partition_dir_that_cannot_be_opened_is_one_line_naming_it(tmp_path: Path,
                                                                     damage: Callable[[Path], str]) -> None:
    d = tmp_path / "b1"
    pdir = make_partition(d)
    error = damage(pdir)
    r = run_broker(d)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    [line] = plain_lines(r.stderr)
    assert line.startswith("minibroker: error: cannot load the logs: ")
    assert str(pdir) in line and error in line
    assert not (d / "endpoint").exists()


def test_a_partition_dir_that_refuses_writes_is_one_line_naming_it(tmp_path: Path) -> None:
    """A read-only partition dir (a write at open: the epoch checkpoint, unreadable, is rebuilt). As root
    the dir is made immutable (``chattr +i``), which binds root too; otherwise it is made read-only."""
    d = tmp_path / "b1"
    pdir = make_partition(d)
    (pdir / "leader-epoch-checkpoint").write_text("garbage\n")
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(pdir)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here")
        undo, error = ["chattr", "-i", str(pdir)], "Operation not permitted"
    else:
        pdir.chmod(0o555)
        undo, error = ["chmod", "755", str(pdir)], "Permission denied"
    try:
        r = run_broker(d)
    finally:
        subprocess.run(undo, check=True)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    [line] = plain_lines(r.stderr)
    assert line.startswith("minibroker: error: cannot load the logs: ")
    assert str(pdir) in line and error in line


def test_a_start_that_fails_after_loading_leaves_the_hw_checkpoint_alone(tmp_path: Path) -> None:
    """The port is taken: the broker exits with one line; it loaded the logs, but never the HWs, so it must
    not write them (it wrote an empty ``replication-offset-checkpoint``). The logs it opened are closed
    properly (recovery-point checkpoint at their end)."""
    d = tmp_path / "b1"
    make_partition(d)
    hw = d / "replication-offset-checkpoint"
    hw.write_text("0\n2\ns 0 200\ns 1 50\n")
    before = hw.read_bytes()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = run_broker(d, f"127.0.0.1:{taken.getsockname()[1]}")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    [line] = plain_lines(r.stderr)
    assert line.startswith("minibroker: error: ") and "address already in use" in line
    assert hw.read_bytes() == before
    assert "s 1 50" in (d / "recovery-point-offset-checkpoint").read_text().splitlines()


def test_meta_properties_that_cannot_be_written_is_named_and_leaves_no_temp_file(tmp_path: Path) -> None:
    """No file may grow past 0 bytes (RLIMIT_FSIZE): writing meta.properties fails with EFBIG."""
    d = tmp_path / "b1"
    args = ["broker", "--node-id", "1", "--listen", "127.0.0.1:0", "--controller", "127.0.0.1:1",
            "--data-dir", str(d)]
    proc = P.spawn_piped("broker", args, d, fsize_limit=0, wait=False)
    assert P.wait_exit(proc, 60) == 2
    [line] = proc.stderr_text().splitlines()
    assert line == f"minibroker: error: cannot write {d / 'meta.properties'}: File too large"
    assert sorted(p.name for p in d.iterdir()) == []
