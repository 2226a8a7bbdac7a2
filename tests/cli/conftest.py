"""Fixtures shared by the CLI tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.cli.helpers import kill_pids, kill_recorded, member_pids, run


@pytest.fixture
async def data_dir(tmp_path: Path) -> AsyncIterator[Path]:
    """A cluster dir; whatever a test started in it is stopped afterwards."""
    d = tmp_path / "c"
    try:
        yield d
    finally:
        if (d / "cluster.json").is_file():
            await run("cluster", "down", "--data-dir", str(d), "--timeout", "5")
            kill_recorded(d)
        kill_pids(member_pids(d))  # and any member the cluster did not record (a bug under test)
