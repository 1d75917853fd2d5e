"""publish / publish_async through every supported connection type, on a real PostgreSQL; the
scenarios run on both flavours (the ``flavour`` fixture)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import outbox
from outbox import Message, publish, publish_async, publish_batch_async
from outbox._migrate import sqlalchemy_url, upgrade
from outbox._statements import producer_statements
from tests.support.flavours import FLAVOURS, Flavour, flavour_of
from tests.support.ledger import record


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    """The sync and the async flavour of publish and publish_batch, in turn."""
    with flavour_of(request.param) as chosen:
        yield chosen


def rows(url: str, where: str = "true") -> list[tuple[Any, ...]]:
    record(url)  # numbered by the relay's ledger reader
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


def test_publish_stores_envelope_and_assigns_seq(flavour: Flavour, database_url: str) -> None:
    conn = flavour.connect(database_url)
    first = flavour.publish(
        conn,
        topic="orders",
        key="o-1",
        payload={"total": "12.50"},
        headers={"type": "OrderCreated"},
    )
    second = flavour.publish(
        conn, topic="orders", key="o-1", payload=b"\x00\x01", content_type="application/x-custom"
    )
    other = flavour.publish(conn, topic="orders", key="o-2", payload=["x"])
    conn.commit()
    record(database_url)  # numbered by the relay's ledger reader
    got = conn.execute(
        "SELECT id, key, seq, headers, payload, content_type, status, attempts "
        "FROM outbox_messages ORDER BY key, seq"
    )
    assert [(r[0], r[1], r[2]) for r in got] == [
        (first, "o-1", 1),
        (second, "o-1", 2),
        (other, "o-2", 1),
    ]
    _, _, _, headers, payload, content_type, *_ = got[0]
    assert headers == {"type": "OrderCreated"}
    assert bytes(payload) == b'{"total":"12.50"}'
    assert content_type == "application/json"
    _, _, _, _, payload, content_type, *_ = got[1]
    assert (bytes(payload), content_type) == (b"\x00\x01", "application/x-custom")
    assert {tuple(r[-2:]) for r in got} == {("pending", 0)}
    assert first.version == 7


def test_publish_batch_writes_all_in_order_with_per_key_seq(
    flavour: Flavour, database_url: str
) -> None:
    conn = flavour.connect(database_url)
    messages = [Message("t", f"k{i % 3}", {"i": i}) for i in range(30)]
    ids = flavour.publish_batch(conn, messages)
    conn.commit()
    record(database_url)
    got = conn.execute(
        "SELECT id, key, seq, convert_from(payload, 'UTF8')::jsonb->>'i' FROM outbox_messages"
    )
    by_id = {r[0]: r for r in got}
    assert len(got) == 30
    assert set(ids) == set(by_id)
    for k in ("k0", "k1", "k2"):
        in_key = sorted((r for r in got if r[1] == k), key=lambda r: r[2])
        assert [r[2] for r in in_key] == list(range(1, 11))
        # batch order is kept within a key
        assert [int(r[3]) for r in in_key] == sorted(int(r[3]) for r in in_key)


def test_publish_batch_empty_writes_nothing(flavour: Flavour, database_url: str) -> None:
    conn = flavour.connect(database_url)
    assert flavour.publish_batch(conn, []) == []
    assert conn.execute("SELECT count(*) FROM outbox_wal_pending") == [(0,)]
    assert conn.execute("SELECT count(*) FROM outbox_messages") == [(0,)]


def test_publish_batch_is_one_round_trip(flavour: Flavour, database_url: str) -> None:
    # Every publish is one statement, the ledger insert, from a connection's first on: there is
    # no counter row to lock and no capture mode to learn (docs/explanation/capture.md).
    conn = flavour.connect(database_url)
    stmts = producer_statements(None)
    statements: list[bytes] = []
    cursor: Any = psycopg.AsyncCursor if flavour.is_async else psycopg.Cursor
    real_execute = cursor.execute

    def spy(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        if self.connection is conn.raw:  # not the doorbell's own connection (another thread)
            statements.append(query)
        return real_execute(self, query, *args, **kw)

    cursor.execute = spy
    try:
        flavour.publish_batch(conn, [Message("t", "first", 0)], wakeup=False)
        assert statements == [stmts.ledger_insert_one]
        statements.clear()
        flavour.publish_batch(conn, [Message("t", str(i), i) for i in range(500)])
        assert statements == [stmts.ledger_insert]
    finally:
        cursor.execute = real_execute
    conn.commit()
    assert record(database_url) == 501
    assert conn.execute("SELECT count(*) FROM outbox_messages") == [(501,)]


def test_idempotency_key_republish_is_noop_returning_same_id(
    flavour: Flavour, database_url: str
) -> None:
    conn = flavour.connect(database_url)
    key = "order-1-created"
    a = flavour.publish(conn, topic="orders", key="o-1", payload={"n": 1}, idempotency_key=key)
    b = flavour.publish(conn, topic="orders", key="o-1", payload={"n": 2}, idempotency_key=key)
    c = flavour.publish(conn, topic="orders", key="o-1", payload={"n": 3})
    assert a == b == outbox.id_from_idempotency_key("orders", "order-1-created")
    assert conn.execute("SELECT count(*) FROM outbox_wal_pending") == [(2,)]  # one row for a, b
    conn.commit()
    record(database_url)
    got = conn.execute("SELECT id, seq FROM outbox_messages ORDER BY seq")
    assert got == [(a, 1), (c, 2)]  # no hole left by the no-op


def test_idempotency_key_across_transactions_and_in_one_batch(
    flavour: Flavour, database_url: str
) -> None:
    conn = flavour.connect(database_url)
    first = flavour.publish_batch(
        conn,
        [
            Message("t", "k", 1, idempotency_key="x"),
            Message("t", "k", 2, idempotency_key="x"),
            Message("t", "k", 3, idempotency_key="y"),
        ],
    )
    conn.commit()
    again = flavour.publish(conn, topic="t", key="k", payload=9, idempotency_key="y")
    later = flavour.publish(conn, topic="t", key="k", payload=4)
    conn.commit()
    assert first[0] == first[1]
    assert again == first[2]
    assert [(r[0], r[3]) for r in rows(database_url)] == [(first[0], 1), (first[2], 2), (later, 3)]


def test_delayed_delivery_sets_available_at(flavour: Flavour, database_url: str) -> None:
    conn = flavour.connect(database_url)
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    flavour.publish(conn, topic="t", key="a", payload=1, available_at=at)
    flavour.publish(conn, topic="t", key="b", payload=1, deliver_after=dt.timedelta(hours=1))
    flavour.publish(conn, topic="t", key="c", payload=1)
    conn.commit()
    record(database_url)
    got = dict(conn.execute("SELECT key, available_at - clock_timestamp() FROM outbox_messages"))
    assert got["a"] > dt.timedelta(days=365)
    assert dt.timedelta(minutes=59) < got["b"] <= dt.timedelta(hours=1)
    assert got["c"] <= dt.timedelta(0)


def test_publish_in_custom_schema(flavour: Flavour, empty_database_url: str) -> None:
    upgrade(empty_database_url, schema="messaging")
    conn = flavour.connect(empty_database_url)
    msg_id = flavour.publish(conn, topic="t", key="k", payload={}, schema="messaging")
    conn.commit()
    record(empty_database_url, schema="messaging")
    assert conn.execute("SELECT id FROM messaging.outbox_messages") == [(msg_id,)]


def test_publish_captures_traceparent_of_active_span(flavour: Flavour, database_url: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    conn = flavour.connect(database_url)
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("place-order") as span:
        flavour.publish(conn, topic="t", key="k", payload={})
        ctx = span.get_span_context()
    flavour.publish(conn, topic="t", key="k2", payload={})
    conn.commit()
    record(database_url)
    got = dict(conn.execute("SELECT key, traceparent FROM outbox_messages"))
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
    flavour: Flavour, database_url: str
) -> None:
    conn = flavour.connect(database_url)
    # orjson (the fast path for plain data) declines ints beyond 64 bits; the standard encoder
    # takes them, and the stored JSON holds the exact value.
    payload = {"big": 2**70, "neg": -(2**65), "f": 1e16, "text": "é\u2028"}
    msg_id = flavour.publish(conn, topic="t", key="k", payload=payload)
    conn.commit()
    record(database_url)
    [(stored,)] = conn.execute("SELECT payload FROM outbox_messages WHERE id = %s", [msg_id])
    assert json.loads(bytes(stored)) == payload
