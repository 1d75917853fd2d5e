"""publish / publish_async through every supported connection type, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import outbox
from outbox import Message, publish, publish_async, publish_batch, publish_batch_async
from outbox._migrate import sqlalchemy_url, upgrade


def rows(url: str, where: str = "true") -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            f"SELECT id, topic, key, seq, headers, convert_from(payload, 'UTF8'), content_type "
            f"FROM outbox_messages WHERE {where} ORDER BY topic, key, seq"
        ).fetchall()


# Each writer publishes one message through one kind of connection, then commits or rolls back.
def _sa_session(url: str, commit: bool) -> uuid.UUID:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    with Session(engine) as session:
        session.execute(text("SELECT 1"))
        msg_id = publish(session, topic="orders", key="k", payload={"via": "session"})
        session.commit() if commit else session.rollback()
    engine.dispose()
    return msg_id


def _sa_connection(url: str, commit: bool) -> uuid.UUID:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    with engine.connect() as conn:
        msg_id = publish(conn, topic="orders", key="k", payload={"via": "connection"})
        conn.commit() if commit else conn.rollback()
    engine.dispose()
    return msg_id


def _psycopg(url: str, commit: bool) -> uuid.UUID:
    with psycopg.connect(url) as conn:
        msg_id = publish(conn, topic="orders", key="k", payload={"via": "psycopg"})
        conn.commit() if commit else conn.rollback()
    return msg_id


async def _sa_async_session(url: str, commit: bool) -> uuid.UUID:
    engine = create_async_engine(sqlalchemy_url(url), poolclass=NullPool)
    async with AsyncSession(engine) as session:
        msg_id = await publish_async(session, topic="orders", key="k", payload={"via": "as"})
        await (session.commit() if commit else session.rollback())
    await engine.dispose()
    return msg_id


async def _sa_async_connection(url: str, commit: bool) -> uuid.UUID:
    engine = create_async_engine(sqlalchemy_url(url), poolclass=NullPool)
    async with engine.connect() as conn:
        msg_id = await publish_async(conn, topic="orders", key="k", payload={"via": "ac"})
        await (conn.commit() if commit else conn.rollback())
    await engine.dispose()
    return msg_id


async def _psycopg_async(url: str, commit: bool) -> uuid.UUID:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        msg_id = await publish_async(conn, topic="orders", key="k", payload={"via": "pa"})
        await (conn.commit() if commit else conn.rollback())
    return msg_id


SYNC = [_sa_session, _sa_connection, _psycopg]
ASYNC = [_sa_async_session, _sa_async_connection, _psycopg_async]


@pytest.mark.parametrize("writer", SYNC, ids=lambda f: f.__name__)
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_publish_sync_commit_keeps_exactly_one_rollback_none(
    database_url: str, writer: Callable[[str, bool], uuid.UUID], commit: bool
) -> None:
    msg_id = writer(database_url, commit)
    found = rows(database_url)
    assert [r[0] for r in found] == ([msg_id] if commit else [])


@pytest.mark.parametrize("writer", ASYNC, ids=lambda f: f.__name__)
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_publish_async_commit_keeps_exactly_one_rollback_none(
    database_url: str, writer: Callable[[str, bool], Awaitable[uuid.UUID]], commit: bool
) -> None:
    msg_id = asyncio.run(writer(database_url, commit))  # type: ignore[arg-type]
    found = rows(database_url)
    assert [r[0] for r in found] == ([msg_id] if commit else [])


def test_publish_stores_envelope_and_assigns_seq(session: Session) -> None:
    first = publish(
        session,
        topic="orders",
        key="o-1",
        payload={"total": "12.50"},
        headers={"type": "OrderCreated"},
    )
    second = publish(
        session, topic="orders", key="o-1", payload=b"\x00\x01", content_type="application/x-custom"
    )
    other = publish(session, topic="orders", key="o-2", payload=["x"])
    got = session.execute(
        text(
            "SELECT id, key, seq, headers, payload, content_type, status, attempts "
            "FROM outbox_messages ORDER BY key, seq"
        )
    ).all()
    assert [(r.id, r.key, r.seq) for r in got] == [
        (first, "o-1", 1),
        (second, "o-1", 2),
        (other, "o-2", 1),
    ]
    assert got[0].headers == {"type": "OrderCreated"}
    assert bytes(got[0].payload) == b'{"total":"12.50"}'
    assert got[0].content_type == "application/json"
    assert (bytes(got[1].payload), got[1].content_type) == (b"\x00\x01", "application/x-custom")
    assert {(r.status, r.attempts) for r in got} == {("pending", 0)}
    assert first.version == 7


def test_publish_batch_writes_all_in_order_with_per_key_seq(
    pg_conn: psycopg.Connection[Any],
) -> None:
    messages = [Message("t", f"k{i % 3}", {"i": i}) for i in range(30)]
    ids = publish_batch(pg_conn, messages)
    got = pg_conn.execute(
        "SELECT id, key, seq, convert_from(payload, 'UTF8')::jsonb->>'i' FROM outbox_messages"
    ).fetchall()
    by_id = {r[0]: r for r in got}
    assert len(got) == 30
    assert set(ids) == set(by_id)
    for k in ("k0", "k1", "k2"):
        in_key = sorted((r for r in got if r[1] == k), key=lambda r: r[2])
        assert [r[2] for r in in_key] == list(range(1, 11))
        # batch order is kept within a key
        assert [int(r[3]) for r in in_key] == sorted(int(r[3]) for r in in_key)


def test_publish_batch_empty_writes_nothing(pg_conn: psycopg.Connection[Any]) -> None:
    assert publish_batch(pg_conn, []) == []
    assert pg_conn.execute("SELECT count(*) FROM outbox_messages").fetchone() == (0,)


def test_publish_batch_is_one_round_trip(pg_conn: psycopg.Connection[Any]) -> None:
    # A connection's first publish also learns the capture mode (docs/explanation/capture.md):
    # one more round trip, once per connection. Every publish after it is one statement.
    publish_batch(pg_conn, [Message("t", "first", 0)], wakeup=False)
    statements: list[bytes] = []
    real_execute = psycopg.Cursor.execute

    def spy(self: psycopg.Cursor[Any], query: Any, *args: Any, **kw: Any) -> Any:
        if self.connection is pg_conn:  # not the doorbell's own connection (another thread)
            statements.append(query)
        return real_execute(self, query, *args, **kw)

    psycopg.Cursor.execute = spy  # type: ignore[method-assign]
    try:
        publish_batch(pg_conn, [Message("t", str(i), i) for i in range(500)])
    finally:
        psycopg.Cursor.execute = real_execute  # type: ignore[method-assign]
    assert len(statements) == 1
    assert pg_conn.execute("SELECT count(*) FROM outbox_messages").fetchone() == (501,)


def test_idempotency_key_republish_is_noop_returning_same_id(session: Session) -> None:
    a = publish(
        session, topic="orders", key="o-1", payload={"n": 1}, idempotency_key="order-1-created"
    )
    b = publish(
        session, topic="orders", key="o-1", payload={"n": 2}, idempotency_key="order-1-created"
    )
    c = publish(session, topic="orders", key="o-1", payload={"n": 3})
    assert a == b == outbox.id_from_idempotency_key("orders", "order-1-created")
    got = session.execute(text("SELECT id, seq FROM outbox_messages ORDER BY seq")).all()
    assert [(r.id, r.seq) for r in got] == [(a, 1), (c, 2)]  # no hole left by the no-op


def test_idempotency_key_across_transactions_and_in_one_batch(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        first = publish_batch(
            conn,
            [
                Message("t", "k", 1, idempotency_key="x"),
                Message("t", "k", 2, idempotency_key="x"),
                Message("t", "k", 3, idempotency_key="y"),
            ],
        )
        conn.commit()
        again = publish(conn, topic="t", key="k", payload=9, idempotency_key="y")
        later = publish(conn, topic="t", key="k", payload=4)
        conn.commit()
    assert first[0] == first[1]
    assert again == first[2]
    assert [(r[0], r[3]) for r in rows(database_url)] == [(first[0], 1), (first[2], 2), (later, 3)]


def test_delayed_delivery_sets_available_at(pg_conn: psycopg.Connection[Any]) -> None:
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    publish(pg_conn, topic="t", key="a", payload=1, available_at=at)
    publish(pg_conn, topic="t", key="b", payload=1, deliver_after=dt.timedelta(hours=1))
    publish(pg_conn, topic="t", key="c", payload=1)
    got = dict(
        pg_conn.execute(
            "SELECT key, available_at - clock_timestamp() FROM outbox_messages"
        ).fetchall()
    )
    assert got["a"] > dt.timedelta(days=365)
    assert dt.timedelta(minutes=59) < got["b"] <= dt.timedelta(hours=1)
    assert got["c"] <= dt.timedelta(0)


def test_publish_in_custom_schema(empty_database_url: str) -> None:
    upgrade(empty_database_url, schema="messaging")
    with psycopg.connect(empty_database_url) as conn:
        msg_id = publish(conn, topic="t", key="k", payload={}, schema="messaging")
        conn.commit()
        assert conn.execute("SELECT id FROM messaging.outbox_messages").fetchone() == (msg_id,)


def test_publish_captures_traceparent_of_active_span(pg_conn: psycopg.Connection[Any]) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("place-order") as span:
        publish(pg_conn, topic="t", key="k", payload={})
        ctx = span.get_span_context()
    publish(pg_conn, topic="t", key="k2", payload={})
    got = dict(pg_conn.execute("SELECT key, traceparent FROM outbox_messages").fetchall())
    assert got["k"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    assert got["k2"] is None


def test_publish_batch_async_through_async_session(database_url: str) -> None:
    async def main() -> list[uuid.UUID]:
        engine = create_async_engine(sqlalchemy_url(database_url), poolclass=NullPool)
        async with AsyncSession(engine) as session, session.begin():
            ids = await publish_batch_async(session, [Message("t", "k", i) for i in range(5)])
        await engine.dispose()
        return ids

    ids = asyncio.run(main())
    assert [r[0] for r in rows(database_url)] == ids


def test_payload_beyond_the_fast_encoder_is_stored_exactly(
    pg_conn: psycopg.Connection[Any],
) -> None:
    # orjson (the fast path for plain data) declines ints beyond 64 bits; the standard encoder
    # takes them, and the stored JSON holds the exact value.
    payload = {"big": 2**70, "neg": -(2**65), "f": 1e16, "text": "é\u2028"}
    msg_id = publish(pg_conn, topic="t", key="k", payload=payload)
    row = pg_conn.execute("SELECT payload FROM outbox_messages WHERE id = %s", [msg_id]).fetchone()
    assert row is not None
    assert json.loads(bytes(row[0])) == payload
