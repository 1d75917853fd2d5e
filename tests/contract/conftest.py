"""The adapter matrix: every contract test runs once per adapter, live against this machine's
brokers (NATS, RabbitMQ, Redis, Mosquitto), Kafka through librdkafka's mock cluster, and the
memory/stdout/file sinks. A broker that is not reachable skips its tests with a message."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract_harness import (
    FileHarness,
    Harness,
    KafkaHarness,
    MemoryHarness,
    MqttHarness,
    NatsHarness,
    RabbitHarness,
    RedisHarness,
    StdoutHarness,
)
from services import import_or_missing, missing, require_port

ADAPTERS = ["memory", "stdout", "file", "nats", "rabbitmq", "kafka", "redis", "mqtt"]


class _MockAddress(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.address: str | None = None
        self.found = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"Mock cluster enabled.*?(127\.0\.0\.1:\d+)", record.getMessage())
        if found:
            self.address = found.group(1)
            self.found.set()


@pytest.fixture(scope="session")
def kafka_mock() -> Iterator[str]:
    """A librdkafka mock cluster (a real Kafka wire-protocol listener) for the session.

    Its bootstrap address only appears in librdkafka's log line ``Mock cluster enabled: ...
    replaced with 127.0.0.1:NNNNN``, so a logger catches it.
    """
    confluent_kafka: Any = import_or_missing("confluent_kafka", "kafka")
    handler = _MockAddress()
    logger = logging.getLogger(f"tests.kafka_mock.{id(handler)}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    holder = confluent_kafka.Producer(
        {"test.mock.num.brokers": 1, "bootstrap.servers": "mock:9092", "logger": logger}
    )
    for _ in range(100):
        holder.poll(0.05)
        if handler.found.is_set():
            break
    if handler.address is None:
        missing("librdkafka's mock cluster", "librdkafka did not report its address")
    try:
        yield handler.address
    finally:
        holder.flush(1)


def _make(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    classes: dict[str, Any] = {
        "memory": MemoryHarness, "stdout": StdoutHarness, "nats": NatsHarness,
        "rabbitmq": RabbitHarness, "redis": RedisHarness, "mqtt": MqttHarness,
    }  # fmt: skip
    if name == "file":
        return FileHarness(tmp_path)
    if name == "kafka":
        harness = KafkaHarness()
        harness.bootstrap = request.getfixturevalue("kafka_mock")
        return harness
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
