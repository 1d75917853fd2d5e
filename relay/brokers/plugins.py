"""The built-in brokers' registrations, listed as entry points of the group
``outbox_inbox.brokers`` in pyproject.toml like any plug-in's (:mod:`outbox.brokers`)."""

from __future__ import annotations

from outbox.brokers import BrokerPlugin

__all__ = [
    "AMQP1",
    "FILE",
    "KAFKA",
    "MEMORY",
    "MQTT",
    "NATS",
    "RABBITMQ",
    "REDIS",
    "SNS",
    "SQS",
    "STDOUT",
]

_URLS = "relay.brokers.urls"

NATS = BrokerPlugin(
    name="nats", schemes=("nats",), publisher="relay.brokers.nats:NatsPublisher",
    url_parser=f"{_URLS}:nats_url", codec="outbox.wire.nats", consumer="inbox:NatsConsumer",
)  # fmt: skip
#: amqp:// is RabbitMQ's AMQP 0-9-1 (amqp1:// is AMQP 1.0)
RABBITMQ = BrokerPlugin(
    name="rabbitmq", schemes=("amqp", "amqps"),
    publisher="relay.brokers.rabbitmq:RabbitMQPublisher", codec="outbox.wire.rabbitmq",
    consumer="inbox:RabbitMQConsumer",
)  # fmt: skip
KAFKA = BrokerPlugin(
    name="kafka", schemes=("kafka", "kafkas"), publisher="relay.brokers.kafka:KafkaPublisher",
    url_parser=f"{_URLS}:kafka_url", codec="outbox.wire.kafka", consumer="inbox:KafkaConsumer",
)  # fmt: skip
REDIS = BrokerPlugin(
    name="redis", schemes=("redis", "rediss"), publisher="relay.brokers.redis:RedisPublisher",
    codec="outbox.wire.redis", consumer="inbox:RedisStreamConsumer",
)  # fmt: skip
MQTT = BrokerPlugin(
    name="mqtt", schemes=("mqtt", "mqtts"), publisher="relay.brokers.mqtt:MqttPublisher",
    url_parser=f"{_URLS}:mqtt_url", codec="outbox.wire.mqtt", consumer="inbox:MqttConsumer",
)  # fmt: skip
STDOUT = BrokerPlugin(
    name="stdout", schemes=("stdout",), publisher="relay.brokers.stdout:StdoutPublisher",
    url_parser=f"{_URLS}:no_arguments", codec="outbox.wire.jsonl", opaque=True,
)  # fmt: skip
FILE = BrokerPlugin(
    name="file", schemes=("file",), publisher="relay.brokers.file:FilePublisher",
    url_parser=f"{_URLS}:file_url", codec="outbox.wire.jsonl", opaque=True,
)  # fmt: skip
#: the tests' broker: envelopes kept in the process
MEMORY = BrokerPlugin(
    name="memory", schemes=("memory",), publisher="relay.brokers.memory:MemoryPublisher",
    url_parser=f"{_URLS}:no_arguments", opaque=True, listed=False,
)  # fmt: skip
AMQP1 = BrokerPlugin(
    name="amqp1", schemes=("amqp1", "amqp1s"), publisher="relay.brokers.amqp1:Amqp1Publisher",
    codec="outbox.wire.amqp1", consumer="inbox:Amqp1Consumer",
)  # fmt: skip
SQS = BrokerPlugin(
    name="sqs", schemes=("sqs",), publisher="relay.brokers.sqs:SqsPublisher",
    url_parser=f"{_URLS}:aws_url", codec="outbox.wire.sqs", consumer="inbox:SqsConsumer",
)  # fmt: skip
#: SNS topics are consumed through an SQS queue subscribed to them (inbox.SqsConsumer)
SNS = BrokerPlugin(
    name="sns", schemes=("sns",), publisher="relay.brokers.sqs:SnsPublisher",
    url_parser=f"{_URLS}:aws_url", codec="outbox.wire.sqs", consumer="inbox:SqsConsumer",
)  # fmt: skip
