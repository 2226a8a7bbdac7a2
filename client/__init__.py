"""Asyncio producer, consumer and admin client.

A few lines from plain Python (``BOOTSTRAP`` is any broker, e.g. "127.0.0.1:9091")::

    import asyncio
    from client import Consumer, Producer

    async def main() -> None:
        async with Producer(BOOTSTRAP, acks="all") as producer:
            meta = await producer.send_and_wait("events", b"hello", key=b"user-1")
            print("written at", meta.partition, meta.offset)
        async with Consumer(BOOTSTRAP, auto_offset_reset="earliest") as consumer:
            await consumer.assign_topic("events")
            for record in await consumer.poll(timeout_ms=2000):
                print(record.partition, record.offset, record.key, record.value)

    asyncio.run(main())

``Producer.send`` returns a ``DeliveryFuture`` at once (await it for
``RecordMetadata`` or a typed error); ``Consumer`` has ``assign``, ``seek``,
``position``, ``poll``, ``pause``/``resume`` and ``offsets_for_times``. Names are imported lazily (PEP 562), so
``import client.partitioner`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client.admin import Admin, NewTopic
    from client.consumer import Consumer, ConsumerConfig, OffsetAndTimestamp
    from client.errors import ClientError, DeliveryTimeoutError, NoBrokersAvailableError, error_name
    from client.fetch_state import ConsumerRecord, OffsetReset
    from client.producer import DeliveryFuture, Producer, ProducerConfig, RecordMetadata
    from common.wire import TopicPartition

_EXPORTS = {
    "Admin": "client.admin", "NewTopic": "client.admin",
    "Consumer": "client.consumer", "ConsumerConfig": "client.consumer", "OffsetAndTimestamp": "client.consumer",
    "ClientError": "client.errors", "DeliveryTimeoutError": "client.errors",
    "NoBrokersAvailableError": "client.errors", "error_name": "client.errors",
    "ConsumerRecord": "client.fetch_state", "OffsetReset": "client.fetch_state",
    "DeliveryFuture": "client.producer", "Producer": "client.producer", "ProducerConfig": "client.producer",
    "RecordMetadata": "client.producer", "TopicPartition": "common.wire",
}

__all__ = [
    "Admin",
    "ClientError",
    "Consumer",
    "ConsumerConfig",
    "ConsumerRecord",
    "DeliveryFuture",
    "DeliveryTimeoutError",
    "NewTopic",
    "NoBrokersAvailableError",
    "OffsetAndTimestamp",
    "OffsetReset",
    "Producer",
    "ProducerConfig",
    "RecordMetadata",
    "TopicPartition",
    "error_name",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
