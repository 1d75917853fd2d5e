"""receive / receive_async on a real PostgreSQL: every connection type, duplicates, concurrency."""

from __future__ import annotations

import asyncio
import threading
import types
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from inbox import ConcurrentDeliveryError, Verdict, receive, receive_async
from outbox import InvalidMessageError, TransactionRequiredError
from outbox._migrate import sqlalchemy_url
from tests.inbox.inbox_helpers import apply_effect, effects, inbox_rows, make_envelope
from tests.support.flavours import Flavour


def _deliver_psycopg(url: str, consumer: str, msg: Any) -> bool:
    with psycopg.connect(url) as conn:
        fresh = receive(conn, consumer=consumer, message=msg)
        if fresh:
            apply_effect(conn, consumer, msg)
        conn.execute("SELECT 1")  # the transaction is still usable after a duplicate
    return fresh


def _deliver_session(url: str, consumer: str, msg: Any) -> bool:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    with Session(engine) as session, session.begin():
        fresh = receive(session, consumer=consumer, message=msg)
        if fresh:
            apply_effect(session, consumer, msg)
        session.execute(text("SELECT 1"))
    engine.dispose()
    return fresh


def _deliver_connection(url: str, consumer: str, msg: Any) -> bool:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    with engine.begin() as conn:
        fresh = receive(conn, consumer=consumer, message=msg)
        if fresh:
            apply_effect(conn, consumer, msg)
    engine.dispose()
    return fresh


def _deliver_async_session(url: str, consumer: str, msg: Any) -> bool:
    async def go() -> bool:
        engine = create_async_engine(sqlalchemy_url(url), poolclass=NullPool)
        async with AsyncSession(engine) as session, session.begin():
            fresh = await receive_async(session, consumer=consumer, message=msg)
            if fresh:
                await session.execute(
                    text("INSERT INTO effects (consumer, message_id, key) VALUES (:c, :m, :k)"),
                    {"c": consumer, "m": msg.id, "k": msg.key},
                )
        await engine.dispose()
        return fresh

    return asyncio.run(go())


def _deliver_async_psycopg(url: str, consumer: str, msg: Any) -> bool:
    async def go() -> bool:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            fresh = await receive_async(conn, consumer=consumer, message=msg)
            if fresh:
                await conn.execute(
                    "INSERT INTO effects (consumer, message_id, key) VALUES (%s, %s, %s)",
                    (consumer, msg.id, msg.key),
                )
        return fresh

    return asyncio.run(go())


DELIVERERS: dict[str, Callable[[str, str, Any], bool]] = {
    "psycopg": _deliver_psycopg,
    "sa_session": _deliver_session,
    "sa_connection": _deliver_connection,
    "async_session": _deliver_async_session,
    "async_psycopg": _deliver_async_psycopg,
}


@pytest.mark.parametrize("via", DELIVERERS)
def test_receive_once_per_consumer(effects_url: str, via: str) -> None:
    deliver = DELIVERERS[via]
    msg = make_envelope()
    assert deliver(effects_url, "billing", msg) is True
    assert deliver(effects_url, "billing", msg) is False
    assert deliver(effects_url, "shipping", msg) is True  # another consumer: its own record
    assert sorted(c for c, *_ in effects(effects_url)) == ["billing", "shipping"]
    status, attempts, _, seq = inbox_rows(effects_url, "billing")[msg.id]
    assert (status, attempts, seq) == ("processed", 2, 1)  # the duplicate delivery is counted


def test_receive_rolled_back_leaves_no_record(flavour: Flavour, effects_url: str) -> None:
    msg = make_envelope()
    conn = flavour.connect(effects_url)
    assert flavour.receive(conn, consumer="c", message=msg)
    conn.rollback()
    assert flavour.receive(conn, consumer="c", message=msg)  # the rollback took it back
    conn.commit()
    assert list(inbox_rows(effects_url, "c")) == [msg.id]


