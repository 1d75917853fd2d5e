"""The adapter matrix: every contract test runs once per adapter, live against this machine's
brokers (NATS, RabbitMQ, Redis, Mosquitto), Kafka on a real Kafka-protocol broker (tansu, started
by tests/support/kafka_broker.py), and the memory/stdout/file sinks. A broker that is not reachable
skips its tests with a message (fails them under CI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.contract.contract_harness import (
    Amqp1Harness,
    FileHarness,
    Harness,
    KafkaHarness,
    MemoryHarness,
    MqttHarness,
    NatsHarness,
    RabbitHarness,
    RedisHarness,
    SnsHarness,
    SqsHarness,
    SqsStandardHarness,
    StdoutHarness,
)
from tests.support.amqp1_broker import node as amqp1_node
from tests.support.kafka_broker import bootstrap
from tests.support.services import import_or_missing, require_port

ADAPTERS = ["memory", "stdout", "file", "nats", "rabbitmq", "kafka", "redis", "mqtt"]
ADAPTERS += ["amqp1"]  # AMQP 1.0 on a private RabbitMQ node (tests/support/amqp1_broker.py)
#: Amazon SQS (a FIFO and a standard queue) and SNS (a FIFO topic) on moto's server
AWS = {"sqs-fifo": SqsHarness, "sqs-standard": SqsStandardHarness, "sns-fifo": SnsHarness}
ADAPTERS += list(AWS)


def _make(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    classes: dict[str, Any] = {
        "memory": MemoryHarness, "stdout": StdoutHarness, "nats": NatsHarness,
        "rabbitmq": RabbitHarness, "redis": RedisHarness, "mqtt": MqttHarness,
    }  # fmt: skip
    if name == "file":
        return FileHarness(tmp_path)
    if name == "kafka":
        import_or_missing("confluent_kafka", "kafka")
        harness = KafkaHarness()
        harness.bootstrap = bootstrap()
        return harness
    if name == "amqp1":
        import_or_missing("proton", "amqp1")
        amqp1 = Amqp1Harness()
        amqp1.url = amqp1_node().url
        return amqp1
    if name in AWS:
        import_or_missing("boto3", "aws")
        aws: Harness = AWS[name]()
        return aws
    cls = classes[name]
    if cls.port is not None:
        require_port(cls.port, name)
    harness: Harness = cls()
    return harness


@pytest.fixture(params=ADAPTERS)
def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    """A harness for one adapter; the test opens and cleans it up with ``opened(harness)``."""
    return _make(request.param, request, tmp_path)


@pytest.fixture(params=[name for name in ADAPTERS if name != "memory"])
def wire_adapter(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    """A harness for each adapter that puts messages on a wire (all but the in-memory one)."""
    return _make(request.param, request, tmp_path)
