"""The AMQP 1.0 consumer fed what the relay never sends, live on the private AMQP 1.0 node:
a message with a malformed outbox header (recorded dead, its key moves on), one that is not an
outbox message at all (an ``amqp-value`` string body, no properties) and one larger than the
consumer's ``max_payload_bytes``: each is rejected at the broker (never redelivered), the
consumer keeps running, the good messages around them are applied in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import Amqp1Consumer, AsyncHandlerRunner, Outcome
from inbox.testing import ResultLog, wait_until_processed
from outbox.envelope import HEADER_CREATED_AT
from tests.inbox.broker_fixtures import Amqp1
from tests.inbox.inbox_helpers import effects, inbox_rows, make_envelope
from tests.support.services import import_or_missing


def test_malformed_and_foreign_messages_are_rejected_and_the_consumer_keeps_running(
    effects_url: str,
) -> None:
    import_or_missing("proton", "amqp1")
    from proton import Message

    broker = Amqp1()
    first, broken, third = (make_envelope(key="K", seq=s) for s in (1, 2, 3))

    async def main() -> None:
        await broker.setup()
        try:
            await broker.publish([first])
            bad = {**broken.to_headers(), HEADER_CREATED_AT: "yesterday"}
            sender = broker.sender
            await asyncio.to_thread(sender.send, Message(body=b"{}", inferred=True,
                                                         properties=bad, durable=True))  # fmt: skip
            await asyncio.to_thread(sender.send, Message(body="a string, no outbox headers"))
            await asyncio.to_thread(sender.send, Message(body=b"x" * 70_000, inferred=True))
            await broker.publish([third])
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=2) as pool:

                async def handler(conn: Any, msg: Any) -> None:
                    await conn.execute(
                        "INSERT INTO effects (consumer, message_id, key, seq) "
                        "VALUES ('svc', %s, %s, %s)",
                        (msg.id, msg.key, msg.seq),
                    )

                runner = AsyncHandlerRunner(pool, handler, consumer="svc", ordered=True)
                consumer = broker.consumer(runner, ResultLog(), 0)
                consumer.max_payload_bytes = 65_536
                task = asyncio.create_task(consumer.run())
                await asyncio.to_thread(
                    wait_until_processed, effects_url, consumer="svc",
                    ids=[first.id, broken.id, third.id], timeout=30,
                )  # fmt: skip
                assert not task.done(), "the consumer stopped on a bad message"
                consumer.stop()
                await task
        finally:
            await broker.teardown()

    asyncio.run(main())
    assert [row[3] for row in effects(effects_url, "svc")] == [1, 3]
    status, _, last_error, _ = inbox_rows(effects_url, "svc")[broken.id]
    assert status == "dead"
    assert "ISO 8601" in last_error
    from tests.support.amqp1_broker import node

    # rejected, not released: nothing is left in the queue to be redelivered
    listing = node().ctl("list_queues", "name", "messages", "--no-table-headers", "-q")
    counts = dict(line.split("\t") for line in listing.strip().splitlines())
    assert counts[broker.queue] == "0"


def test_a_broker_that_cannot_be_reached_at_start_fails_run_without_the_password() -> None:
    import_or_missing("proton", "amqp1")

    async def handler(conn: Any, msg: Any) -> None: ...

    runner = AsyncHandlerRunner(lambda: None, handler, consumer="svc")
    consumer = Amqp1Consumer(runner, address="/queue/q", url="amqp1://svc:s3cret@127.0.0.1:1",
                             connect_timeout=3)  # fmt: skip
    assert "s3cret" not in consumer.url

    async def main() -> None:
        with pytest.raises(ConnectionError) as caught:
            await asyncio.wait_for(consumer.run(), 10)
        assert "s3cret" not in str(caught.value)

    asyncio.run(main())


def test_a_backlog_behind_failing_messages_drains_without_a_release_per_early_message(
    effects_url: str,
) -> None:
    """The node puts a released message back at the head of its queue. A backlog where each key
    starts with a message that fails until it is dead (max_attempts=3) and its later messages
    follow it: a consumer that released the failing message and each early one after
    ``redeliver_delay``, holding up its worker meanwhile, takes about (1 + early messages in
    its window) x 1 s per attempt and key, minutes here (it timed out). The consumer retries
    the failing message from memory and sets the early ones aside until it is dead: every
    message once, in order, well before the timeout, and each early message out of order about
    once (not once per attempt of its key's failing message)."""
    import_or_missing("proton", "amqp1")
    broker = Amqp1()
    keys, length = [f"K{i}" for i in range(6)], 12
    stream = [
        make_envelope(key=key, seq=seq, payload=b'{"poison": true}' if seq == 1 else b"{}")
        for key in keys
        for seq in range(1, length + 1)
    ]
    results = ResultLog()

    async def main() -> None:
        await broker.setup()
        try:
            await broker.publish(stream)  # the whole backlog is in the queue before the consumer
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=2) as pool:

                async def handler(conn: Any, msg: Any) -> None:
                    if msg.payload == b'{"poison": true}':
                        raise ValueError("poison")
                    await conn.execute(
                        "INSERT INTO effects (consumer, message_id, key, seq) "
                        "VALUES ('svc', %s, %s, %s)",
                        (msg.id, msg.key, msg.seq),
                    )

                runner = AsyncHandlerRunner(pool, handler, consumer="svc", ordered=True,
                                            max_attempts=3, on_dead="skip")  # fmt: skip
                consumer = Amqp1Consumer(
                    runner, address=broker.address, url=broker.url, credit=20,
                    redeliver_delay=1.0, on_result=results,
                )  # fmt: skip
                task = asyncio.create_task(consumer.run())
                try:
                    await results.wait_for(
                        lambda log: log.settled_ids() >= {e.id for e in stream}, within=60
                    )
                finally:
                    consumer.stop()
                    await task
        finally:
            await broker.teardown()

    asyncio.run(main())
    applied = effects(effects_url, "svc")
    assert len(applied) == len(keys) * (length - 1)  # each message once, the poison ones dead
    for key in keys:
        assert [row[3] for row in applied if row[2] == key] == list(range(2, length + 1))
    statuses = {status for status, *_ in inbox_rows(effects_url, "svc").values()}
    assert statuses == {"processed", "dead"}
    early = len(results.outcomes(Outcome.OUT_OF_ORDER))
    assert early <= 2 * len(keys) * (length - 1), early  # no release storm
