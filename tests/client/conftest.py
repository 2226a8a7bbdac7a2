"""Fixtures shared by the client tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.client.fake_broker import FakeCluster

TOPIC = "events"


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    """Two fake brokers with topic ``events`` of three partitions."""
    cluster = FakeCluster()
    await cluster.start(2)
    cluster.create_topic(TOPIC, 3)
    try:
        yield cluster
    finally:
        await cluster.close()
