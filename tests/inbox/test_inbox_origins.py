"""One topic from several databases (a database per tenant), through their own relays into one
stream, applied by one ordered consumer: every message once, each database's keys in order.

Each database numbers a key's messages from 1; before origins, the consumer kept one position
per (topic, key), so the second database's messages were marked stale and acknowledged with no
effect. Now each database has an origin (outbox_identity, set by the migration), the relay puts
it on every message, and the consumer keeps one position per (origin, topic, key).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Batching, NatsConsumer, Outcome
from inbox.testing import ResultLog
from outbox._migrate import upgrade
from relay import Relay
from relay.brokers.nats import NatsPublisher
from tests.relay.relay_helpers import config, running, write
from tests.support.harness import PgServer
from tests.support.services import require_port

KEYS, PER_KEY = 50, 10


def _origin(url: str) -> str | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT origin FROM outbox_identity").fetchone()
    return row[0] if row else None


async def _run(
    tenants: list[str], inbox_url: str, batching: Batching | None, n: int
) -> ResultLog:
    import nats
    from nats.js.api import ConsumerConfig, StreamConfig

    tag = uuid.uuid4().hex[:8]
    stream, subject = f"TENANTS_{tag}", f"tenants.{tag}.orders"
    nc = await nats.connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await js.add_consumer(stream, ConsumerConfig(durable_name="svc", ack_policy="explicit"))
    log = ResultLog()
    try:
        relays = [
            Relay(
                config(url, relay_id=f"tenant-{i}-{tag}"),
                NatsPublisher(destinations={"orders": subject}, timeout=1.5),
            )
            for i, url in enumerate(tenants)
        ]
        async with (
            running(*relays),
            AsyncConnectionPool(inbox_url, min_size=1, max_size=4, open=False) as pool,
        ):

            async def apply(conn: Any, msg: Any) -> None:
                await conn.execute(
                    "INSERT INTO effects (consumer, message_id, key, seq) VALUES (%s, %s, %s, %s)",
                    (msg.origin or "", msg.id, msg.key, msg.seq),
                )

            runner = AsyncHandlerRunner(pool, apply, consumer="svc", ordered=True)
            consumer = NatsConsumer(runner, stream=stream, durable="svc", subject=subject,
                                    on_result=log, batching=batching)  # fmt: skip
            task = asyncio.create_task(consumer.run())
            await log.wait_for(lambda lg: len(lg.settled_ids()) >= n, within=120)
            consumer.stop()
            await asyncio.wait_for(task, 10)
    finally:
        await js.delete_stream(stream)
        await nc.close()
    return log


@pytest.mark.parametrize(
    "batching", [None, Batching(size=50, wait=0.005, workers=2)], ids=["single", "batched"]
)
def test_two_databases_one_topic_same_keys_each_message_applied_once(
    pg_server: PgServer, effects_url: str, batching: Batching | None
) -> None:
    require_port(4222, "nats")
    with pg_server.fresh_database() as a, pg_server.fresh_database() as b:
        for url in (a, b):
            upgrade(url)  # each its own migration: each its own origin
        origins = [_origin(a), _origin(b)]
        assert None not in origins
        assert origins[0] != origins[1]
        for url in (a, b):  # the same topic and key names in both, each numbered from 1
            write(url, [("orders", f"k{k}") for _ in range(PER_KEY) for k in range(KEYS)])
        log = asyncio.run(_run([a, b], effects_url, batching, 2 * KEYS * PER_KEY))
    outcomes = Counter(result.outcome for _, result in log.results)
    assert outcomes[Outcome.STALE] == 0
    assert outcomes[Outcome.PROCESSED] == 2 * KEYS * PER_KEY
    with psycopg.connect(effects_url) as conn:
        rows = conn.execute("SELECT consumer, key, seq FROM effects ORDER BY at").fetchall()
        positions = conn.execute(
            "SELECT origin, count(*), min(last_seq), max(last_seq) FROM inbox_key_positions "
            "WHERE consumer = 'svc' GROUP BY origin ORDER BY origin"
        ).fetchall()
    applied: dict[tuple[str, str], list[int]] = {}
    for origin, key, seq in rows:  # the handler recorded the message's origin as "consumer"
        applied.setdefault((origin, key), []).append(seq)
    assert applied == {
        (o, f"k{k}"): list(range(1, PER_KEY + 1)) for o in origins for k in range(KEYS)
    }
    assert positions == sorted((o, KEYS, PER_KEY, PER_KEY) for o in origins)


def test_messages_without_origin_keep_one_position_per_topic_and_key(
    database_url: str, effects_url: str
) -> None:
    """A database without an origin (one that published before outbox_0020) publishes as
    before, and its messages are guarded per (topic, key) under the origin ''."""
    require_port(4222, "nats")
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE outbox_identity SET origin = NULL")
        conn.commit()
    write(database_url, [("orders", f"k{k}") for _ in range(3) for k in range(4)])
    log = asyncio.run(_run([database_url], effects_url, None, 12))
    assert {env.origin for env, _ in log.results} == {None}
    assert Counter(r.outcome for _, r in log.results)[Outcome.PROCESSED] == 12
    with psycopg.connect(effects_url) as conn:
        positions = conn.execute(
            "SELECT origin, key, last_seq FROM inbox_key_positions ORDER BY key"
        ).fetchall()
    assert positions == [("", f"k{k}", 3) for k in range(4)]
