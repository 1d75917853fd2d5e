"""inbox: apply every message's effect exactly once per consumer, in your own transaction.

Record the message first, in the transaction that applies its effect; a redelivery is a
``False``, never an exception::

    from inbox import receive

    def on_message(envelope):
        with Session(engine) as session, session.begin():
            if not receive(session, consumer="billing", message=envelope):
                return  # already processed by this consumer: no second effect
            apply_payment(session, envelope)
"""

from __future__ import annotations

from inbox._amqp1 import Amqp1Consumer
from inbox._blocked import BlockedKey, blocked_keys
from inbox._consumer import Batching, BrokerConsumer
from inbox._dead import HeldFilter, HeldKey, dead_audit, dead_purge, dead_retry, held_keys
from inbox._kafka import KafkaConsumer
from inbox._metrics import InboxMetrics
from inbox._mqtt import MqttConsumer
from inbox._nats import NatsConsumer
from inbox._rabbitmq import RabbitMQConsumer
from inbox._receive import Verdict, receive, receive_async, record, record_async
from inbox._redis import RedisStreamConsumer
from inbox._retention import purge
from inbox._runner import AsyncHandlerRunner, HandlerRunner, Outcome, Result
from inbox._sqs import SqsConsumer
from inbox.exceptions import ConcurrentDeliveryError, InboxError, OutOfOrderError

__all__ = [
    "Amqp1Consumer",
    "AsyncHandlerRunner",
    "Batching",
    "BlockedKey",
    "BrokerConsumer",
    "ConcurrentDeliveryError",
    "HandlerRunner",
    "HeldFilter",
    "HeldKey",
    "InboxError",
    "InboxMetrics",
    "KafkaConsumer",
    "MqttConsumer",
    "NatsConsumer",
    "OutOfOrderError",
    "Outcome",
    "RabbitMQConsumer",
    "RedisStreamConsumer",
    "Result",
    "SqsConsumer",
    "Verdict",
    "blocked_keys",
    "dead_audit",
    "dead_purge",
    "dead_retry",
    "held_keys",
    "purge",
    "receive",
    "receive_async",
    "record",
    "record_async",
]
