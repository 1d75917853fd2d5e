"""Partitioned destinations: ``[broker.partitions]`` and ``{partition}`` in destinations.

* The relay computes a message's partition from its key (``outbox.partition_for``): a producer
  chooses neither the partition nor, through it, any other destination.
* Counts and templates are checked at start: a ``{partition}`` destination needs a count, a
  count needs a ``{partition}`` destination, a count is 1..1024.
* ``[broker.partitions]`` and ``OUTBOX_BROKER_PARTITIONS`` reach the adapter; a broker that
  partitions by itself (Kafka, SQS) refuses them.
* ``outbox relay check`` lists each partition's destination.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from outbox import partition_for
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from relay import RelayConfig
from relay.brokers import publisher_for_url
from relay.brokers.base import Destinations
from relay.cli import make_publisher
from tests.relay.relay_helpers import write
from tests.support.nats_server import PrivateNats
from tests.support.services import import_or_missing

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _env(topic: str, key: str) -> Envelope:
    return Envelope(id=uuid.uuid4(), topic=topic, key=key, seq=1, payload=b"{}")


def test_each_key_goes_to_its_partition_as_partition_for_says() -> None:
    dest = Destinations({"*": "events.{topic}.p{partition}"}, broker="nats", partitions={"*": 8})
    for key in ("k1", "customer-42", "Ærø", "a b", ""):
        assert dest("orders", key) == f"events.orders.p{partition_for(key, 8)}"
    assert dest.partitions_of("orders") == 8
    assert dest.partition("orders", 5) == "events.orders.p5"


def test_a_hostile_key_chooses_only_a_partition_number() -> None:
    dest = Destinations(
        {"*": "events.{topic}.p{partition}"},
        broker="nats",
        partitions={"*": 4},
        allow=["events.orders.p*"],
    )
    allowed = {f"events.orders.p{p}" for p in range(4)}
    for key in ("{topic}", "{partition}", "$SYS.x", "../../x", "a.>", "*", "\x00", "p9" * 500):
        assert dest("orders", key) in allowed


def test_per_topic_counts_and_exact_entries() -> None:
    dest = Destinations(
        {"orders": "shop/orders.p{partition}", "*": "events/{topic}"},
        broker="rabbitmq",
        partitions={"orders": 3},
    )
    assert dest("orders", "k1") == f"shop/orders.p{partition_for('k1', 3)}"
    assert dest("audit", "k1") == "events/audit"  # not split
    assert dest.partitions_of("audit") is None


@pytest.mark.parametrize(
    ("mapping", "partitions", "says"),
    [
        ({"*": "e.{topic}.p{partition}"}, None, "give the other topics a partition count"),
        ({"orders": "o.p{partition}"}, None, "has no partition count"),
        ({"*": "e.{topic}"}, {"orders": 2}, "has no {partition} placeholder"),
        ({"orders": "o.fixed"}, {"orders": 2}, "has no {partition} placeholder"),
        ({"*": "e.{topic}.{partition:02d}"}, {"*": 2}, "may only use"),
        ({"*": "e.{topic}.p{partition}"}, {"*": 0}, "1..1024"),
        ({"*": "e.{topic}.p{partition}"}, {"*": 2000}, "1..1024"),
        ({"*": "e.{topic}.p{partition}"}, {"*": "8"}, "whole number"),
        ({"orders": "o.{key}"}, {"orders": 2}, "may only use"),
    ],
)
def test_counts_and_templates_are_checked(
    mapping: dict[str, str], partitions: dict[str, Any] | None, says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says.replace("{", r"\{").replace("}", r"\}")):
        Destinations(mapping, partitions=partitions)


def test_a_batch_sends_each_message_to_its_keys_partition() -> None:
    from relay.brokers.memory import MemoryPublisher

    pub = MemoryPublisher(destinations={"*": "ev.{topic}.p{partition}"}, partitions={"*": 4})
    envelopes = [_env("orders", f"k{i}") for i in range(40)] + [_env("audit", "a")]
    results = asyncio.run(pub.publish_batch(envelopes))
    assert results == [None] * len(envelopes)
    for env in envelopes:
        assert env in pub.messages[f"ev.{env.topic}.p{partition_for(env.key, 4)}"]


def test_the_config_takes_partitions_from_the_file_and_the_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text("""
database_url = "postgresql://localhost/x"
[broker]
url = "memory:"
[broker.destinations]
"*" = "ev.{topic}.p{partition}"
[broker.partitions]
"*" = 4
orders = 8
""")  # fmt: skip
    config = RelayConfig.load(cfg, env={})
    assert dict(config.partitions) == {"*": 4, "orders": 8}
    config = RelayConfig.load(cfg, env={"OUTBOX_BROKER_PARTITIONS": "orders=16,audit=2"})
    assert dict(config.partitions) == {"*": 4, "orders": 16, "audit": 2}
    pub: Any = make_publisher(config)
    results = asyncio.run(pub.publish_batch([_env("orders", "k1")]))
    assert results == [None]
    assert list(pub.messages) == [f"ev.orders.p{partition_for('k1', 16)}"]


def test_the_config_refuses_a_bad_count_or_a_template_without_one(tmp_path: Path) -> None:
    env = {"OUTBOX_DATABASE_URL": "postgresql://localhost/x", "OUTBOX_BROKER_URL": "memory:"}
    with pytest.raises(ConfigurationError, match="not a valid int"):
        RelayConfig.load(env={**env, "OUTBOX_BROKER_PARTITIONS": "orders=many"})
    with pytest.raises(ConfigurationError, match="no partition count"):
        RelayConfig.load(env={**env, "OUTBOX_BROKER_DESTINATIONS": "orders=o.p{partition}"})


@pytest.mark.parametrize("url", ["kafka://127.0.0.1:9092", "sqs://us-east-1"])
def test_brokers_that_partition_by_themselves_refuse_partitions(url: str) -> None:
    import_or_missing("confluent_kafka" if url.startswith("kafka") else "boto3", url[:5])
    with pytest.raises(ConfigurationError, match=r"broker\.partitions"):
        publisher_for_url(url, destinations={"*": "{topic}.p{partition}"}, partitions={"*": 2})


def test_relay_check_lists_each_partitions_destination(url: str, tmp_path: Path) -> None:
    import_or_missing("nats", "nats")
    write(url, [("orders", "k1")])
    with PrivateNats(tmp_path / "js") as nats_server:
        cfg = tmp_path / "check.toml"
        cfg.write_text(f"""
database_url = "{url}"
[broker]
url = "{nats_server.url}"
stream = "SHOP"
stream_subjects = ["shop.>"]
create_stream = true
[broker.destinations]
"*" = "shop.{{topic}}.p{{partition}}"
[broker.partitions]
"*" = 3
""")  # fmt: skip
        done = subprocess.run(
            [OUTBOX, "relay", "check", "--config", str(cfg)],
            capture_output=True, text=True, timeout=60, check=False, env=dict(os.environ),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        for p in range(3):
            assert f"topic orders partition {p}/3 -> shop.orders.p{p}: ok" in done.stdout
