"""MemoryPublisher's failure injection, the Destinations mapping, and publisher_for_url."""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import pytest

from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from relay.brokers import Destinations, MissingDependencyError, publisher_for_url
from relay.brokers.file import FilePublisher
from relay.brokers.kafka import KafkaPublisher
from relay.brokers.memory import MemoryPublisher
from relay.brokers.mqtt import MqttPublisher
from relay.brokers.nats import NatsPublisher
from relay.exceptions import PermanentPublishError, RetryablePublishError


def env(key: str = "k", seq: int = 1, topic: str = "t") -> Envelope:
    return Envelope(id=uuid.uuid4(), topic=topic, key=key, seq=seq, payload=b"{}")


def test_memory_fails_chosen_attempts_then_succeeds() -> None:
    a, b = env(seq=1), env(key="other")
    pub = MemoryPublisher()
    pub.fail(a.id, times=2, reason="broker hiccup")

    async def body() -> list[list[BaseException | None]]:
        return [await pub.publish_batch([a, b]) for _ in range(3)]

    first, second, third = asyncio.run(body())
    assert isinstance(first[0], RetryablePublishError)
    assert "broker hiccup" in str(first[0])
    assert isinstance(second[0], RetryablePublishError)
    assert third == [None, None]
    assert pub.attempts[a.id] == 3
    assert pub.published("t") == [b, b, a, b]


def test_memory_permanent_failure_holds_later_messages_of_the_key() -> None:
    first, second, other = env(seq=1), env(seq=2), env(key="other")
    pub = MemoryPublisher(destinations={"t": "orders"})
    pub.fail(first.id, permanent=True, times=None)
    results = asyncio.run(pub.publish_batch([first, second, other]))
    assert isinstance(results[0], PermanentPublishError)
    assert isinstance(results[1], RetryablePublishError)
    assert "not sent" in str(results[1])
    assert results[2] is None
    assert pub.published("orders") == [other]
    assert pub.attempts[second.id] == 0


def test_destinations_exact_then_template_then_topic() -> None:
    mapping = Destinations({"orders": "shop/orders", "*": "events.{topic}"})
    assert mapping("orders") == "shop/orders"
    assert mapping("users") == "events.users"
    assert Destinations()("users") == "users"


@pytest.mark.parametrize("bad", [{"*": "x.{nope}"}, {"t": ""}])
def test_destinations_refuse_bad_mappings(bad: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError):
        Destinations(bad)


@pytest.mark.parametrize(
    ("url", "cls", "attrs"),
    [
        ("nats://a:1,nats://b:2", NatsPublisher, {"_servers": ["nats://a:1", "nats://b:2"]}),
        ("kafka://h1:9092,h2:9093", KafkaPublisher, {"_bootstrap": "h1:9092,h2:9093"}),
        ("mqtts://u:p%40ss@broker", MqttPublisher,
         {"_host": "broker", "_port": 8883, "_auth": ("u", "p@ss"), "_tls": True}),
        ("mqtt://broker:1884", MqttPublisher, {"_port": 1884, "_tls": False}),
        ("file:/tmp/out.jsonl", FilePublisher, {}),
        ("file:///tmp/out.jsonl", FilePublisher, {}),
        ("memory:", MemoryPublisher, {}),
    ],
)  # fmt: skip
def test_publisher_for_url_chooses_adapter(url: str, cls: type, attrs: dict[str, Any]) -> None:
    pub = publisher_for_url(url, destinations={"t": "dest"})
    assert type(pub) is cls
    for name, value in attrs.items():
        assert getattr(pub, name) == value
    if isinstance(pub, FilePublisher):
        assert str(pub.path) == "/tmp/out.jsonl"


def test_publisher_for_url_passes_destinations_and_options() -> None:
    pub = publisher_for_url("memory:", destinations={"t": "d"}, max_payload_bytes=5)
    assert isinstance(pub, MemoryPublisher)
    assert pub.features.max_payload_bytes == 5
    asyncio.run(pub.publish_batch([env()]))
    assert len(pub.published("d")) == 1


@pytest.mark.parametrize("url", ["foo://x", "nats", "http://example.com"])
def test_publisher_for_url_unknown_scheme(url: str) -> None:
    with pytest.raises(ConfigurationError, match="unknown broker URL"):
        publisher_for_url(url)


def test_publisher_for_url_unknown_option_names_valid_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"bogus.*valid:.*timeout"):
        publisher_for_url("redis://127.0.0.1:6379/0", bogus=1)


def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nats", None)  # makes `import nats` fail
    with pytest.raises(MissingDependencyError, match=r'pip install "outbox-inbox\[nats\]"'):
        publisher_for_url("nats://127.0.0.1:4222")


def test_kafka_refuses_settings_that_allow_reordering() -> None:
    with pytest.raises(ConfigurationError, match=r"enable\.idempotence"):
        KafkaPublisher("h:1", config={"enable.idempotence": False})
