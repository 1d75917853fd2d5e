"""Redis LISTs as an outbox-inbox broker: the registration the entry point names.

A message is one list element (:mod:`outbox_redis_list.wire`); the relay appends with RPUSH
(:mod:`outbox_redis_list.publisher`), the inbox's consumer moves each element into a
processing list with BLMOVE and removes it once its transaction committed
(:mod:`outbox_redis_list.consumer`).
"""

from __future__ import annotations

from outbox.brokers import BrokerPlugin

__all__ = ["PLUGIN"]

PLUGIN = BrokerPlugin(
    name="redis-list",
    schemes=("redis-list",),
    publisher="outbox_redis_list.publisher:ListPublisher",
    url_parser="outbox_redis_list.publisher:parse_url",
    codec="outbox_redis_list.wire",
    consumer="outbox_redis_list.consumer:ListConsumer",
    harness="outbox_redis_list.harness:ListHarness",
)
