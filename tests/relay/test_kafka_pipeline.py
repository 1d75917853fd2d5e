"""The whole pipeline on a real Kafka-protocol broker (tansu): rows committed with the outbox,
relayed to Kafka, applied by an ordered ``inbox.KafkaConsumer`` with its offsets stored in the
effect's transaction. Every message is applied once, each key in order, with its headers."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, KafkaConsumer
from inbox.testing import wait_until_processed
from relay import Relay
from relay.brokers import publisher_for_url
from tests.relay.relay_helpers import config, running, write
from tests.support.kafka_broker import bootstrap
from tests.support.services import import_or_missing

KEYS, PER_KEY = 20, 25


def test_outbox_relay_kafka_inbox_applies_each_message_once_in_key_order(url: str) -> None:
    import_or_missing("confluent_kafka", "kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    server = bootstrap()
    kafka_topic = f"orders-{uuid.uuid4().hex[:10]}"
    # the topic exists before the consumer subscribes (as in production): a consumer subscribed
    # to a missing topic would only see it at its next metadata refresh (5 minutes by default)
    admin = AdminClient({"bootstrap.servers": server})
    (created,) = admin.create_topics([NewTopic(kafka_topic, 3, 1)]).values()
    created.result(10)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE applied (id uuid, key text, seq bigint, tenant text, "
                     "n int, at timestamptz DEFAULT clock_timestamp())")  # fmt: skip
    ids = write(url, [("orders", f"k{i % KEYS}") for i in range(KEYS * PER_KEY)],
                headers={"tenant": "acme"})  # fmt: skip

    async def handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        await conn.execute(
            "INSERT INTO applied (id, key, seq, tenant, n) VALUES (%s, %s, %s, %s, %s)",
            (env.id, env.key, env.seq, env.headers.get("tenant"), json.loads(env.payload)["n"]),
        )

    async def go() -> None:
        pub = publisher_for_url(
            f"kafka://{server}", destinations={"orders": kafka_topic}, ack_timeout=1.5
        )
        relay = Relay(config(url), pub)
        async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer="orders-svc", ordered=True)
            consumer = KafkaConsumer(
                runner, topics=[kafka_topic], offsets_in_db=True, poll_timeout=0.2,
                config={"bootstrap.servers": server, "group.id": f"g-{kafka_topic}",
                        "session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
            )  # fmt: skip
            task = asyncio.create_task(consumer.run())
            async with running(relay):
                await asyncio.to_thread(
                    wait_until_processed, url, consumer="orders-svc", ids=ids, timeout=90
                )
            consumer.stop()
            await task

    asyncio.run(go())
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, key, seq, tenant, n FROM applied ORDER BY at").fetchall()
    assert sorted(r[0] for r in rows) == sorted(ids)  # each applied exactly once
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, key, seq, tenant, _ in rows:
        assert tenant == "acme"
        by_key[key].append(seq)
    assert by_key == {f"k{k}": list(range(1, PER_KEY + 1)) for k in range(KEYS)}
    assert sorted(r[4] for r in rows) == list(range(KEYS * PER_KEY))  # every payload intact
