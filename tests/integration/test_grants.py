"""Least privilege with real roles: `outbox migrate grants` gives a producer, a relay and a
consumer exactly what they need. Each does its whole job as its own role on a real
PostgreSQL; the producer cannot read or change the relay's state; each is refused the others'
tables."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from inbox import HandlerRunner, Outcome
from inbox.admin import HeldFilter, dead_retry, held_keys
from outbox import Message, publish, publish_batch
from outbox.cli import main as outbox_cli
from outbox.envelope import Envelope
from relay import Relay
from relay._statements import relay_statements
from relay.brokers.memory import MemoryPublisher
from tests.relay.relay_helpers import await_for, config, record, running

KINDS = ("producer", "relay", "consumer")


@pytest.fixture
def role_urls(database_url: str) -> Iterator[dict[str, str]]:
    """A login role per kind, granted with `outbox migrate grants --apply`; dropped after."""
    suffix = uuid.uuid4().hex[:8]
    roles = {kind: f"oi_{kind}_{suffix}" for kind in KINDS}
    with psycopg.connect(database_url, autocommit=True) as admin:
        for role in roles.values():
            admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute("CREATE TABLE effects (message_id uuid PRIMARY KEY, key text, seq bigint)")
        admin.execute(f'GRANT INSERT, SELECT ON effects TO "{roles["consumer"]}"')
    try:
        args = ["migrate", "grants", "--apply", "--url", database_url]
        for kind, role in roles.items():
            args += [f"--{kind}", role]
        result = CliRunner().invoke(outbox_cli, args)
        assert result.exit_code == 0, result.output
        base = conninfo_to_dict(database_url)
        yield {kind: make_conninfo(**{**base, "user": role}) for kind, role in roles.items()}
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            names = ", ".join(f'"{r}"' for r in roles.values())
            admin.execute(f"DROP OWNED BY {names}")  # their grants in this database
            admin.execute(f"DROP ROLE {names}")


def _refused(url: str, statement: str) -> None:
    with psycopg.connect(url) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(statement)


def test_grants_print_as_sql_without_apply() -> None:
    out = CliRunner().invoke(outbox_cli, ["migrate", "grants", "--producer", "app"])
    assert out.exit_code == 0, out.output
    assert 'GRANT INSERT ON TABLE "outbox_wal_pending" TO "app";' in out.output
    assert "outbox_messages" not in out.output  # the relay numbers and records
    assert "outbox_relays" not in out.output
    refused = CliRunner().invoke(outbox_cli, ["migrate", "grants"])
    assert refused.exit_code == 2
    assert "name at least one role" in refused.output


def test_each_role_does_its_job_and_nothing_else(role_urls: dict[str, str]) -> None:
    producer, relay_url, consumer = (role_urls[k] for k in KINDS)
    # The producer publishes every way there is: one, a batch, idempotent, delayed.
    with psycopg.connect(producer) as conn:
        ids = [publish(conn, topic="orders", key="A", payload={"n": 1})]
        ids += publish_batch(conn, [Message("orders", "A", {"n": 2}), Message("orders", "B", 3)])
        ids.append(publish(conn, topic="orders", key="B", payload=4, idempotency_key="pay-1"))
        again = publish(conn, topic="orders", key="B", payload=4, idempotency_key="pay-1")
        ids.append(publish(conn, topic="later", key="C", payload=5, deliver_after=dt.timedelta(0)))
        conn.commit()
    assert again == ids[3]
    # ... and cannot read or change the relay's state, nor write a row already numbered.
    for statement in (
        "SELECT id FROM outbox_messages",
        "SELECT * FROM outbox_wal_pending",
        "DELETE FROM outbox_wal_pending",
        "UPDATE outbox_key_sequences SET last_seq = 0",
        "SELECT lease_token FROM outbox_messages",
        "SELECT status FROM outbox_messages",
        "UPDATE outbox_messages SET status = 'published'",
        "DELETE FROM outbox_messages",
        "SELECT * FROM outbox_relays",
        "SELECT * FROM outbox_dead_audit",
        "INSERT INTO outbox_messages (id, topic, key, seq, payload, status) "
        "VALUES (gen_random_uuid(), 't', 'k', 99, '', 'published')",
        "SELECT * FROM inbox_messages",
    ):
        _refused(producer, statement)

    # The relay delivers them all as its own role, and runs the operator commands.
    publisher = MemoryPublisher()

    async def deliver() -> None:
        relay = Relay(config(relay_url), publisher)
        async with running(relay):
            await await_for(lambda: sum(map(len, publisher.messages.values())) == 5, within=20)

    asyncio.run(deliver())
    delivered = [env for envs in publisher.messages.values() for env in envs]
    assert sorted(e.id for e in delivered) == sorted(ids)
    for args in (["status"], ["dead", "list"], ["retention", "--older-than", "3600"]):
        out = CliRunner().invoke(outbox_cli, [*args, "--url", relay_url])
        assert out.exit_code == 0, (args, out.output)
    with psycopg.connect(relay_url) as conn:  # the latest run, for its gauges
        conn.execute(relay_statements(None).last_reconciliation).fetchall()
    for statement in (
        "SELECT * FROM inbox_messages",
        "UPDATE outbox_capture SET mode = 'wal'",
        "SELECT summary FROM outbox_reconciliation_runs",
    ):
        _refused(relay_url, statement)

    # The consumer applies them with the inbox, ordered, holding a key behind a dead message.
    def handler(conn: Any, msg: Envelope) -> None:
        if msg.payload == b"3" and not fixed:
            raise ValueError("cannot handle 3")
        conn.execute(
            "INSERT INTO effects (message_id, key, seq) VALUES (%s, %s, %s)",
            (msg.id, msg.key, msg.seq),
        )

    fixed = False
    by_key = sorted((e for e in delivered if e.topic == "orders"), key=lambda e: (e.key, e.seq))
    with ConnectionPool(consumer, min_size=1, max_size=2) as pool:
        runner = HandlerRunner(
            pool, handler, consumer="svc", ordered=True, max_attempts=1, on_dead="hold"
        )
        outcomes = [runner.handle(e).outcome for e in by_key]
        assert runner.handle(by_key[0]).outcome is Outcome.DUPLICATE
        assert [k.key for k in held_keys(consumer)] == ["B"]
        fixed = True
        assert dead_retry(consumer, HeldFilter(key="B"), reason="fixed") != []
        released = [r.outcome for r in runner.resolve_held()]
    assert outcomes == [Outcome.PROCESSED, Outcome.PROCESSED, Outcome.DEAD, Outcome.PARKED]
    assert released == [Outcome.PROCESSED, Outcome.PROCESSED]
    for statement in ("SELECT * FROM outbox_messages", "SELECT * FROM outbox_relays"):
        _refused(consumer, statement)


@pytest.fixture
def operator_urls(database_url: str) -> Iterator[dict[str, str]]:
    """A `console` and a `reconcile` login role, granted with `outbox migrate grants --apply`."""
    suffix = uuid.uuid4().hex[:8]
    roles = {kind: f"oi_{kind}_{suffix}" for kind in ("console", "reconcile")}
    with psycopg.connect(database_url, autocommit=True) as admin:
        for role in roles.values():
            admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        args = ["migrate", "grants", "--apply", "--url", database_url]
        for kind, role in roles.items():
            args += [f"--{kind}", role]
        result = CliRunner().invoke(outbox_cli, args)
        assert result.exit_code == 0, result.output
        base = conninfo_to_dict(database_url)
        yield {kind: make_conninfo(**{**base, "user": role}) for kind, role in roles.items()}
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            names = ", ".join(f'"{r}"' for r in roles.values())
            admin.execute(f"DROP OWNED BY {names}")
            admin.execute(f"DROP ROLE {names}")


def _dead_and_held(url: str) -> tuple[list[uuid.UUID], uuid.UUID]:
    """Three dead outbox messages, and an inbox key held behind a dead message (as the owner)."""
    with psycopg.connect(url) as conn:
        ids = publish_batch(conn, [Message("orders", "A", 1), Message("orders", "B", 2),
                                   Message("orders", "C", 3)])  # fmt: skip
        conn.commit()
        record(url)  # numbered, as a relay does
        conn.execute(
            "UPDATE outbox_messages SET status = 'dead', last_error = 'boom' WHERE id = ANY(%s)",
            (ids,),
        )
        conn.commit()

    def handler(_conn: Any, _msg: Envelope) -> None:
        raise ValueError("cannot handle it")

    poison = Envelope(id=uuid.uuid4(), topic="orders", key="K", seq=1, payload=b"x")
    with ConnectionPool(url, min_size=1, max_size=1) as pool:
        runner = HandlerRunner(pool, handler, consumer="svc", ordered=True, max_attempts=1,
                               on_dead="hold")  # fmt: skip
        assert runner.handle(poison).outcome is Outcome.DEAD
    return ids, poison.id


def test_the_console_role_reads_and_makes_the_audited_changes_only(
    database_url: str, operator_urls: dict[str, str]
) -> None:
    from inbox.admin import consumer_activity, dead_audit, dead_purge
    from relay.admin import (
        DeadFilter,
        audit_log,
        dead_list,
        dead_listing,
        published_since,
        relay_status,
    )
    from relay.admin import dead_drop as outbox_purge  # the console's, through the functions
    from relay.admin import dead_requeue as outbox_retry
    from spark_ingest import latest_runs

    console = operator_urls["console"]
    (first, second, third), held = _dead_and_held(database_url)
    # Everything the console's pages read ...
    assert {t["topic"] for t in relay_status(console).topics} == {"orders"}
    assert [m.payload for m in dead_list(console, DeadFilter(ids=[first]))] == [b"1"]
    assert {c.consumer for c in consumer_activity(console)} == {"svc"}
    assert latest_runs(console) == []
    assert published_since(console, 10) == {}
    listed = dead_listing(console, DeadFilter(), error="BOOM", limit=10)
    assert len(listed) == 3
    assert dead_listing(console, DeadFilter(ids=[first]), error="no such error") == []
    assert [k.message_id for k in held_keys(console)] == [held]
    # ... and the changes it makes, each with its audit row.
    assert outbox_retry(console, DeadFilter(ids=[first]), reason="fixed") == [first]
    assert outbox_purge(console, DeadFilter(ids=[second]), reason="obsolete") == [second]
    assert dead_purge(console, HeldFilter(ids=[held]), reason="give up") == [held]
    assert {r["action"] for r in audit_log(console)} == {"retry", "purge"}
    assert [r["action"] for r in dead_audit(console)] == ["purge"]
    # The operator functions change dead rows only: a pending message stays pending.
    with psycopg.connect(database_url) as conn:
        [pending] = publish_batch(conn, [Message("orders", "P", 4)])
        conn.commit()
    record(database_url)
    with psycopg.connect(console, autocommit=True) as conn:
        for fn in ("outbox_dead_requeue", "outbox_dead_purge"):
            done = conn.execute(f"SELECT {fn}(ARRAY[%s]::uuid[], 'x', 'y')", (pending,))
            assert done.fetchall() == []
        row = conn.execute("SELECT status FROM outbox_messages WHERE id = %s", (pending,))
        assert row.fetchall() == [("pending",)]
    # Nothing else: no publishing, no relay's work, no rewriting the audit or the capture mode;
    # no marking a pending message published (dropped unsent), no deleting rows.
    for statement in (
        f"UPDATE outbox_messages SET status = 'published' WHERE id = '{pending}'",
        f"UPDATE outbox_messages SET status = 'pending' WHERE id = '{third}'",
        f"DELETE FROM outbox_messages WHERE id = '{pending}'",
        f"DELETE FROM outbox_messages WHERE id = '{third}'",
        "INSERT INTO outbox_dead_audit (actor, action, message_id, topic, key, seq) "
        "VALUES ('x', 'retry', gen_random_uuid(), 't', 'k', 1)",
        "INSERT INTO outbox_messages (id, topic, key, seq, payload) "
        "VALUES (gen_random_uuid(), 't', 'k', 1, '')",
        "INSERT INTO outbox_wal_pending (id, record) VALUES (gen_random_uuid(), '')",
        f"UPDATE outbox_messages SET published_at = now() WHERE id = '{third}'",
        f"UPDATE outbox_messages SET payload = '' WHERE id = '{third}'",
        "UPDATE outbox_dead_audit SET reason = 'nothing happened'",
        "DELETE FROM outbox_dead_audit",
        "DELETE FROM inbox_dead_audit",
        "UPDATE outbox_capture SET mode = 'wal'",
        "INSERT INTO outbox_relays (relay_id, hostname, pid) VALUES ('r', 'h', 1)",
        "DELETE FROM inbox_messages",
        "UPDATE inbox_held SET role = 'parked'",
        "UPDATE inbox_key_positions SET last_seq = 0",  # it reads them (outbox trace) only
        "DELETE FROM inbox_key_positions",
        "INSERT INTO outbox_reconciliation_runs (run_id) VALUES (gen_random_uuid())",
    ):
        _refused(console, statement)


def _source(url: str, name: str) -> Any:
    from spark_ingest._config import Source

    info = conninfo_to_dict(url)
    return Source(name=name, url=f"postgresql://{info['host']}:{info.get('port', 5432)}/"
                  f"{info['dbname']}", user=info["user"])  # fmt: skip


def test_the_reconcile_role_reads_what_the_reconciliation_judges_and_records_its_run(
    database_url: str, operator_urls: dict[str, str]
) -> None:
    from spark_ingest._outputs import carried_start, record_run
    from spark_ingest._sources import count_outbox, read_horizon
    from spark_ingest._statements import TEMPLATES

    reconcile = operator_urls["reconcile"]
    _dead_and_held(database_url)
    source = _source(reconcile, "outbox")
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    end = start + dt.timedelta(hours=2)
    assert read_horizon(source, "outbox_messages").xmin > 0
    assert count_outbox(source, start, end, 100) == 3
    with psycopg.connect(reconcile) as conn:  # the JDBC partitions' queries
        outbox_read = TEMPLATES.read_outbox.format(table=sql.Identifier("outbox_messages"))
        inbox_read = TEMPLATES.read_inbox.format(table=sql.Identifier("inbox_messages"))
        assert len(conn.execute(outbox_read).fetchall()) == 3
        assert len(conn.execute(inbox_read).fetchall()) == 1
    run_id = uuid.uuid4()
    summary = {"run_id": str(run_id), "started_at": start.isoformat(),
               "finished_at": end.isoformat(), "window": {"start": start.isoformat(),
               "end": end.isoformat()}, "messages": 3, "discrepancies": 0, "outcome": "ok",
               "unjudged_from": start.isoformat()}  # fmt: skip
    record_run(source, summary, 1)
    assert carried_start(source, end) == start
    for statement in (
        "SELECT payload FROM outbox_messages",
        "SELECT headers FROM outbox_messages",
        "SELECT last_error FROM inbox_messages",
        "SELECT * FROM outbox_dead_audit",
        "SELECT * FROM inbox_held",
        "UPDATE outbox_messages SET status = 'pending'",
        "DELETE FROM outbox_reconciliation_runs",
        "UPDATE outbox_reconciliation_runs SET outcome = 'ok'",
    ):
        _refused(reconcile, statement)


def test_the_reconcile_role_sees_other_roles_open_transactions(
    database_url: str, operator_urls: dict[str, str]
) -> None:
    """The inbox horizon stops at the oldest open transaction of any role: the reconcile role
    reads its start through outbox_oldest_xact_start() (it runs as the tables' owner), and
    cannot read other sessions' query text (it is no member of pg_read_all_stats)."""
    from spark_ingest._errors import SourceError
    from spark_ingest._sources import read_horizon

    reconcile = operator_urls["reconcile"]
    role = conninfo_to_dict(reconcile)["user"]
    source = _source(reconcile, "inbox")
    with psycopg.connect(database_url) as writer:  # another role, a transaction left open
        opened = writer.execute("SELECT now(), 'card=4111111111111111'").fetchone()[0]  # type: ignore[index]
        assert read_horizon(source, "inbox_messages").safe_time == opened
        with psycopg.connect(reconcile, autocommit=True) as spy:
            texts = [r[0] for r in spy.execute(
                "SELECT query FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
            )]  # fmt: skip
            assert texts  # the other sessions are listed ...
            assert not any("4111" in (t or "") for t in texts)  # ... without their query text
            member = spy.execute("SELECT pg_has_role('pg_read_all_stats', 'USAGE')").fetchone()
            assert member == (False,)
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f'REVOKE EXECUTE ON FUNCTION outbox_oldest_xact_start() FROM "{role}"')
        with pytest.raises((SourceError, psycopg.Error)):  # refused loudly, never blind
            read_horizon(source, "inbox_messages")
        writer.rollback()


