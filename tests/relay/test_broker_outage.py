"""Broker outages on live brokers (cut off by a TCP proxy) and real PostgreSQL: an outage never
counts attempts or dead-letters anything, even when every claim holds one key; a message refused
before sending is never charged; the adapters hand nothing to a disconnected client."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg

from relay import BrokerUnreachableError, Relay, RetryablePublishError, TopicPolicy
from relay.brokers import publisher_for_url
from tests.relay.broker_helpers import MqttSubscriber, Proxy, nats_stream, need, stream_seqs
from tests.relay.broker_helpers import kafka_records as kafka_broker_records
from tests.relay.relay_helpers import FakePublisher, await_for, config, running, statuses, write
from tests.support import kafka_broker
from tests.support.ledger import record
from tests.support.services import import_or_missing


def _rows(url: str) -> list[tuple[str, int, str, int]]:
    """(key, seq, status, attempts charged). A claim counts its attempt when it leases the row
    and a release gives it back, both in the statement that sets or clears the lease; so a row
    read while a claim is in flight shows that claim's attempt. Reading the lease in the same
    snapshot leaves it out: this read once raced a claim under load and saw 1 for an outage."""
    with psycopg.connect(url) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT key, seq, status, attempts - (lease_token IS NOT NULL)::int "
            "FROM outbox_messages ORDER BY key, seq"
        ).fetchall()


def _dead(url: str) -> int:
    return statuses(url).get("dead", 0)


def _outage_config(url: str) -> Any:
    # the adapter's ack timeout (1.5 s) ends before the relay's publish_timeout: the failures
    # come back per message, as they do with the default settings (10 s each)
    return config(url, publish_timeout=4, default_policy=TopicPolicy(max_attempts=2))


async def _outage_one_key(url: str, relay: Relay, proxy: Proxy, connected: Any, topic: str) -> None:
    """One message before, one during and one after a broker outage, all on one key."""
    async with running(relay):
        await asyncio.to_thread(write, url, [(topic, "k1")])
        await await_for(lambda: statuses(url) == {"published": 1}, what="k1#1 published")
        await proxy.down()
        await await_for(lambda: not connected(), what="the adapter to see the outage")
        await asyncio.to_thread(write, url, [(topic, "k1")])
        # several outage rounds (each a pause), or the old behaviour: attempts counted to dead
        await await_for(
            lambda: relay.dispatcher.broker_backoff.failures >= 3 or _dead(url) > 0,
            what="three outage rounds",
        )
        assert [r[2:] for r in _rows(url)] == [("published", 1), ("pending", 0)]
        await proxy.up()
        await asyncio.to_thread(write, url, [(topic, "k1")])
        await await_for(lambda: statuses(url) == {"published": 3}, what="recovery")


def test_relay_mqtt_outage_with_one_key_counts_no_attempt_and_sends_each_once(url: str) -> None:
    need(1883, "Mosquitto")
    topic = f"rt/{uuid.uuid4().hex[:10]}"
    sub = MqttSubscriber(topic)

    async def go() -> None:
        proxy = Proxy(1883)
        await proxy.up()
        pub: Any = publisher_for_url(f"mqtt://127.0.0.1:{proxy.port}", timeout=1.5)
        relay = Relay(_outage_config(url), pub)
        try:
            await _outage_one_key(
                url, relay, proxy, lambda: pub._client and pub._client.is_connected(), topic
            )
            await await_for(lambda: len(sub.seqs) >= 3, what="three messages at the subscriber")
        finally:
            await proxy.down()

    try:
        asyncio.run(go())
    finally:
        sub.close()
    # nothing was handed to paho while it was disconnected, so nothing arrives twice
    assert sub.seqs == [1, 2, 3]


def test_relay_nats_outage_with_one_key_counts_no_attempt(url: str) -> None:
    need(4222, "NATS")

    async def go() -> list[int]:
        async with nats_stream() as (js, stream, subject):
            proxy = Proxy(4222)
            await proxy.up()
            pub: Any = publisher_for_url(f"nats://127.0.0.1:{proxy.port}", timeout=1.5)
            relay = Relay(_outage_config(url), pub)
            try:
                await _outage_one_key(
                    url, relay, proxy, lambda: pub._nc and pub._nc.is_connected, subject
                )
            finally:
                await proxy.down()
            return await stream_seqs(js, stream)

    assert asyncio.run(go()) == [1, 2, 3]


def test_relay_kafka_outage_with_one_key_counts_no_attempt(url: str) -> None:
    """A real Kafka-protocol broker (tansu) reached only through the proxy: it advertises the
    proxy's port, so every connection the client makes goes through it."""
    import_or_missing("confluent_kafka", "kafka")
    topic = f"rt-{uuid.uuid4().hex[:10]}"

    async def go() -> list[int]:
        broker_port = kafka_broker.free_port()
        proxy = Proxy(broker_port)
        await proxy.up()
        broker = kafka_broker.launch(broker_port, advertised_port=proxy.port)
        try:
            bootstrap = f"127.0.0.1:{proxy.port}"
            pub: Any = publisher_for_url(f"kafka://{bootstrap}", timeout=1.5)
            relay = Relay(_outage_config(url), pub)
            try:
                # librdkafka reports the outage when polled: the adapter polls at each batch
                def connected() -> bool:
                    pub._producer.poll(0)
                    return not pub._all_down

                await _outage_one_key(url, relay, proxy, connected, topic)
            finally:
                await proxy.down()
            await proxy.up()
            records = await asyncio.to_thread(kafka_broker_records, bootstrap, topic, 3)
            await proxy.down()
        finally:
            kafka_broker.stop(broker)
        return [int(dict(r.headers())["outbox-seq"]) for r in records]

    # nothing was handed to librdkafka while every broker was down: each arrives once
    assert asyncio.run(go()) == [1, 2, 3]


