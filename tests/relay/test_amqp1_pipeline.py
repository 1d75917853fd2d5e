"""The whole pipeline on a real AMQP 1.0 broker (a private RabbitMQ node with its AMQP 1.0
plugin, tests/support/amqp1_broker.py): rows committed with the outbox, relayed with ``amqp1://``,
applied by an ordered, batched ``inbox.Amqp1Consumer``. Every message is applied once, each key
in order, a poison message recorded dead; and the same across a ``kill -9`` of the broker in
the middle of the stream, with the broker restarted (nothing lost at the inbox)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import Amqp1Consumer, AsyncHandlerRunner, Batching
from inbox.testing import wait_until_processed
from relay import Relay, TopicPolicy
from relay.brokers import publisher_for_url
from tests.relay.relay_helpers import config, running, statuses, write
from tests.support.amqp1_broker import Node, node
from tests.support.services import import_or_missing

KEYS, PER_KEY = 12, 20


def _setup(url: str) -> tuple[list[uuid.UUID], uuid.UUID]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE applied (id uuid, key text, seq bigint, tenant text, "
                     "n int, at timestamptz DEFAULT clock_timestamp())")  # fmt: skip
    half = KEYS * PER_KEY // 2
    ids = write(url, [("orders", f"k{i % KEYS}") for i in range(half)], headers={"tenant": "a"})
    (poison,) = write(url, [("orders", "k0")], headers={"tenant": "poison"})
    ids += write(url, [("orders", f"k{i % KEYS}") for i in range(half, 2 * half)],
                 headers={"tenant": "a"})  # fmt: skip
    return ids, poison


async def _handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
    if env.headers.get("tenant") == "poison":
        raise ValueError("cannot apply this one")
    await conn.execute(
        "INSERT INTO applied (id, key, seq, tenant, n) VALUES (%s, %s, %s, %s, %s)",
        (env.id, env.key, env.seq, env.headers.get("tenant"), json.loads(env.payload)["n"]),
    )


async def _consume(
    url: str, broker_url: str, address: str, done: asyncio.Event, restarts: list[str]
) -> None:
    """Run the consumer until ``done``; it reconnects by itself, so ``run()`` ending with a
    ConnectionError (recorded in ``restarts``) would be a failure of the test."""
    async with AsyncConnectionPool(url, min_size=1, max_size=4, open=False) as pool:
        runner = AsyncHandlerRunner(pool, _handler, consumer="orders-svc", ordered=True,
                                    max_attempts=2)  # fmt: skip
        while not done.is_set():
            consumer = Amqp1Consumer(runner, address=address, url=broker_url, credit=50,
                                     redeliver_delay=0.1, connect_timeout=2,
                                     batching=Batching(size=20, wait=0.02, workers=3))  # fmt: skip
            task = asyncio.create_task(consumer.run())
            stopped = asyncio.create_task(done.wait())
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not task.done():
                consumer.stop()
            try:
                await task
            except ConnectionError as exc:
                restarts.append(str(exc))
                await asyncio.sleep(0.2)


def _check(url: str, ids: list[uuid.UUID], poison: uuid.UUID) -> None:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, key, seq, tenant, n FROM applied ORDER BY at").fetchall()
        (status,) = conn.execute(
            "SELECT status FROM inbox_messages WHERE message_id = %s", (poison,)
        ).fetchone() or (None,)
    assert status == "dead"
    assert sorted(r[0] for r in rows) == sorted(ids)  # each applied exactly once
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, key, seq, _, _ in rows:
        by_key[key].append(seq)
    for key, seqs in by_key.items():
        assert seqs == sorted(seqs), f"{key} applied out of order: {seqs}"
    assert sum(len(s) for s in by_key.values()) == len(ids)


def _run(url: str, broker: Node, kill: bool) -> list[str]:
    ids, poison = _setup(url)
    queue = f"orders-{uuid.uuid4().hex[:10]}"
    address = f"/queue/{queue}"
    restarts: list[str] = []

    async def go() -> None:
        pub = publisher_for_url(broker.url, destinations={"orders": address}, ack_timeout=2)
        relay = Relay(config(url, publish_timeout=3, batch_size=25,
                             default_policy=TopicPolicy(max_attempts=1000)), pub)  # fmt: skip
        done = asyncio.Event()
        consumer = asyncio.create_task(_consume(url, broker.url, address, done, restarts))
        async with running(relay):
            if kill:  # mid-stream: some published and applied, the rest not yet
                await asyncio.to_thread(
                    wait_until_processed, url, consumer="orders-svc", ids=ids[:40], timeout=60
                )
                await asyncio.to_thread(broker.kill)
                # committed while the broker is down: the relay publishes them after it is back
                ids.extend(await asyncio.to_thread(
                    write, url, [("orders", f"k{i % KEYS}") for i in range(KEYS)],
                    headers={"tenant": "a"},
                ))  # fmt: skip
                await asyncio.sleep(1.0)  # relay and consumer see the broker gone
                await asyncio.to_thread(broker.restart)
            await asyncio.to_thread(
                wait_until_processed, url, consumer="orders-svc", ids=[*ids, poison], timeout=120
            )
        done.set()
        await consumer

    asyncio.run(go())
    assert statuses(url) == {"published": len(ids) + 1}
    _check(url, ids, poison)
    return restarts


def test_outbox_relay_amqp1_inbox_applies_each_message_once_in_key_order(url: str) -> None:
    import_or_missing("proton", "amqp1")
    assert _run(url, node(), kill=False) == []


def test_broker_killed_mid_stream_loses_nothing(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import_or_missing("proton", "amqp1")
    broker = Node()  # its own node: the others' is not killed under them
    try:
        assert _run(url, broker, kill=True) == []  # the consumer reconnected by itself
    finally:
        broker.stop()
    assert "connecting again" in caplog.text  # it did see the broker go