def test_a_relay_role_granted_before_it_read_the_runs_keeps_heartbeating(
    database_url: str, role_urls: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A role granted by an older version cannot read outbox_reconciliation_runs: the relay
    says so once, leaves the reconciliation gauges at 0 (the missing-run alert fires) and
    goes on heartbeating and publishing."""
    from relay import RelayMetrics

    relay_url = role_urls["relay"]
    role = conninfo_to_dict(relay_url)["user"]
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'REVOKE SELECT ON outbox_reconciliation_runs FROM "{role}"')
    publisher = MemoryPublisher()
    metrics = RelayMetrics.prometheus()
    relay = Relay(config(relay_url), publisher, metrics=metrics)

    def sample(name: str) -> float:
        return metrics.registry.get_sample_value(name) or 0.0

    async def go() -> None:
        async with running(relay):
            beat = "outbox_relay_heartbeat_timestamp_seconds"
            await await_for(lambda: sample(beat) > 0, what="a heartbeat (the refusal in it)")
            first = sample(beat)
            await await_for(lambda: sample(beat) > first, what="a heartbeat after the refusal")

    with caplog.at_level("WARNING", logger="relay"):
        asyncio.run(go())
    refusals = [r for r in caplog.records if "outbox_reconciliation_runs" in r.getMessage()]
    assert len(refusals) == 1
    assert "outbox migrate grants --relay" in refusals[0].getMessage()
    assert sample("outbox_reconciliation_last_run_timestamp_seconds") == 0
    assert not [r for r in caplog.records if "heartbeat failed" in r.getMessage()]


@pytest.mark.parametrize("shape", ["a%sb", "a%%b", "o'ne\"il", "a;b", "A B"])
def test_role_names_are_identifiers(database_url: str, shape: str) -> None:
    """A role name with ``%``, quotes or blanks is an identifier: the grants reach that role
    and no other (never placeholder parsing: ``a%sb`` once became ``a$1b``)."""
    role = f"oi_{uuid.uuid4().hex[:6]}_{shape}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        args = ["migrate", "grants", "--apply", "--url", database_url, "--producer", role]
        result = CliRunner().invoke(outbox_cli, args)
        assert result.exit_code == 0, result.output
        with psycopg.connect(database_url) as conn:
            got = conn.execute(
                "SELECT has_table_privilege(%s, 'outbox_wal_pending', 'INSERT')", (role,)
            ).fetchone()
        assert got == (True,)
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_missing_role_is_named_not_blamed_on_the_database(database_url: str) -> None:
    role = f"oi_missing_{uuid.uuid4().hex[:6]}"
    args = ["migrate", "grants", "--apply", "--url", database_url, "--relay", role]
    result = CliRunner().invoke(outbox_cli, args)
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert f'role "{role}" does not exist' in line
    assert "create the role" in line
    assert "database name" not in line
