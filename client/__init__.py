"""Asyncio producer, consumer and admin client.

    from client import Producer, Consumer, TopicPartition

Names are imported lazily (PEP 562), so ``import client.partitioner`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client.admin import Admin, NewTopic
    from client.consumer import Consumer, ConsumerConfig
    from client.errors import ClientError, DeliveryTimeoutError, NoBrokersAvailableError, error_name
    from client.fetch_state import ConsumerRecord, OffsetReset
    from client.producer import DeliveryFuture, Producer, ProducerConfig, RecordMetadata
    from common.wire import TopicPartition

_EXPORTS = {
    "Admin": "client.admin", "NewTopic": "client.admin",
    "Consumer": "client.consumer", "ConsumerConfig": "client.consumer",
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