def test_mqtt_adapter_hands_nothing_to_paho_while_disconnected() -> None:
    # paho keeps a QoS 1 message it could not send and sends it after reconnecting, while the
    # relay (told "not queued") sends it again: copies, even of a message since dead-lettered.
    need(1883, "Mosquitto")
    from outbox.envelope import Envelope

    topic = f"rt/{uuid.uuid4().hex[:10]}"
    sub = MqttSubscriber(topic)

    def env(seq: int) -> Envelope:
        return Envelope(uuid.uuid4(), topic, "k", seq, b"{}", "application/json", {}, None, None)

    async def go() -> None:
        proxy = Proxy(1883)
        await proxy.up()
        pub: Any = publisher_for_url(f"mqtt://127.0.0.1:{proxy.port}", timeout=1)
        try:
            assert await pub.publish_batch([env(1)]) == [None]
            await proxy.down()
            await await_for(lambda: not pub._client.is_connected(), what="disconnected")
            for _ in range(3):  # what the relay's retries did
                try:
                    results = await pub.publish_batch([env(2)])
                except BrokerUnreachableError:
                    continue
                assert all(isinstance(r, RetryablePublishError) for r in results)
            await proxy.up()
            await await_for(lambda: pub._client.is_connected(), within=30, what="reconnected")
            assert await pub.publish_batch([env(3)]) == [None]
            await await_for(lambda: 3 in sub.seqs, what="the message after the outage")
        finally:
            await pub.close()
            await proxy.down()

    try:
        asyncio.run(go())
    finally:
        sub.close()
    assert sub.seqs == [1, 3]


