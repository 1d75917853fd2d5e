"""The broker matrix, derived from the registered brokers (outbox.brokers): every contract test
(relay.contract) runs once per harness of every built-in broker, live against this machine's
brokers (NATS, RabbitMQ, Redis, Mosquitto), Kafka on a real Kafka-protocol broker (tansu, started
by tests/support/kafka_broker.py), AMQP 1.0 on a private RabbitMQ node, SQS and SNS on moto, and
the memory/stdout/file sinks. What each test checks follows the publisher's declared features.
A broker that is not reachable skips its tests with a message (fails them under CI)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from outbox.brokers import BUILT_IN, plugins
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


def _kafka(_tmp: Path) -> Harness:
    import_or_missing("confluent_kafka", "kafka")
    harness = KafkaHarness()
    harness.bootstrap = bootstrap()
    return harness


def _amqp1(_tmp: Path) -> Harness:
    import_or_missing("proton", "amqp1")
    harness = Amqp1Harness()
    harness.url = amqp1_node().url
    return harness


def _on_port(cls: type[Harness], port: int, name: str) -> Callable[[Path], Harness]:
    def make(_tmp: Path) -> Harness:
        require_port(port, name)
        return cls()

    return make


def _aws(cls: type[Harness]) -> Callable[[Path], Harness]:
    def make(_tmp: Path) -> Harness:
        import_or_missing("boto3", "aws")
        return cls()

    return make


#: per built-in broker (its registration's name), its harnesses: test id -> maker
HARNESSES: dict[str, dict[str, Callable[[Path], Harness]]] = {
    "memory": {"memory": lambda _tmp: MemoryHarness()},
    "stdout": {"stdout": lambda _tmp: StdoutHarness()},
    "file": {"file": FileHarness},
    "nats": {"nats": _on_port(NatsHarness, 4222, "nats")},
    "rabbitmq": {"rabbitmq": _on_port(RabbitHarness, 5672, "rabbitmq")},
    "kafka": {"kafka": _kafka},
    "redis": {"redis": _on_port(RedisHarness, 6379, "redis")},
    "mqtt": {"mqtt": _on_port(MqttHarness, 1883, "mqtt")},
    "amqp1": {"amqp1": _amqp1},
    # Amazon SQS (a FIFO and a standard queue) and SNS (a FIFO topic) on moto's server
    "sqs": {"sqs-fifo": _aws(SqsHarness), "sqs-standard": _aws(SqsStandardHarness)},
    "sns": {"sns-fifo": _aws(SnsHarness)},
}
BUILT_INS = sorted(n for n, p in plugins().items() if p.distribution == BUILT_IN)
ADAPTERS = {tid: make for name in BUILT_INS for tid, make in HARNESSES.get(name, {}).items()}


@pytest.fixture(params=list(ADAPTERS))
def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    """A harness for one broker; each test opens and cleans it up."""
    return ADAPTERS[request.param](tmp_path)
