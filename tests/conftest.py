"""Shared fixtures. Helpers for real processes live in tests/procs.py and tests/cli/helpers.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


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
