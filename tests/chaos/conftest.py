"""The chaos test audits in-process with one SparkSession for the test session (as tests/audit does)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from audit.spark_audit import build_session

    session = build_session("local[2]", app_name="minibroker-chaos-tests", shuffle_partitions=2,
                            driver_memory="768m")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    import structlog

    structlog.reset_defaults()
