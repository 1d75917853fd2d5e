"""A producer's row cannot steer the relay (live brokers, real PostgreSQL).

A row whose topic is a broker address (written before the topic grammar, or inserted
directly by a role that may insert) is refused by the relay before anything is sent: its
topic pauses with a one-line reason, the row stays pending and uncharged, other topics flow.
The JetStream repro: ``$JS.API.STREAM.DELETE.<stream>`` would delete the stream with the
relay's credentials and count the API's reply as an ack."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import psycopg
import pytest

from relay import Relay
from relay.brokers import publisher_for_url
from tests.relay.broker_helpers import need
from tests.relay.relay_helpers import await_for, config, running, write
from tests.support.services import import_or_missing


def _steer(url: str, topic: str) -> uuid.UUID:
    """A row with ``topic``, as an older writer (or a direct INSERT) leaves it: written under
    a good topic, then renamed, because publish() and outbox_publish() refuse it now."""
    [msg_id] = write(url, [("placeholder", "k")])
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE outbox_messages SET topic = %s WHERE id = %s", (topic, msg_id))
    return msg_id


def _row(url: str, msg_id: uuid.UUID) -> tuple[str, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status, attempts FROM outbox_messages WHERE id = %s", (msg_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


async def _refused(url: str, broker: str, topic: str, good: str) -> dict[str, Any]:
    """Run a relay on ``broker`` over a steering row of ``topic`` and a good row of ``good``
    (mapped to itself); the steering topic's pause, once the good row is published."""
    bad_id = _steer(url, topic)
    [good_id] = write(url, [(good, "k")])
    relay = Relay(config(url, heartbeat_interval=0.2), publisher_for_url(broker, timeout=1.5))
    async with running(relay):
        snapshot = relay.dispatcher.destinations.snapshot
        await await_for(lambda: topic in snapshot(), what="the steering topic's pause")
        await await_for(lambda: _row(url, good_id)[0] == "published", what="the good row")
    assert _row(url, bad_id) == ("pending", 0)  # untried, uncharged
    pause: dict[str, Any] = snapshot()[topic]
    assert "\n" not in pause["reason"]
    assert "not a name" in pause["reason"]
    assert "not sent" in pause["reason"]
    return pause


def test_the_jetstream_admin_api_is_not_reachable_through_a_row(url: str) -> None:
    need(4222, "NATS")
    import nats

    async def go() -> tuple[int, dict[str, Any]]:
        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        victim = f"VICTIM_{uuid.uuid4().hex[:10]}"
        good = f"tb_{uuid.uuid4().hex[:10]}"
        await js.add_stream(name=victim, subjects=[f"{victim.lower()}.>"])
        await js.add_stream(name=good.upper(), subjects=[good])
        await js.publish(f"{victim.lower()}.x", b"kept")
        try:
            steering = f"$JS.API.STREAM.DELETE.{victim}"
            pause = await _refused(url, "nats://127.0.0.1:4222", steering, good)
            info = await js.stream_info(victim)  # raises NotFoundError had it been deleted
            return int(info.state.messages), pause
        finally:
            for name in (victim, good.upper()):
                with contextlib.suppress(Exception):  # cleanup; the assertions are the test
                    await js.delete_stream(name)
            await nc.close()

    kept, pause = asyncio.run(go())
    assert kept == 1  # the victim stream is intact, with its message
    assert pause["refusals"] >= 1


@pytest.mark.parametrize(
    ("broker", "port", "topic"),
    [
        ("mqtt://127.0.0.1:1883", 1883, "$SYS/broker/outbox-{tag}"),
        ("mqtt://127.0.0.1:1883", 1883, "$share/g/outbox-{tag}"),
        ("redis://127.0.0.1:6379/0", 6379, "__keyspace@0__:outbox-{tag}"),
    ],
)
def test_a_broker_system_address_is_not_reachable_through_a_row(
    url: str, broker: str, port: int, topic: str
) -> None:
    need(port, broker.partition(":")[0])
    tag = uuid.uuid4().hex[:10]
    asyncio.run(_refused(url, broker, topic.format(tag=tag), f"tb-{tag}"))
    if broker.startswith("redis"):
        import redis

        client = redis.Redis.from_url(broker)
        try:
            assert client.exists(topic.format(tag=tag)) == 0  # nothing was appended
            client.delete(f"tb-{tag}")
        finally:
            client.close()


def test_a_kafka_internal_topic_is_not_reachable_through_a_row(url: str) -> None:
    """``__consumer_offsets`` (the groups' committed offsets) as a row's topic: paused, nothing
    produced to it with the relay's credentials."""
    import_or_missing("confluent_kafka", "kafka")
    from tests.support.kafka_broker import bootstrap

    tag = uuid.uuid4().hex[:10]
    asyncio.run(_refused(url, f"kafka://{bootstrap()}", "__consumer_offsets", f"tb-{tag}"))
