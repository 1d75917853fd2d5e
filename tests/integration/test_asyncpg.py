"""publish_async and the inbox's async calls on SQLAlchemy's asyncpg driver, on a real PostgreSQL:
the same guarantees as on psycopg (one transaction, gapless seqs, idempotency, refusals)."""

from __future__ import annotations

import asyncio
import functools
import select
import time
import uuid
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import NullPool

pytest.importorskip("asyncpg")

from inbox import ConcurrentDeliveryError, OutOfOrderError, receive_async
from outbox import (
    Message,
    SchemaNotInstalledError,
    TransactionRequiredError,
    publish_async,
    publish_batch_async,
)
from outbox._statements import WAKEUP_CHANNEL
from tests.support.ledger import record


def _in_loop(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test in a fresh event loop (the suite has no async plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def asyncpg_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An engine on asyncpg for the libpq-style ``url`` the fixtures give."""
    sa_url = make_url(url).set(drivername="postgresql+asyncpg")
    return create_async_engine(sa_url, poolclass=NullPool, **kwargs)


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()  # type: ignore[arg-type]


def messages(url: str) -> list[tuple[Any, ...]]:
    record(url)  # numbered by the relay's ledger reader
    return query(url, "SELECT id, topic, key, seq FROM outbox_messages ORDER BY topic, key, seq")


def _business_table(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
        conn.execute("CREATE TABLE effects (consumer text, message_id uuid)")


def ref(seq: int | None = None, key: str = "k") -> Any:
    return SimpleNamespace(id=uuid.uuid4(), topic="orders", key=key, seq=seq)


@pytest.mark.parametrize("commit", [True, False])
@_in_loop
async def test_business_row_and_message_commit_or_roll_back_together(
    database_url: str, commit: bool
) -> None:
    _business_table(database_url)
    engine = asyncpg_engine(database_url)
    async with AsyncSession(engine) as session:
        await session.execute(text("INSERT INTO orders VALUES ('o-1')"))
        msg_id = await publish_async(session, topic="orders", key="o-1", payload={"n": 1})
        await (session.commit() if commit else session.rollback())
    async with engine.connect() as conn:  # AsyncConnection, which begins on its own
        other = await publish_async(conn, topic="orders", key="o-2", payload=b"raw")
        await (conn.commit() if commit else conn.rollback())
    await engine.dispose()
    expected = [(msg_id, "orders", "o-1", 1), (other, "orders", "o-2", 1)] if commit else []
    assert messages(database_url) == expected
    assert query(database_url, "SELECT id FROM orders") == ([("o-1",)] if commit else [])


@_in_loop
async def test_seq_is_gapless_per_key_across_transactions(database_url: str) -> None:
    engine = asyncpg_engine(database_url)
    for n in range(6):
        async with AsyncSession(engine) as session, session.begin():
            await publish_async(session, topic="t", key="a", payload=n)
            await publish_async(session, topic="t", key="b", payload=n)
            if n == 2:
                await session.rollback()  # a rolled-back writer takes no number

    # Concurrent writers of one key, each in its own transaction: seqs stay gapless.
    async def writer(n: int) -> None:
        async with AsyncSession(engine) as session, session.begin():
            await publish_async(session, topic="t", key="a", payload=n)

    await asyncio.gather(*(writer(n) for n in range(8)))
    await engine.dispose()
    seqs: dict[str, list[int]] = {}
    for _, _, key, seq in messages(database_url):
        seqs.setdefault(key, []).append(seq)
    assert seqs == {"a": list(range(1, 14)), "b": list(range(1, 6))}


@_in_loop
async def test_idempotency_key_republish_returns_the_same_id_and_writes_once(
    database_url: str,
) -> None:
    engine = asyncpg_engine(database_url)
    ids = []
    for _ in range(2):  # twice in one transaction, in two transactions
        async with AsyncSession(engine) as session, session.begin():
            for _ in range(2):
                ids.append(
                    await publish_async(session, topic="t", key="k", payload=1, idempotency_key="x")
                )
    async with engine.begin() as conn:  # a batch repeating the key, with a new message
        batch = await publish_batch_async(
            conn, [Message("t", "k", 1, idempotency_key="x"), Message("t", "k", 2)]
        )
    await engine.dispose()
    assert len(set(ids)) == 1
    assert batch[0] == ids[0]
    assert [(i, s) for i, _, _, s in messages(database_url)] == [(ids[0], 1), (batch[1], 2)]


@_in_loop
async def test_publish_batch_async_writes_all_in_order(database_url: str) -> None:
    engine = asyncpg_engine(database_url)
    async with AsyncSession(engine) as session, session.begin():
        ids = await publish_batch_async(
            session,
            [Message("t", f"k{i % 2}", {"i": i}, headers={"h": str(i)}) for i in range(5)],
        )
    await engine.dispose()
    assert record(database_url) == 5  # numbered by the relay's ledger reader
    stored = query(
        database_url, "SELECT id, key, seq, headers, payload FROM outbox_messages ORDER BY seq, key"
    )
    assert sorted(stored, key=lambda r: ids.index(r[0])) == [
        (ids[i], f"k{i % 2}", i // 2 + 1, {"h": str(i)}, f'{{"i":{i}}}'.encode()) for i in range(5)
    ]


@_in_loop
async def test_autocommit_outside_a_transaction_is_refused(database_url: str) -> None:
    engine = asyncpg_engine(database_url, isolation_level="AUTOCOMMIT")
    async with engine.connect() as conn:
        with pytest.raises(TransactionRequiredError, match=r"isolation_level=.AUTOCOMMIT."):
            await publish_async(conn, topic="t", key="k", payload=1)
        with pytest.raises(TransactionRequiredError):
            await receive_async(conn, consumer="c", message=ref())
    await engine.dispose()
    assert messages(database_url) == []


@_in_loop
async def test_unmigrated_database_says_to_migrate(empty_database_url: str) -> None:
    engine = asyncpg_engine(empty_database_url)
    async with AsyncSession(engine) as session, session.begin():
        with pytest.raises(SchemaNotInstalledError, match="outbox migrate upgrade"):
            await publish_async(session, topic="t", key="k", payload=1, wakeup=True)
    async with AsyncSession(engine) as session, session.begin():
        with pytest.raises(SchemaNotInstalledError):
            await receive_async(session, consumer="c", message=ref())
    await engine.dispose()


@_in_loop
async def test_commit_wakes_the_relay(database_url: str) -> None:
    """The doorbell rings after an asyncpg commit: through the AsyncSession's after_commit hook,
    and for an AsyncConnection by watching its transaction id."""
    engine = asyncpg_engine(database_url)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {WAKEUP_CHANNEL}")

        def woken() -> bool:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                select.select([listener.fileno()], [], [], 0.1)
                if list(listener.notifies(timeout=0.05, stop_after=1)):
                    return True
            return False

        async with AsyncSession(engine) as session, session.begin():
            await publish_async(session, topic="t", key="k", payload=1, wakeup=True)
        assert await asyncio.to_thread(woken)
        async with engine.begin() as conn:
            await publish_async(conn, topic="t", key="k", payload=2, wakeup=True)
        assert await asyncio.to_thread(woken)
    await engine.dispose()


# --- the inbox -------------------------------------------------------------------------------


async def deliver(engine: AsyncEngine, msg: Any, *, ordered: bool = False) -> bool:
    async with AsyncSession(engine) as session, session.begin():
        fresh = await receive_async(session, consumer="c", message=msg, ordered=ordered)
        if fresh:
            await session.execute(text("INSERT INTO effects VALUES ('c', :id)"), {"id": msg.id})
    return fresh


@_in_loop
async def test_receive_first_delivery_then_duplicate(database_url: str) -> None:
    _business_table(database_url)
    engine = asyncpg_engine(database_url)
    msg = ref(seq=1)
    assert await deliver(engine, msg) is True
    assert await deliver(engine, msg) is False
    await engine.dispose()
    assert query(database_url, "SELECT message_id FROM effects") == [(msg.id,)]
    assert query(database_url, "SELECT status, duplicates FROM inbox_messages") == [
        ("processed", 1)
    ]


@_in_loop
async def test_receive_ordered_refuses_out_of_order(database_url: str) -> None:
    _business_table(database_url)
    engine = asyncpg_engine(database_url)
    with pytest.raises(OutOfOrderError):
        await deliver(engine, ref(seq=2), ordered=True)
    assert await deliver(engine, ref(seq=1), ordered=True) is True
    assert await deliver(engine, ref(seq=2), ordered=True) is True
    await engine.dispose()
    assert query(database_url, "SELECT last_seq FROM inbox_key_positions") == [(2,)]


@_in_loop
async def test_concurrent_deliveries_of_one_message_apply_one_effect(database_url: str) -> None:
    """Two asyncpg sessions deliver the same message: the second waits for the first's row
    lock, then sees the committed record and applies nothing."""
    _business_table(database_url)
    engine = asyncpg_engine(database_url)
    msg = ref()
    async with AsyncSession(engine) as first, first.begin():
        assert await receive_async(first, consumer="c", message=msg)
        await first.execute(text("INSERT INTO effects VALUES ('c', :id)"), {"id": msg.id})
        second = asyncio.create_task(deliver(engine, msg))
        deadline = time.monotonic() + 10
        while not query(
            database_url,
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'",
        ):
            assert time.monotonic() < deadline, "the second delivery never waited"
            await asyncio.sleep(0.02)
        assert not second.done()
    assert await asyncio.wait_for(second, 10) is False
    await engine.dispose()
    assert query(database_url, "SELECT count(*) FROM effects") == [(1,)]


@_in_loop
async def test_snapshot_conflict_is_a_retryable_concurrent_delivery(database_url: str) -> None:
    """Under REPEATABLE READ the loser gets ConcurrentDeliveryError (asyncpg's serialization
    failure, translated like psycopg's); its retry is a duplicate."""
    _business_table(database_url)
    engine = asyncpg_engine(database_url)
    rr = engine.execution_options(isolation_level="REPEATABLE READ")
    msg = ref()
    async with AsyncSession(rr) as second:
        await second.execute(text("SELECT 1"))  # the snapshot predates the first's commit
        assert await deliver(engine, msg) is True
        with pytest.raises(ConcurrentDeliveryError):
            await receive_async(second, consumer="c", message=msg)
        await second.rollback()
    async with AsyncSession(rr) as retry, retry.begin():
        assert await receive_async(retry, consumer="c", message=msg) is False
    await engine.dispose()


def test_placeholders_become_positional_once_per_name() -> None:
    from outbox._asyncpg import adapt, positional

    text_, names = positional(b"SELECT %(a)s::jsonb, '100%%', %(b)s::int4[], %(a)s::jsonb")
    assert text_ == "SELECT $1::jsonb, '100%', $2::int4[], $1::jsonb"
    assert names == ("a", "b")
    from psycopg.types.json import Jsonb

    assert adapt(names, {"a": Jsonb({"x": "é"}), "b": [1, 2]}) == ['{"x":"é"}', [1, 2]]