def test_receive_accepts_minimal_object_and_refuses_bad_input(
    flavour: Flavour, effects_url: str
) -> None:
    conn = flavour.connect(effects_url)

    def receive(**options: Any) -> bool:
        return flavour.receive(conn, **options)

    minimal = types.SimpleNamespace(id=str(uuid.uuid4()), topic="t", key="k", seq=None)
    assert receive(consumer="c", message=minimal) is True
    with pytest.raises(InvalidMessageError, match="has no id"):
        receive(consumer="c", message=types.SimpleNamespace(topic="t", key="k"))
    with pytest.raises(InvalidMessageError, match="not a UUID"):
        receive(consumer="c", message=make_envelope(id="nope"))
    with pytest.raises(InvalidMessageError, match="ordered=True"):
        receive(consumer="c", message=minimal, ordered=True)
    with pytest.raises(InvalidMessageError, match="consumer"):
        receive(consumer="", message=minimal)
    with pytest.raises(InvalidMessageError, match="consumer must not be empty or blank"):
        receive(consumer="   ", message=minimal)
    with pytest.raises(InvalidMessageError, match="message key must not contain NUL"):
        receive(consumer="c", message=make_envelope(key="a\x00b"))
    with pytest.raises(InvalidMessageError, match="message key is 1500 bytes"):
        receive(consumer="c", message=make_envelope(key="k" * 1500), ordered=True)
    with pytest.raises(InvalidMessageError, match="below 2\\*\\*63"):
        receive(consumer="c", message=make_envelope(seq=2**63), ordered=True)
    # Refused before any statement: the caller's transaction is still usable, and the only
    # row is the minimal message's (no CHECK constraint stands behind these checks)
    assert conn.raw.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    rows = conn.execute("SELECT consumer, message_id FROM inbox_messages")
    assert rows == [("c", uuid.UUID(minimal.id))]


def test_receive_refuses_autocommit(flavour: Flavour, database_url: str) -> None:
    conn = flavour.connect(database_url, autocommit=True)
    with pytest.raises(TransactionRequiredError, match="autocommit"):
        flavour.receive(conn, consumer="c", message=make_envelope())


def _wait_until_blocked(url: str, deadline: float = 10.0) -> None:
    """Poll until some backend of this database waits on a lock (the second delivery)."""
    import time

    end = time.monotonic() + deadline
    with psycopg.connect(url, autocommit=True) as mon:
        while time.monotonic() < end:
            row = mon.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()
            if row and row[0] > 0:
                return
            time.sleep(0.01)
    raise AssertionError("the second delivery never waited for the first")


@pytest.mark.parametrize("first_commits", [True, False])
def test_concurrent_delivery_second_waits_for_first(effects_url: str, first_commits: bool) -> None:
    """Under READ COMMITTED the second delivery waits; a duplicate iff the first committed."""
    msg = make_envelope()
    first = psycopg.connect(effects_url)
    try:
        assert receive(first, consumer="c", message=msg)
        apply_effect(first, "c", msg)
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(_deliver_psycopg, effects_url, "c", msg)
            _wait_until_blocked(effects_url)
            assert not second.done()
            first.commit() if first_commits else first.rollback()
            assert second.result(timeout=10) is (not first_commits)
    finally:
        first.close()
    assert len(effects(effects_url, "c")) == 1


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_concurrent_delivery_under_snapshot_isolation_is_retryable(
    effects_url: str, isolation: str
) -> None:
    """Under RR/SERIALIZABLE the loser gets ConcurrentDeliveryError; its retry is a duplicate."""
    msg = make_envelope()
    with psycopg.connect(effects_url) as second, psycopg.connect(effects_url) as first:
        second.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        second.execute("SELECT 1")  # the snapshot is taken before the first commits
        assert receive(first, consumer="c", message=msg)
        first.commit()
        with pytest.raises(ConcurrentDeliveryError, match="Roll back") as info:
            receive(second, consumer="c", message=msg)
        assert info.value.retryable
        assert info.value.sqlstate == "40001"
        second.rollback()
        second.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        assert receive(second, consumer="c", message=msg) is False  # the retry: a duplicate
        second.commit()


