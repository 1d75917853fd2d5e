"""Helpers for the inbox tests: message factory, an effects table, row readers."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from outbox.envelope import Envelope

EFFECTS_DDL = """
CREATE TABLE effects (
    consumer text NOT NULL,
    message_id uuid NOT NULL,
    key text NOT NULL,
    seq bigint,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def make_envelope(**overrides: Any) -> Envelope:
    fields: dict[str, Any] = {
        "id": uuid.uuid4(),
        "topic": "orders",
        "key": "k1",
        "seq": 1,
        "payload": b'{"n": 1}',
        "headers": {"tenant": "acme"},
    }
    fields.update(overrides)
    return Envelope(**fields)


def apply_effect(conn: Any, consumer: str, message: Any) -> None:
    """The business effect of the tests: one row per application (duplicates are visible)."""
    raw = conn if isinstance(conn, psycopg.Connection) else None
    stmt = "INSERT INTO effects (consumer, message_id, key, seq) VALUES (%s, %s, %s, %s)"
    params = (consumer, message.id, message.key, message.seq)
    if raw is not None:
        raw.execute(stmt, params)
    else:
        from sqlalchemy import text

        conn.execute(
            text("INSERT INTO effects (consumer, message_id, key, seq) VALUES (:c, :m, :k, :s)"),
            {"c": consumer, "m": message.id, "k": message.key, "s": message.seq},
        )


def effects(url: str, consumer: str | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT consumer, message_id, key, seq FROM effects "
            "WHERE %(c)s::text IS NULL OR consumer = %(c)s ORDER BY at",
            {"c": consumer},
        ).fetchall()


def inbox_rows(url: str, consumer: str) -> dict[uuid.UUID, tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT message_id, status, attempts, last_error, seq FROM inbox_messages "
            "WHERE consumer = %s",
            (consumer,),
        ).fetchall()
    return {r[0]: r[1:] for r in rows}


class FailOnce:
    """An effect handler: one row in ``effects`` per call; the first delivery of each id in
    ``fail_once`` fails after writing it (so its effect is rolled back)."""

    def __init__(self, fail_once: set[uuid.UUID] | frozenset[uuid.UUID] = frozenset()) -> None:
        self.pending_failures = set(fail_once)

    async def __call__(self, conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        await conn.execute(
            "INSERT INTO effects (consumer, message_id, key, seq) VALUES ('svc', %s, %s, %s)",
            (env.id, env.key, env.seq),
        )
        if env.id in self.pending_failures:
            self.pending_failures.discard(env.id)
            raise RuntimeError("first attempt fails")


class Flaky:
    """A handler that fails its first ``failures`` calls (the effect rolls back with the
    transaction), then applies the effect."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, conn: Any, msg: Any) -> None:
        self.calls += 1
        apply_effect(conn, "c", msg)
        if self.calls <= self.failures:
            raise ValueError(f"boom {self.calls}")
