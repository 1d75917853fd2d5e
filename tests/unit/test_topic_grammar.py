"""The topic grammar and the relay's destination policy (pure logic; the live refusals are in
tests/integration/test_topic_boundary.py and tests/relay/test_topic_boundary.py)."""

from __future__ import annotations

from typing import Any

import pytest

from outbox._topic import check_topic, topic_problem
from outbox.exceptions import InvalidMessageError
from relay.brokers.base import Destinations, mqtt_topic_matches, nats_subject_matches
from relay.exceptions import DestinationRefusedError, DestinationUnavailableError

#: a producer's topic that would be a broker's own address if sent as is
ADDRESSES = [
    "$JS.API.STREAM.DELETE.VICTIM",  # NATS JetStream API
    "$SYS.REQ.SERVER.PING",  # NATS system account
    "$KV.bucket.key",
    "_INBOX.abc",  # NATS reply subjects
    "$SYS/broker/clients",  # MQTT system topics
    "$share/group/orders",  # MQTT shared subscriptions
    "__consumer_offsets",  # Kafka internal topics
    "_schemas",
    "amq.topic/orders",  # RabbitMQ reserved exchanges
    "AMQ.direct",
    "https://sqs.us-east-1.amazonaws.com/123456789012/other-queue",  # an SQS queue URL
    "arn:aws:sns:us-east-1:123456789012:other-topic",  # an SNS ARN
    "/exchange/amq.topic/x",  # an AMQP 1.0 address
    "orders.*",
    "orders.>",
    "orders/#",
    "orders/+/x",
    "orders created",
    "orders\r\nPUB x",
    "orders\x00",
    "ordérs",
    "-orders",
    ".orders",
    "",
    "o" * 256,
]


@pytest.mark.parametrize("topic", ADDRESSES)
def test_an_address_is_not_a_topic(topic: str) -> None:
    assert topic_problem(topic) is not None
    with pytest.raises(InvalidMessageError) as err:
        check_topic(topic)
    assert err.value.data["field"] == "topic"
    assert "\n" not in str(err.value)  # one line, whatever the topic holds


@pytest.mark.parametrize(
    "topic",
    ["orders", "Orders.created", "billing/invoice-paid", "v2.orders_created", "9", "o" * 255],
)
def test_a_name_is_a_topic(topic: str) -> None:
    assert topic_problem(topic) is None
    assert check_topic(topic) == topic


@pytest.mark.parametrize("broker", ["nats", "mqtt", "kafka", "redis", "rabbitmq", "amqp1", "sqs"])
@pytest.mark.parametrize("topic", ADDRESSES[:14])
def test_the_relay_refuses_a_row_whose_topic_is_an_address(broker: str, topic: str) -> None:
    dest = Destinations(None, broker=broker)
    with pytest.raises(DestinationRefusedError) as err:
        dest(topic)
    # the relay treats it as an unavailable destination: the topic pauses, nothing is sent
    assert isinstance(err.value, DestinationUnavailableError)
    assert "not sent" in err.value.reason


def test_a_template_of_the_operator_may_name_a_reserved_prefix() -> None:
    assert Destinations({"*": "amq.topic/{topic}"}, broker="rabbitmq")("orders") == (
        "amq.topic/orders"
    )
    assert Destinations({"x": "$SYS/ok"}, broker="mqtt")("x") == "$SYS/ok"  # an exact entry


def test_a_topic_first_template_is_checked_like_the_topic() -> None:
    with pytest.raises(DestinationRefusedError):
        Destinations({"*": "{topic}"}, broker="rabbitmq")("amqx/rk")  # would pick an exchange


def test_the_allow_list_bounds_the_default_mapping() -> None:
    nats = Destinations(
        {"*": "{topic}", "audit": "ops.audit"},
        broker="nats",
        allow=["events.>", "orders.*"],
        matches=nats_subject_matches,
    )
    assert nats("events.a.b") == "events.a.b"
    assert nats("orders.created") == "orders.created"
    assert nats("audit") == "ops.audit"  # exact entries are the operator's
    for topic in ("events", "orders.created.x", "billing.paid"):
        with pytest.raises(DestinationRefusedError, match="not among the allowed"):
            nats(topic)
    kafka = Destinations(None, broker="kafka", allow=["orders-*"])
    assert kafka("orders-v2") == "orders-v2"
    with pytest.raises(DestinationRefusedError):
        kafka("payments")


def test_matchers() -> None:
    assert nats_subject_matches("a.*.c", "a.b.c")
    assert not nats_subject_matches("a.*", "a.b.c")
    assert nats_subject_matches("a.>", "a.b.c")
    assert not nats_subject_matches("a.>", "a")
    assert mqtt_topic_matches("a/+/c", "a/b/c")
    assert mqtt_topic_matches("a/#", "a/b/c")
    assert not mqtt_topic_matches("a/+", "a/b/c")


def test_a_bad_allow_list_is_a_configuration_error() -> None:
    from outbox.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError):
        Destinations(None, broker="kafka", allow="orders-*")  # type: ignore[arg-type]


def test_a_broker_url_carries_the_allow_list_for_outbox_relay() -> None:
    """``outbox relay --broker 'kafka://k:9092?allow=orders-*'``: the allow-list reaches the
    adapter (the command line has no destinations option); the rest of the URL is unchanged."""
    from relay.brokers import publisher_for_url

    kafka: Any = publisher_for_url("kafka://127.0.0.1:9092?allow=orders-*,audit")
    assert kafka._destination("orders-v2") == "orders-v2"
    assert kafka._destination("audit") == "audit"
    with pytest.raises(DestinationRefusedError, match="not among the allowed"):
        kafka._destination("payments")
    nats: Any = publisher_for_url("nats://127.0.0.1:4222?allow=events.%3E")
    assert nats._destination("events.a") == "events.a"
    with pytest.raises(DestinationRefusedError):
        nats._destination("orders")
    from outbox.exceptions import ConfigurationError

    for url in ("kafka://127.0.0.1:9092?allow=", "stdout:?allow=x"):
        with pytest.raises(ConfigurationError):
            publisher_for_url(url)
