"""Shared fixtures. Helpers for real processes live in tests/procs.py and tests/cli/helpers.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from common.cpu_quota import CpuQuotaError, CpuQuotas


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkSession for the whole test session (a JVM start costs seconds on 2 cores)."""
    pytest.importorskip("pyspark")
    from audit.spark_audit import build_session

    session = build_session("local[2]", app_name="minibroker-tests", shuffle_partitions=2,
                            driver_memory="768m")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(autouse=True)
def reset_structlog() -> Iterator[None]:
    """CLI commands run in-process configure structlog onto pytest's captured stderr, which is closed
    after the test: undo it so that later tests never log into a closed file."""
    yield
    import structlog

    structlog.reset_defaults()


@pytest.fixture
def cpu_quotas() -> Iterator[CpuQuotas]:
    """A parent cgroup for CPU quotas, skipping the test where this process may not make cgroups or move a
    process into one (no root, no cpu controller, a container's read-only cgroup tree); removed afterwards."""
    try:
        quotas = CpuQuotas.create(f"minibroker-test-{os.getpid()}")
    except CpuQuotaError as exc:
        pytest.skip(f"cannot create cgroups here: {exc}")
    probe = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        quotas.limit(probe.pid, 0.5, "probe")
        refused = None
    except CpuQuotaError as exc:
        refused = exc
    finally:
        probe.kill()
        probe.wait()
    if refused is not None:
        quotas.remove()
        pytest.skip(f"cannot limit a process here: {refused}")
    try:
        yield quotas
    finally:
        quotas.remove()
