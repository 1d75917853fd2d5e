"""inbox: apply every message's effect exactly once per consumer, in your own transaction.

Record the message first, in the transaction that applies its effect; a redelivery is a
``False``, never an exception::

    from inbox import receive

    def on_message(envelope):
        with Session(engine) as session, session.begin():
            if not receive(session, consumer="billing", message=envelope):
                return  # already processed by this consumer: no second effect
            apply_payment(session, envelope)

Operator functions (held and blocked keys, dead messages, retention) are in :mod:`inbox.admin`.
"""

from __future__ import annotations

import warnings
from typing import Any

from inbox._amqp1 import Amqp1Consumer
from inbox._claimcheck import ClaimCheckResolver
from inbox._consumer import Batching, BrokerConsumer
from inbox._handler import AsyncBatchHandler, AsyncHandler, BatchHandler, Handler
from inbox._kafka import KafkaConsumer
from inbox._metrics import InboxMetrics
from inbox._mqtt import MqttConsumer
from inbox._nats import NatsConsumer
from inbox._partitioned import (
    PARTITION,
    Lease,
    PartitionedConsumer,
    PartitionFactory,
    per_partition,
)
from inbox._rabbitmq import RabbitMQConsumer
from inbox._receive import Verdict, receive, receive_async, record, record_async
from inbox._redis import RedisStreamConsumer
from inbox._runner import AsyncHandlerRunner, HandlerRunner, Outcome, Result
from inbox._sqs import SqsConsumer
from inbox._transactions import AsyncTransactionSource, TransactionSource
from inbox.exceptions import (
    ConcurrentDeliveryError,
    InboxError,
    OutOfOrderError,
    PartitionLostError,
)

__all__ = [
    "PARTITION",
    "Amqp1Consumer",
    "AsyncBatchHandler",
    "AsyncHandler",
    "AsyncHandlerRunner",
    "AsyncTransactionSource",
    "BatchHandler",
    "Batching",
    "BrokerConsumer",
    "ClaimCheckResolver",
    "ConcurrentDeliveryError",
    "Handler",
    "HandlerRunner",
    "InboxError",
    "InboxMetrics",
    "KafkaConsumer",
    "Lease",
    "MqttConsumer",
    "NatsConsumer",
    "OutOfOrderError",
    "Outcome",
    "PartitionFactory",
    "PartitionLostError",
    "PartitionedConsumer",
    "RabbitMQConsumer",
    "RedisStreamConsumer",
    "Result",
    "SqsConsumer",
    "TransactionSource",
    "Verdict",
    "per_partition",
    "receive",
    "receive_async",
    "record",
    "record_async",
]

#: old names on ``inbox`` of the functions now in :mod:`inbox.admin`, kept for one release
_MOVED_TO_ADMIN = {
    "BlockedKey": "BlockedKey",
    "HeldFilter": "HeldFilter",
    "HeldKey": "HeldKey",
    "blocked_keys": "blocked_keys",
    "dead_audit": "dead_audit",
    "dead_purge": "dead_purge",
    "dead_retry": "dead_retry",
    "held_keys": "held_keys",
    "purge": "purge_finished",
}
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    """The deprecated aliases: ``inbox.purge`` is ``inbox.admin.purge_finished``, and so on."""
    new = _MOVED_TO_ADMIN.get(name)
    if new is None:
        raise AttributeError(f"module 'inbox' has no attribute {name!r}")
    from inbox import admin

    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"inbox.{name} is deprecated and will be removed in the next release: "
            f"use inbox.admin.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
    return getattr(admin, new)
