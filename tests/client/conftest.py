"""Fixtures shared by the client tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.client.fake_broker import FakeCluster, running

TOPIC = "events"


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    """Two fake brokers with topic ``events`` of three partitions."""
    async with running(TOPIC, 3) as cluster:
        yield cluster
