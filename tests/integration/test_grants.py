"""Least privilege with real roles: `outbox migrate grants` gives a producer, a relay and a
consumer exactly what they need. Each does its whole job as its own role on a real
PostgreSQL; the producer cannot read or change the relay's state; each is refused the others'
tables."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from inbox import HandlerRunner, HeldFilter, Outcome, dead_retry, held_keys
from outbox import Message, publish, publish_batch
from outbox.cli import main as outbox_cli
from outbox.envelope import Envelope
from relay import Relay
from relay.brokers.memory import MemoryPublisher

sys.path.insert(0, str(Path(__file__).parents[1] / "relay"))
from relay_helpers import await_for, config, running

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
    assert 'GRANT SELECT ("id", "seq", "tx_id") ON TABLE "outbox_messages" TO "app";' in out.output
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
    # ... and cannot read or change the relay's state, nor write a row already delivered.
    for statement in (
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
    for statement in ("SELECT * FROM inbox_messages", "UPDATE outbox_capture SET mode = 'wal'"):
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
