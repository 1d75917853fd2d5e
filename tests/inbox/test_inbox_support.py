"""The testing helpers, and the inbox revision vs schema.py."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from inbox import AsyncHandlerRunner, Outcome
from inbox.testing import InMemoryBroker, ResultLog, wait_until_processed
from outbox import make_metadata
from outbox._migrate import downgrade, sqlalchemy_url, upgrade
from tests.inbox.inbox_helpers import effects, make_envelope


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
