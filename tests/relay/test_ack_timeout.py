"""Every adapter gives up on a message before the relay gives up on its batch.

When the relay's publish budget ends it releases the rows, and another relay may publish them
and the key's later rows. An adapter whose client still held a message then (Kafka's default
``message.timeout.ms`` was 30 s against a 10 s publish_timeout) could deliver a stale copy
after the newer ones. No I/O: adapters connect in ``start``, not when built.
"""

from __future__ import annotations

from typing import Any

import pytest

from outbox.exceptions import ConfigurationError
from relay import Relay, RelayConfig
from relay.brokers import publisher_for_url
from relay.brokers.kafka import KafkaPublisher
from relay.cli import make_publisher
from tests.relay.relay_helpers import FakePublisher

URL = "postgresql://relay@127.0.0.1:1/never-connected"
BROKERS = {
    "kafka": "kafka://127.0.0.1:9092",
    "nats": "nats://127.0.0.1:4222",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/",
    "redis": "redis://127.0.0.1:6379/0",
    "mqtt": "mqtt://127.0.0.1:1883",
}


@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_relay_refuses_an_adapter_ack_timeout_longer_than_publish_timeout(broker: str) -> None:
    publisher = publisher_for_url(BROKERS[broker], timeout=30)
    config = RelayConfig(database_url=URL, publish_timeout=10, lease_seconds=60)
    with pytest.raises(ConfigurationError) as caught:
        Relay(config, publisher)
    message = str(caught.value)
    assert f"the {broker} adapter's ack timeout (30s)" in message
    assert "publish_timeout 10s" in message
    assert "lower the adapter's timeout option or raise publish_timeout" in message


@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_adapter_default_timeout_fits_the_default_publish_budget(broker: str) -> None:
    publisher = publisher_for_url(BROKERS[broker])
    ack: Any = getattr(publisher.features, "ack_timeout_seconds", None)
    assert ack is not None
    assert ack < RelayConfig(database_url=URL).publish_timeout
    Relay(RelayConfig(database_url=URL), publisher)  # accepted as it comes


def test_relay_budget_is_capped_by_the_lease() -> None:
    # a claim publishes for at most 90 % of its lease: 9.0 s here, not publish_timeout's 9.5 s
    config = RelayConfig(database_url=URL, publish_timeout=9.5, lease_seconds=10)
    with pytest.raises(ConfigurationError, match=r"publish budget \(9s"):
        Relay(config, publisher_for_url(BROKERS["nats"], timeout=9.2))


def test_kafka_message_timeout_from_config_counts() -> None:
    # librdkafka keeps a message for message.timeout.ms, whatever the adapter's own timeout
    publisher = KafkaPublisher("127.0.0.1:9092", timeout=5, config={"message.timeout.ms": 60_000})
    assert publisher.features.ack_timeout_seconds == 60
    with pytest.raises(ConfigurationError, match=r"kafka adapter's ack timeout \(60s\)"):
        Relay(RelayConfig(database_url=URL), publisher)


@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_cli_publisher_timeout_follows_publish_timeout(broker: str) -> None:
    config = RelayConfig(database_url=URL, broker_url=BROKERS[broker], publish_timeout=4)
    publisher = make_publisher(config)
    assert publisher.features.ack_timeout_seconds == pytest.approx(3.2)
    Relay(config, publisher)


def test_publishers_without_an_ack_timeout_are_accepted() -> None:
    config = RelayConfig(database_url=URL, broker_url="memory:", publish_timeout=0.5)
    Relay(config, make_publisher(config))
    Relay(config, FakePublisher())
