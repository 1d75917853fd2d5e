"""HandlerRunner / AsyncHandlerRunner, poison messages and retention, on a real PostgreSQL: the
scenarios run on both flavours (the ``flavour`` fixture)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from inbox import AsyncHandlerRunner, HandlerRunner, Outcome
from inbox.admin import purge_finished
from inbox.cli import commands
from outbox import ConfigurationError
from outbox._migrate import sqlalchemy_url
from tests.inbox.inbox_helpers import apply_effect, effects, inbox_rows, make_envelope
from tests.support.flavours import Flavour


def _fail_first(failures: int) -> Any:
    """``fail`` for a runner: raises on the first ``failures`` calls (its effect rolls back)."""
    calls = []

    def fail(message: Any) -> None:
        calls.append(message.id)
        if len(calls) <= failures:
            raise ValueError(f"boom {len(calls)}")

    return fail


def _fail_poison(message: Any) -> None:
    if message.payload == b"poison":
        raise ValueError("cannot parse")


def test_runner_outcomes_and_attempts(flavour: Flavour, effects_url: str) -> None:
    runner = flavour.runner(effects_url, fail=_fail_first(2), max_attempts=5)
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


def test_runner_poison_message_is_dead_and_acked(flavour: Flavour, effects_url: str) -> None:
    runner = flavour.runner(effects_url, fail=_fail_first(99), max_attempts=3)
    msg = make_envelope()
    outcomes = [runner.handle(msg).outcome for _ in range(3)]
    assert outcomes == [Outcome.FAILED, Outcome.FAILED, Outcome.DEAD]
    assert Outcome.DEAD.ack
    assert runner.handle(msg).outcome is Outcome.DUPLICATE  # a later redelivery: no retry
    status, attempts, last_error, _ = inbox_rows(effects_url, "c")[msg.id]
    assert (status, attempts, last_error) == ("dead", 4, "ValueError: boom 3")  # 4 deliveries
    assert effects(effects_url, "c") == []


def test_runner_ordered_dead_message_moves_the_key_on(flavour: Flavour, effects_url: str) -> None:
    poison = make_envelope(seq=1, payload=b"poison")
    runner = flavour.runner(effects_url, fail=_fail_poison, ordered=True, max_attempts=1)
    second = make_envelope(seq=2)
    assert runner.handle(second).outcome is Outcome.OUT_OF_ORDER
    assert runner.handle(poison).outcome is Outcome.DEAD
    assert runner.handle(second).outcome is Outcome.PROCESSED
    assert runner.handle(make_envelope(seq=1)).outcome is Outcome.STALE
    assert [row[3] for row in effects(effects_url, "c")] == [2]


@pytest.mark.parametrize("dead_seq", [1, 2, 3])
def test_runner_ordered_dead_message_at_any_seq_moves_the_key_on(
    flavour: Flavour, effects_url: str, dead_seq: int
) -> None:
    """A dead message at any seq moves its key on: its successor is applied next."""
    runner = flavour.runner(effects_url, fail=_fail_poison, ordered=True, max_attempts=3)
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


def test_runner_concurrency_conflict_is_not_counted(flavour: Flavour, effects_url: str) -> None:
    def fail(message: Any) -> None:
        raise psycopg.errors.SerializationFailure("could not serialize access")

    runner = flavour.runner(effects_url, fail=fail, max_attempts=1)
    result = runner.handle(make_envelope())
    assert (result.outcome, result.attempts) == (Outcome.FAILED, None)
    assert inbox_rows(effects_url, "c") == {}  # not dead: a conflict is not the message's fault


def test_runner_counts_a_database_error_that_repeats_on_every_delivery(
    flavour: Flavour, effects_url: str
) -> None:
    # A statement timeout is an OperationalError, but not a lost connection: it fails the same
    # way every time, so it counts towards max_attempts and the ordered key moves on.
    def before(message: Any) -> list[str]:
        if message.seq == 1:  # a query too slow for the consumer's timeout, on every delivery
            return ["SET LOCAL statement_timeout = '20ms'", "SELECT pg_sleep(1)"]
        return []

    runner = flavour.runner(effects_url, before=before, ordered=True, max_attempts=2)
    msg = make_envelope(seq=1)
    results = [runner.handle(msg) for _ in range(2)]
    assert [r.outcome for r in results] == [Outcome.FAILED, Outcome.DEAD]
    assert isinstance(results[1].error, psycopg.errors.QueryCanceled)
    assert runner.handle(make_envelope(seq=2)).outcome is Outcome.PROCESSED
    assert [row[3] for row in effects(effects_url, "c")] == [2]


def test_runner_lost_connection_is_not_counted(flavour: Flavour, effects_url: str) -> None:
    def fail(message: Any) -> None:
        raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")

    runner = flavour.runner(effects_url, fail=fail, max_attempts=1)
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


def test_runner_refuses_bad_configuration(flavour: Flavour, effects_url: str) -> None:
    pool = flavour.pool(effects_url)
    kind = AsyncHandlerRunner if flavour.is_async else HandlerRunner
    with pytest.raises(ConfigurationError, match="max_attempts"):
        kind(pool, print, consumer="c", max_attempts=0)
    with pytest.raises(ConfigurationError, match="consumer"):
        kind(pool, print, consumer="")
    with pytest.raises(ConfigurationError, match="on_dead='hold' needs ordered=True"):
        kind(pool, print, consumer="c", on_dead="hold")
    with pytest.raises(ConfigurationError, match=r"psycopg_pool\.(Async)?ConnectionPool"):
        kind(42, print, consumer="c")


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


def test_key_positions_outlive_a_purge(flavour: Flavour, effects_url: str) -> None:
    """Purging the records of applied messages keeps each key's position: an old redelivery
    to an ordered consumer is still refused, not applied again."""
    runner = flavour.runner(effects_url, ordered=True)
    first, second = make_envelope(seq=1), make_envelope(seq=2)
    assert [runner.handle(m).outcome for m in (first, second)] == [Outcome.PROCESSED] * 2
    with psycopg.connect(effects_url) as conn:
        conn.execute("UPDATE inbox_messages SET received_at = now() - interval '30 days'")
    assert purge_finished(effects_url, older_than=dt.timedelta(days=7)) == 2
    assert inbox_rows(effects_url, "c") == {}
    assert runner.handle(first).outcome is Outcome.STALE  # no record, but behind the position
    assert [row[3] for row in effects(effects_url, "c")] == [1, 2]