def test_relay_claims_of_one_key_each_failing_over_two_keys_are_an_outage(url: str) -> None:
    # Decision logic only (a fake publisher): one key per claim, every message failing.
    write(url, [("t", "a"), ("t", "b")])
    pub = FakePublisher()
    pub.fail = lambda env: RetryablePublishError("no responders")
    relay = Relay(
        config(url, batch_size=1, max_in_flight=1, default_policy=TopicPolicy(max_attempts=2)),
        pub,
    )

    async def go() -> None:
        async with running(relay):
            await await_for(
                lambda: relay.dispatcher.broker_backoff.failures >= 3 or _dead(url) > 0,
                what="outage rounds",
            )
            assert _dead(url) == 0
            assert max(r[3] for r in _rows(url)) <= 1  # only the first failed claim counted
            pub.fail = lambda env: None
            await await_for(lambda: statuses(url) == {"published": 2}, what="recovery")

    asyncio.run(go())


def test_relay_one_failing_key_alone_still_reaches_dead(url: str) -> None:
    write(url, [("t", "a")])
    pub = FakePublisher()
    pub.fail = lambda env: RetryablePublishError("rejected by a plugin")
    relay = Relay(config(url, batch_size=1, default_policy=TopicPolicy(max_attempts=3)), pub)

    async def go() -> None:
        async with running(relay):
            await await_for(lambda: _dead(url) == 1, what="the failing message to go dead")

    asyncio.run(go())
    assert _rows(url) == [("a", 1, "dead", 3)]


def test_relay_skip_never_charges_a_message_the_adapter_did_not_send(url: str) -> None:
    # Redis refuses a1 before sending (too large): a2 and a3 come back "not sent". Under
    # 'skip' with max_attempts=1 they were charged an attempt each and dead-lettered unsent.
    need(6379, "Redis")
    import redis

    topic = f"rt_skip_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url) as conn:
        from outbox import Message, publish_batch

        publish_batch(
            conn,
            [
                Message(topic=topic, key="k", payload={"big": "x" * 200}),
                Message(topic=topic, key="k", payload={"n": 2}),
                Message(topic=topic, key="k", payload={"n": 3}),
            ],
            wakeup=False,
        )
        conn.commit()
    assert record(url) == 3  # pending before the relay starts: "all settled" means settled
    # the adapter's timeout must end before the relay's publish_timeout (2 s in these tests)
    pub = publisher_for_url("redis://127.0.0.1:6379/0", max_payload_bytes=100, timeout=1.5)
    relay = Relay(config(url, topics={topic: TopicPolicy(on_dead="skip", max_attempts=1)}), pub)

    async def go() -> None:
        async with running(relay):
            await await_for(lambda: statuses(url).get("pending", 0) == 0, what="all settled")

    asyncio.run(go())
    client = redis.Redis()
    try:
        seqs = [int(f[b"outbox-seq"]) for _, f in client.xrange(topic)]
    finally:
        client.delete(topic)
        client.close()
    assert _rows(url) == [("k", 1, "dead", 1), ("k", 2, "published", 1), ("k", 3, "published", 1)]
    assert seqs == [2, 3]


def test_relay_releases_messages_whose_ack_was_lost_with_the_connection(url: str) -> None:
    # Decision logic only: the adapter reports BrokerUnreachableError for b1 (connection lost
    # before its ack) while a1 was acknowledged.
    write(url, [("t", "a"), ("t", "b"), ("t", "b")])
    pub = FakePublisher()
    lost = BrokerUnreachableError("connection lost before the ack")
    pub.fail = lambda env: lost if env.key == "b" else None
    relay = Relay(config(url, default_policy=TopicPolicy(max_attempts=1)), pub)

    async def go() -> None:
        async with running(relay):
            outage = relay.dispatcher.broker_backoff
            await await_for(lambda: outage.failures >= 2, what="two paused rounds")
            assert [r[2:] for r in _rows(url)] == [
                ("published", 1),
                ("pending", 0),
                ("pending", 0),
            ]
            pub.fail = lambda env: None
            await await_for(lambda: statuses(url) == {"published": 3}, what="recovery")

    asyncio.run(go())
