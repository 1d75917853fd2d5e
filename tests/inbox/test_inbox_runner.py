"""HandlerRunner / AsyncHandlerRunner, poison messages and retention, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from inbox import AsyncHandlerRunner, HandlerRunner, Outcome
from inbox.admin import purge_finished
from inbox.cli import commands
from outbox import ConfigurationError
from outbox._migrate import sqlalchemy_url
from tests.inbox.inbox_helpers import Flaky, apply_effect, effects, inbox_rows, make_envelope


def test_runner_outcomes_and_attempts(pool: ConnectionPool, effects_url: str) -> None:
    handler = Flaky(failures=2)
    runner = HandlerRunner(pool, handler, consumer="c", max_attempts=5)
    msg = make_envelope()
    first = runner.handle(msg)
    assert (first.outcome, first.attempts, str(first.error)) == (Outcome.FAILED, 1, "boom 1")
    assert not first.outcome.ack
    assert runner.handle(msg).outcome is Outcome.FAILED
    assert runner.handle(msg).outcome is Outcome.PROCESSED
    assert runner.handle(msg).outcome is Outcome.DUPLICATE
    assert len(effects(effects_url, "c")) == 1  # failed attempts left no effect
    status, attempts, last_error, _ = inbox_rows(effects_url, "c")[msg.id]
    assert (status, attempts, last_error) == ("processed", 4, "ValueError: boom 2")


def test_runner_poison_message_is_dead_and_acked(pool: ConnectionPool, effects_url: str) -> None:
    runner = HandlerRunner(pool, Flaky(failures=99), consumer="c", max_attempts=3)
    msg = make_envelope()
    outcomes = [runner.handle(msg).outcome for _ in range(3)]
    assert outcomes == [Outcome.FAILED, Outcome.FAILED, Outcome.DEAD]
    assert Outcome.DEAD.ack
    assert runner.handle(msg).outcome is Outcome.DUPLICATE  # a later redelivery: no retry
    status, attempts, last_error, _ = inbox_rows(effects_url, "c")[msg.id]
    assert (status, attempts, last_error) == ("dead", 4, "ValueError: boom 3")  # 4 deliveries
    assert effects(effects_url, "c") == []


def test_runner_ordered_dead_message_moves_the_key_on(
    pool: ConnectionPool, effects_url: str
) -> None:
    poison = make_envelope(seq=1, payload=b"poison")

    def handler(conn: Any, msg: Any) -> None:
        if msg.payload == b"poison":
            raise ValueError("cannot parse")
        apply_effect(conn, "c", msg)

    runner = HandlerRunner(pool, handler, consumer="c", ordered=True, max_attempts=1)
    second = make_envelope(seq=2)
    assert runner.handle(second).outcome is Outcome.OUT_OF_ORDER
    assert runner.handle(poison).outcome is Outcome.DEAD
    assert runner.handle(second).outcome is Outcome.PROCESSED
    assert runner.handle(make_envelope(seq=1)).outcome is Outcome.STALE
    assert [row[3] for row in effects(effects_url, "c")] == [2]


@pytest.mark.parametrize("dead_seq", [1, 2, 3])
def test_runner_ordered_dead_message_at_any_seq_moves_the_key_on(
    pool: ConnectionPool, effects_url: str, dead_seq: int
) -> None:
    """A dead message at seq N > 1 once left the key stuck: its successor was OUT_OF_ORDER on
    every redelivery, forever (the skip statement had no input row unless seq = 1)."""

    def handler(conn: Any, msg: Any) -> None:
        if msg.payload == b"poison":
            raise ValueError("cannot parse")
        apply_effect(conn, "c", msg)

    runner = HandlerRunner(pool, handler, consumer="c", ordered=True, max_attempts=3)
    msgs = [
        make_envelope(key="B", seq=s, payload=b"poison" if s == dead_seq else b"ok")
        for s in range(1, 5)
    ]
    for msg in msgs[: dead_seq - 1]:
        assert runner.handle(msg).outcome is Outcome.PROCESSED
    poison = msgs[dead_seq - 1]
    outcomes = [runner.handle(poison).outcome for _ in range(3)]
    assert outcomes == [Outcome.FAILED, Outcome.FAILED, Outcome.DEAD]
    for msg in msgs[dead_seq:]:
        assert runner.handle(msg).outcome is Outcome.PROCESSED
    assert runner.handle(poison).outcome is Outcome.DUPLICATE  # redelivered after: no retry
    expected = [s for s in range(1, 5) if s != dead_seq]
    assert [row[3] for row in effects(effects_url, "c")] == expected


def test_async_runner_ordered_dead_message_after_seq_1_moves_the_key_on(effects_url: str) -> None:
    async def handler(conn: Any, msg: Any) -> None:
        if msg.payload == b"poison":
            raise ValueError("cannot parse")
        await conn.execute(
            "INSERT INTO effects (consumer, message_id, key, seq) VALUES ('c', %s, %s, %s)",
            (msg.id, msg.key, msg.seq),
        )

    async def main() -> list[Outcome]:
        async with AsyncConnectionPool(effects_url, min_size=1, max_size=2) as apool:
            runner = AsyncHandlerRunner(apool, handler, consumer="c", ordered=True, max_attempts=2)
            msgs = [make_envelope(key="B", seq=1), make_envelope(key="B", seq=2, payload=b"poison")]
            msgs.append(make_envelope(key="B", seq=3))
            return [(await runner.handle(m)).outcome for m in (msgs[0], msgs[1], msgs[1], msgs[2])]

    outcomes = asyncio.run(main())
    assert outcomes == [Outcome.PROCESSED, Outcome.FAILED, Outcome.DEAD, Outcome.PROCESSED]
    assert [row[3] for row in effects(effects_url, "c")] == [1, 3]


def test_runner_concurrency_conflict_is_not_counted(pool: ConnectionPool, effects_url: str) -> None:
    def handler(conn: Any, msg: Any) -> None:
        raise psycopg.errors.SerializationFailure("could not serialize access")

    runner = HandlerRunner(pool, handler, consumer="c", max_attempts=1)
    result = runner.handle(make_envelope())
    assert (result.outcome, result.attempts) == (Outcome.FAILED, None)
    assert inbox_rows(effects_url, "c") == {}  # not dead: a conflict is not the message's fault


def test_runner_counts_a_database_error_that_repeats_on_every_delivery(
    pool: ConnectionPool, effects_url: str
) -> None:
    # A statement timeout is an OperationalError, but not a lost connection: it fails the same
    # way every time, so it counts towards max_attempts and the ordered key moves on.
    def handler(conn: Any, msg: Any) -> None:
        if msg.seq == 1:  # a query too slow for the consumer's timeout, on every delivery
            conn.execute("SET LOCAL statement_timeout = '20ms'")
            conn.execute("SELECT pg_sleep(1)")
        apply_effect(conn, "c", msg)

    runner = HandlerRunner(pool, handler, consumer="c", ordered=True, max_attempts=2)
    msg = make_envelope(seq=1)
    results = [runner.handle(msg) for _ in range(2)]
    assert [r.outcome for r in results] == [Outcome.FAILED, Outcome.DEAD]
    assert isinstance(results[1].error, psycopg.errors.QueryCanceled)
    assert runner.handle(make_envelope(seq=2)).outcome is Outcome.PROCESSED
    assert [row[3] for row in effects(effects_url, "c")] == [2]


def test_runner_lost_connection_is_not_counted(pool: ConnectionPool, effects_url: str) -> None:
    def handler(conn: Any, msg: Any) -> None:
        raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")

    runner = HandlerRunner(pool, handler, consumer="c", max_attempts=1)
    result = runner.handle(make_envelope())
    assert (result.outcome, result.attempts) == (Outcome.FAILED, None)
    assert inbox_rows(effects_url, "c") == {}


def test_runner_with_sqlalchemy_sessionmaker_and_also(effects_url: str) -> None:
    engine = create_engine(sqlalchemy_url(effects_url), poolclass=NullPool)
    seen: list[str] = []

    def also(session: Any) -> None:
        seen.append(type(session).__name__)
        stmt = (
            "INSERT INTO effects (consumer, message_id, key) VALUES ('x', gen_random_uuid(), 'a')"
        )
        session.execute(text(stmt))

    runner = HandlerRunner(sessionmaker(engine), lambda s, m: apply_effect(s, "c", m), consumer="c")
    msg = make_envelope()
    assert runner.handle(msg, also=also).outcome is Outcome.PROCESSED
    assert runner.handle(msg, also=also).outcome is Outcome.DUPLICATE
    engine.dispose()
    assert seen == ["Session", "Session"]
    assert len(effects(effects_url, "x")) == 2  # committed with each acknowledged outcome


def test_async_runner_pool_and_sessionmaker(effects_url: str) -> None:
    async def handler(conn: Any, msg: Any) -> None:
        stmt = "INSERT INTO effects (consumer, message_id, key) VALUES ('c', %s, %s)"
        if isinstance(conn, psycopg.AsyncConnection):
            await conn.execute(stmt, (msg.id, msg.key))
        else:
            await conn.execute(
                text("INSERT INTO effects (consumer, message_id, key) VALUES ('c', :m, :k)"),
                {"m": msg.id, "k": msg.key},
            )

    async def go() -> list[Outcome]:
        msg = make_envelope()
        out = []
        async with AsyncConnectionPool(effects_url, min_size=1, open=False) as apool:
            runner = AsyncHandlerRunner(apool, handler, consumer="c")
            out += [(await runner.handle(msg)).outcome for _ in range(2)]
        engine = create_async_engine(sqlalchemy_url(effects_url), poolclass=NullPool)
        runner = AsyncHandlerRunner(async_sessionmaker(engine), handler, consumer="c")
        out += [(await runner.handle(msg)).outcome, (await runner.handle(make_envelope())).outcome]
        await engine.dispose()
        return out

    assert asyncio.run(go()) == [
        Outcome.PROCESSED,
        Outcome.DUPLICATE,
        Outcome.DUPLICATE,
        Outcome.PROCESSED,
    ]
    assert len(effects(effects_url, "c")) == 2


def test_runner_refuses_bad_configuration(pool: ConnectionPool) -> None:
    with pytest.raises(ConfigurationError, match="max_attempts"):
        HandlerRunner(pool, print, consumer="c", max_attempts=0)
    with pytest.raises(ConfigurationError, match="consumer"):
        HandlerRunner(pool, print, consumer="")
    with pytest.raises(ConfigurationError, match=r"psycopg_pool\.ConnectionPool"):
        HandlerRunner(42, print, consumer="c")


def test_purge_deletes_old_finished_records_in_batches(effects_url: str) -> None:
    with psycopg.connect(effects_url) as conn:
        conn.execute(
            "INSERT INTO inbox_messages (consumer, message_id, topic, key, status, received_at) "
            "SELECT 'c', gen_random_uuid(), 't', 'k', s, now() - interval '10 days' "
            "FROM unnest(array['processed','processed','processed','stale','dead','processing']) s"
        )
        conn.execute(
            "INSERT INTO inbox_messages (consumer, message_id, topic, key) "
            "VALUES ('c', gen_random_uuid(), 't', 'k'), ('other', gen_random_uuid(), 't', 'k')"
        )
    assert purge_finished(effects_url, older_than=dt.timedelta(days=7), batch_size=2) == 4
    left = sorted(status for status, *_ in inbox_rows(effects_url, "c").values())
    assert left == ["dead", "processed", "processing"]  # dead, in-flight, and recent kept
    result = CliRunner().invoke(
        commands[0],
        ["purge", "--url", effects_url, "--older-than-days", "7", "--include-dead"],
    )
    assert result.exit_code == 0, result.output
    assert "deleted 1 inbox records" in result.output
    with pytest.raises(ConfigurationError, match="older_than"):
        purge_finished(effects_url, older_than=dt.timedelta(0))


def test_key_positions_outlive_a_purge(pool: ConnectionPool, effects_url: str) -> None:
    """Purging the records of applied messages keeps each key's position: an old redelivery
    to an ordered consumer is still refused, not applied again."""
    runner = HandlerRunner(pool, lambda conn, msg: apply_effect(conn, "c", msg), consumer="c",
                           ordered=True)  # fmt: skip
    first, second = make_envelope(seq=1), make_envelope(seq=2)
    assert [runner.handle(m).outcome for m in (first, second)] == [Outcome.PROCESSED] * 2
    with psycopg.connect(effects_url) as conn:
        conn.execute("UPDATE inbox_messages SET received_at = now() - interval '30 days'")
    assert purge_finished(effects_url, older_than=dt.timedelta(days=7)) == 2
    assert inbox_rows(effects_url, "c") == {}
    assert runner.handle(first).outcome is Outcome.STALE  # no record, but behind the position
    assert [row[3] for row in effects(effects_url, "c")] == [1, 2]
