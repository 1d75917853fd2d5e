"""Every broker consumer takes enough messages from the broker for all its workers: the
window (fetch, prefetch, credit, receive maximum) scales with ``Batching.workers``."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from inbox import (
    Amqp1Consumer,
    AsyncHandlerRunner,
    Batching,
    MqttConsumer,
    NatsConsumer,
    RabbitMQConsumer,
    RedisStreamConsumer,
)


def _runner() -> AsyncHandlerRunner:
    def transactions() -> AbstractAsyncContextManager[Any]:
        raise AssertionError("not opened: nothing is consumed here")

    async def handler(target: Any, message: Any) -> None:
        return None

    return AsyncHandlerRunner(transactions, handler, consumer="svc", ordered=True)


def _windows(batching: Batching) -> dict[str, int]:
    runner = _runner()
    return {
        "nats": NatsConsumer(runner, stream="s", subject="s.>", durable="d",
                             batching=batching).batch,
        "redis": RedisStreamConsumer(runner, stream="s", group="g", name="c",
                               batching=batching).batch,
        "rabbitmq": RabbitMQConsumer(runner, queue="q", batching=batching).prefetch,
        "amqp1": Amqp1Consumer(runner, address="q", batching=batching).credit,
        "mqtt": MqttConsumer(runner, topic="t", client_id="c",
                             batching=batching).receive_maximum,
    }  # fmt: skip


@pytest.mark.parametrize("size", [10, 100])
def test_the_window_grows_with_workers(size: int) -> None:
    one = _windows(Batching(size=size, workers=1))
    four = _windows(Batching(size=size, workers=4))
    for broker, window in four.items():
        assert window >= size * 4, broker  # every worker can fill a batch from one window
        assert window > one[broker], broker


def test_kafka_session_timeout_defaults_to_ten_seconds_and_the_config_wins() -> None:
    """librdkafka's 45 s made a new group wait about 23 s for its first assignment on tansu
    (bench/kafka_join.py); the consumer's own config still decides."""
    pytest.importorskip("confluent_kafka")
    from inbox import KafkaConsumer

    config = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}
    default = KafkaConsumer(_runner(), config=config, topics=["t"])
    assert default.config["session.timeout.ms"] == 10_000
    chosen = KafkaConsumer(
        _runner(), config={**config, "session.timeout.ms": 30_000}, topics=["t"]
    )
    assert chosen.config["session.timeout.ms"] == 30_000
