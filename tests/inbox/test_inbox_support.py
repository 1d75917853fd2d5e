"""Wire decoders (no I/O), the testing helpers, and the inbox revision vs schema.py."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from inbox_helpers import effects, make_envelope
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from inbox import AsyncHandlerRunner, Outcome
from inbox._wire import decode_kafka, decode_mqtt, decode_nats, decode_rabbitmq, decode_redis
from inbox.testing import InMemoryBroker, ResultLog, wait_until_processed
from outbox import InvalidMessageError, make_metadata
from outbox._migrate import downgrade, sqlalchemy_url, upgrade


def test_decoders_invert_the_wire_mapping() -> None:
    env = make_envelope(seq=7, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    h = env.to_headers()
    decoded = [
        decode_nats({**h, "Nats-Msg-Id": str(env.id)}, env.payload),
        decode_rabbitmq({k: v.encode() for k, v in h.items()}, env.payload),
        decode_kafka([(k, v.encode()) for k, v in h.items()], env.payload),
        decode_redis({k.encode(): v.encode() for k, v in h.items()} | {b"payload": env.payload}),
        decode_mqtt(list(h.items()), env.payload),
    ]
    for got in decoded:
        assert (got.id, got.topic, got.key, got.seq, got.payload) == (
            env.id,
            env.topic,
            env.key,
            7,
            env.payload,
        )
        assert got.traceparent == env.traceparent
        assert got.headers.get("tenant") == "acme"
    with pytest.raises(InvalidMessageError, match="outbox-id"):
        decode_redis({b"payload": b"x"})


def test_in_memory_broker_and_waiters(effects_url: str) -> None:
    async def handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        await conn.execute(
            "INSERT INTO effects (consumer, message_id, key) VALUES ('mem', %s, %s)",
            (env.id, env.key),
        )

    async def go() -> ResultLog:
        broker, log = InMemoryBroker(), ResultLog()
        async with AsyncConnectionPool(effects_url, min_size=1, open=False) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer="mem", ordered=True)
            consumer = broker.consumer(runner, on_result=log)
            task = asyncio.create_task(consumer.run())
            m1, m2 = make_envelope(seq=1), make_envelope(seq=2)
            await broker.publish_batch([m2, m1])  # out of order: m2 comes back after m1
            broker.deliver_again(m1)
            await log.wait_processed([m1.id, m2.id], within=10)
            await asyncio.to_thread(
                wait_until_processed, effects_url, consumer="mem", ids=[m1.id, m2.id]
            )
            consumer.stop()
            await task
        return log

    log = asyncio.run(go())
    assert [r.outcome for _, r in log.results][:1] == [Outcome.OUT_OF_ORDER]
    assert len(log.outcomes(Outcome.PROCESSED)) == 2
    assert len(effects(effects_url, "mem")) == 2
    with pytest.raises(TimeoutError, match="not processed"):
        wait_until_processed(effects_url, consumer="mem", ids=[uuid.uuid4()], timeout=0.1)


def test_inbox_revision_matches_schema_and_downgrades(empty_database_url: str) -> None:
    upgrade(empty_database_url)
    engine = create_engine(sqlalchemy_url(empty_database_url), poolclass=NullPool)
    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), make_metadata())
    assert [d for d in diffs if "alembic_version" not in str(d)] == []
    downgrade(empty_database_url, "outbox_0001")
    with engine.connect() as conn:
        names = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'inbox_kafka_offsets'"
        ).scalar()
    engine.dispose()
    assert names == 0
