"""CPU quotas for benchmark processes, with the Linux cgroup cpu controller (v2 ``cpu.max`` or v1 CFS quota).

The replication benchmark compares 3 brokers with 1. Kafka's published ratio comes from brokers on
machines of their own; on a small shared machine the 3 brokers instead share its cores while the
single broker has one to itself. Giving every broker the same quota, small enough that the quotas
(and the producer) fit into the machine's cores, gives each broker the same CPU in both setups:
the equal machines of the published figure, each a fraction of a core.

A quota is enforced per period. The kernel hands runtime out in slices of
``sched_cfs_bandwidth_slice_us`` (5 ms by default), so periods shorter than two slices are enforced
loosely (measured with the single broker of ``python -m fetcher.bench``: limited to 0.5 core, it got
~0.4 at a 2 ms period and 0.6-0.8 at 1 ms), while long ones let a process run at full speed and then
stall for most of a period (at Linux's default 100 ms it got ~0.75 core through rounds of ~0.15 s).
``PERIOD_US`` is 10 ms: the shortest period enforced accurately (0.5 core gave the single broker
0.5 core's rate).

Creating cgroups needs root (or a delegated cgroup tree); ``CpuQuotaError`` says what is missing.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

PERIOD_US = 10_000
MIN_QUOTA_US = 1_000  # the kernel refuses shorter quotas
CGROUP_ROOT = Path("/sys/fs/cgroup")


class CpuQuotaError(Exception):
    """No usable cgroup cpu controller, or one this process may not write to."""


class CpuQuotas:
    """One parent cgroup, ``name``, with a child per limited process.

    ``CpuQuotas.create(name)`` makes the parent; ``limit(pid, cores, label)`` moves a process (all its
    threads, and the threads it starts later) into a child limited to ``cores``; ``remove()`` deletes
    the cgroups once their processes have exited."""

    def __init__(self, parent: Path, version: int) -> None:
        self.parent = parent
        self.version = version
        self.children: list[Path] = []

    @classmethod
    def create(cls, name: str, root: Path = CGROUP_ROOT) -> CpuQuotas:
        if "cpu" in _read(root / "cgroup.controllers").split():  # cgroup v2 with the cpu controller
            version, parent = 2, root / name
        elif (root / "cpu" / "cpu.cfs_quota_us").exists():  # cgroup v1 (or the hybrid layout's cpu hierarchy)
            version, parent = 1, root / "cpu" / name
        else:
            raise CpuQuotaError(f"no cgroup cpu controller under {root} (cgroup v2 with 'cpu' in "
                                f"cgroup.controllers, or v1 with cpu/cpu.cfs_quota_us)")
        try:
            if version == 2:
                _write(root / "cgroup.subtree_control", "+cpu")
            parent.mkdir()
            if version == 2:
                _write(parent / "cgroup.subtree_control", "+cpu")
        except OSError as exc:
            hint = " (creating cgroups needs root)" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else ""
            raise CpuQuotaError(f"cannot create cgroup {parent}: {exc.strerror or exc}{hint}") from exc
        return cls(parent, version)

    def limit(self, pid: int, cores: float, label: str) -> None:
        """Limit process ``pid`` to ``cores`` CPUs (e.g. 0.5: half of one core) in child cgroup ``label``."""
        quota = quota_us(cores)
        child = self.parent / label
        try:
            child.mkdir()
            self.children.append(child)
            if self.version == 2:
                _write(child / "cpu.max", f"{quota} {PERIOD_US}")
            else:
                _write(child / "cpu.cfs_period_us", str(PERIOD_US))
                _write(child / "cpu.cfs_quota_us", str(quota))
            _write(child / "cgroup.procs", str(pid))
        except OSError as exc:
            raise CpuQuotaError(f"cannot limit process {pid} in {child}: {exc.strerror or exc}") from exc

    def remove(self) -> list[Path]:
        """Delete the cgroups (their processes must have exited); returns those still there."""
        left = []
        for group in [*reversed(self.children), self.parent]:
            try:
                group.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(group)
        return left


def cpu_cgroup_of(pid: int) -> str:
    """The cgroup of process ``pid`` in the cpu controller's hierarchy, as the kernel reports it
    (``/proc/<pid>/cgroup``); "" if unknown."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return ""
    unified = ""
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
        if controllers == "":
            unified = path
    return unified


def quota_us(cores: float) -> int:
    """The quota per ``PERIOD_US`` for ``cores`` CPUs; ValueError outside [0.1, the machine's CPUs]."""
    cpus = os.cpu_count() or 1
    quota = round(cores * PERIOD_US)
    if not MIN_QUOTA_US <= quota <= cpus * PERIOD_US:
        raise ValueError(f"{cores} CPUs: give between {MIN_QUOTA_US / PERIOD_US} and {cpus} (this machine's CPUs)")
    return quota


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:  # one write(2) per value, as the cgroup files expect
        f.write(value)
