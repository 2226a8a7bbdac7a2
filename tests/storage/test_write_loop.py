"""``python -m storage.write_loop`` measures every arrangement and leaves nothing behind (figures never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.write_loop import MODES, main


def test_every_mode_prints_its_line_and_removes_its_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 1 MiB files of ~10 writes each: 40 writes roll 3 times, so each mode also removes old files
    assert main([str(tmp_path), "--steps", "40", "--segment-mib", "1", "--keep", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(MODES)
    assert all("writes/s" in line and "above 150 us:" in line for line in lines)
    assert list(tmp_path.iterdir()) == []


def test_refuses_a_directory_that_is_not_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "nope")])
    assert exc.value.code == 2 and "is not a directory" in capsys.readouterr().err


def test_a_directory_it_cannot_write_in_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # /proc takes no new files, not even from root (CI runs as root, so a chmod would not do)
    with pytest.raises(SystemExit) as exc:
        main(["/proc", "--steps", "5", "--mode", "inline"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "error: inline:" in err and "/proc/write-loop-" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
