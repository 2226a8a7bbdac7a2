"""CPU quotas for benchmark processes: the cgroup files written for v1 and v2 (on a directory laid out like
each), the errors, and, where this process may create cgroups, a busy process really held to its quota."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.bench import proc_counters
from common.cpu_quota import PERIOD_US, CpuQuotaError, CpuQuotas, quota_us


def test_v1_layout_gets_period_quota_and_process(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    quotas = CpuQuotas.create("bench-1", root=tmp_path)
    quotas.limit(4321, 0.5, "broker1")
    child = tmp_path / "cpu" / "bench-1" / "broker1"
    assert (child / "cpu.cfs_period_us").read_text() == str(PERIOD_US)
    assert (child / "cpu.cfs_quota_us").read_text() == str(PERIOD_US // 2)
    assert (child / "cgroup.procs").read_text() == "4321"


def test_v2_layout_enables_the_controller_and_writes_cpu_max(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    quotas = CpuQuotas.create("bench-2", root=tmp_path)
    quotas.limit(99, 0.75, "broker4")  # at most 1 CPU: CI machines may have only one
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tmp_path / "bench-2" / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tmp_path / "bench-2" / "broker4" / "cpu.max").read_text() == f"{PERIOD_US * 3 // 4} {PERIOD_US}"
    assert (tmp_path / "bench-2" / "broker4" / "cgroup.procs").read_text() == "99"


def test_no_cpu_controller_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    with pytest.raises(CpuQuotaError, match="no cgroup cpu controller"):
        CpuQuotas.create("bench-3", root=tmp_path)


def test_a_parent_that_cannot_be_created_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "taken").mkdir()
    with pytest.raises(CpuQuotaError, match=r"cannot create cgroup .*taken: File exists$"):
        CpuQuotas.create("taken", root=tmp_path)


def test_quota_bounds() -> None:
    assert quota_us(0.5) == PERIOD_US // 2
    assert quota_us(0.1) == PERIOD_US // 10
    for cores in (0.05, 0.0, -1.0, (os.cpu_count() or 1) + 1):
        with pytest.raises(ValueError, match=r"give between 0\.1 and"):
            quota_us(cores)


def test_a_busy_process_is_held_to_its_quota(cpu_quotas: CpuQuotas) -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cpu_quotas.limit(busy.pid, 0.2, "busy")
        cpu0, _ = proc_counters(busy.pid)
        start = time.monotonic()
        time.sleep(1.0)
        cpu, _ = proc_counters(busy.pid)
        elapsed = time.monotonic() - start
    finally:
        busy.kill()
        busy.wait()
    # a busy loop takes a whole core unless limited; 0.2 core leaves it well under half of the wall time
    assert 0 < cpu - cpu0 < 0.5 * elapsed
    assert cpu_quotas.remove() == []
    assert not cpu_quotas.parent.exists()