def test_duplicate_storm_threads_one_effect(effects_url: str) -> None:
    """Eight threads deliver each of 30 messages 1-5 times, interleaved: one effect each."""
    import random

    rng = random.Random(7)
    messages = [make_envelope(key=f"k{i % 4}", seq=None) for i in range(30)]
    deliveries = [m for m in messages for _ in range(rng.randint(1, 5))]
    rng.shuffle(deliveries)
    barrier = threading.Barrier(8)

    def worker(chunk: list[Any]) -> int:
        barrier.wait()
        return sum(_deliver_psycopg(effects_url, "c", m) for m in chunk)

    with ThreadPoolExecutor(8) as pool:
        fresh = sum(pool.map(worker, [deliveries[i::8] for i in range(8)]))
    assert fresh == 30
    applied = [row[1] for row in effects(effects_url, "c")]
    assert sorted(applied) == sorted(m.id for m in messages)


def test_record_reports_verdicts(flavour: Flavour, effects_url: str) -> None:
    conn = flavour.connect(effects_url)
    msg = make_envelope()
    assert flavour.record(conn, consumer="c", message=msg) is Verdict.PROCESS
    assert flavour.record(conn, consumer="c", message=msg) is Verdict.DUPLICATE
    ordered = make_envelope(seq=2)
    assert flavour.record(conn, consumer="c", message=ordered, ordered=True) is (
        Verdict.OUT_OF_ORDER
    )


def test_lock_timeout_while_another_delivery_holds_the_message_is_retryable(
    flavour: Flavour, effects_url: str
) -> None:
    """55P03: a consumer with a lock_timeout meets a delivery of the same message in progress."""
    msg = make_envelope()
    first, second = flavour.connect(effects_url), flavour.connect(effects_url)
    assert flavour.receive(first, consumer="c", message=msg)  # holds the record until it ends
    second.execute("SET lock_timeout = '50ms'")
    with pytest.raises(ConcurrentDeliveryError, match="Roll back") as info:
        flavour.receive(second, consumer="c", message=msg)
    assert (info.value.retryable, info.value.sqlstate) == (True, "55P03")
    second.rollback()
    first.commit()
    assert flavour.receive(second, consumer="c", message=msg) is False  # the retry: a duplicate


def test_a_deadlock_is_a_concurrent_delivery_too() -> None:
    from inbox._receive import translate
    from inbox._statements import inbox_statements

    err = translate(psycopg.errors.DeadlockDetected("deadlock detected"), inbox_statements(None))
    assert isinstance(err, ConcurrentDeliveryError)
    assert err.retryable


def _statements_sent(conn: Any, tmp_path: Any, call: Callable[[], Any]) -> int:
    """How many statements ``call`` sends on ``conn`` (libpq's protocol trace), BEGIN aside."""
    trace = tmp_path / "trace.txt"
    with trace.open("w") as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(
            psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        )
        try:
            call()
        finally:
            conn.pgconn.untrace()
    sent = [line.split("\t") for line in trace.read_text().splitlines()]
    return sum(
        1
        for line in sent
        if line[0] == "F" and line[2] in ("Execute", "Query") and '"BEGIN"' not in line[3]
    )


def test_first_delivery_is_one_statement_a_duplicate_two(
    flavour: Flavour, effects_url: str, tmp_path: Any
) -> None:
    """The common case (a new message, unordered) is the insert alone: one round trip."""
    msg = make_envelope()
    conn = flavour.connect(effects_url)
    conn.execute("SELECT 1")  # in the transaction already: BEGIN is not counted anyway

    def deliver() -> None:
        flavour.receive(conn, consumer="c", message=msg)

    assert _statements_sent(conn.raw, tmp_path, deliver) == 1
    assert _statements_sent(conn.raw, tmp_path, deliver) == 2  # the insert, then the count
    rows = conn.execute(
        "SELECT status, attempts, duplicates FROM inbox_messages "
        "WHERE consumer = 'c' AND message_id = %s",
        (msg.id,),
    )
    assert rows == [("processed", 2, 1)]
