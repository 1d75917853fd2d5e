"""Operator functions behind `outbox status`, `outbox dead ...` and `outbox retention`.

Synchronous, one short transaction each (retention: one per batch). Dead-letter changes write
their audit rows in the same statement as the change.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outbox._actor import default_actor
from relay._queries import relay_statements

__all__ = [
    "DeadFilter",
    "DeadMessage",
    "RelayStatus",
    "dead_list",
    "dead_purge",
    "dead_retry",
    "default_actor",
    "delete_published",
    "relay_status",
]


@dataclass(frozen=True)
class DeadFilter:
    """Which dead messages: every given field must match (none given: all of them)."""

    topic: str | None = None
    key: str | None = None
    ids: Sequence[uuid.UUID] | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    @property
    def empty(self) -> bool:
        return not any((self.topic, self.key, self.ids, self.since, self.until))

    def params(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "key": self.key,
            "ids": list(self.ids) if self.ids else None,
            "since": self.since,
            "until": self.until,
        }


@dataclass(frozen=True)
class DeadMessage:
    id: uuid.UUID
    topic: str
    key: str
    seq: int
    attempts: int
    created_at: dt.datetime
    last_error: str | None
    payload: bytes
    content_type: str
    headers: dict[str, str]


@dataclass(frozen=True)
class RelayStatus:
    """Backlog per topic and the live relays with what they hold."""

    topics: list[dict[str, Any]] = field(default_factory=list)
    relays: list[dict[str, Any]] = field(default_factory=list)

    @property
    def paused_destinations(self) -> list[dict[str, Any]]:
        """Topics a live relay has paused because their destination refuses messages."""
        return [
            {"topic": topic, "relay_id": r["relay_id"], **pause}
            for r in self.relays
            for topic, pause in sorted((r.get("paused_destinations") or {}).items())
        ]


def relay_status(url: str, *, schema: str | None = None) -> RelayStatus:
    stmts = relay_statements(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(stmts.status_topics)
        names = [d.name for d in cur.description or []]
        topics = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        cur = conn.execute(stmts.status_relays)
        names = [d.name for d in cur.description or []]
        relays = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return RelayStatus(topics, relays)


def dead_list(
    url: str, where: DeadFilter, *, limit: int = 100, schema: str | None = None
) -> list[DeadMessage]:
    stmts = relay_statements(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(stmts.dead_list, {**where.params(), "limit": limit}).fetchall()
    return [
        DeadMessage(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bytes(r[7]), r[8], r[9] or {})
        for r in rows
    ]


def _change(
    statement: bytes,
    url: str,
    where: DeadFilter,
    *,
    actor: str | None,
    reason: str | None,
    limit: int,
    dry_run: bool,
    schema: str | None,
) -> list[uuid.UUID]:
    if dry_run:
        return [m.id for m in dead_list(url, where, limit=limit, schema=schema)]
    params = {
        **where.params(),
        "limit": limit,
        "actor": actor or default_actor(),
        "reason": reason,
    }
    with psycopg.connect(url) as conn:  # one transaction: change + audit
        rows = conn.execute(statement, params).fetchall()
    return [r[0] for r in rows]


def dead_retry(
    url: str,
    where: DeadFilter,
    *,
    actor: str | None = None,
    reason: str | None = None,
    limit: int = 10_000,
    dry_run: bool = False,
    schema: str | None = None,
) -> list[uuid.UUID]:
    """Re-queue matching dead messages (pending, attempts 0, available now), audited."""
    stmt = relay_statements(schema).dead_retry
    return _change(
        stmt, url, where, actor=actor, reason=reason, limit=limit, dry_run=dry_run, schema=schema
    )


def dead_purge(
    url: str,
    where: DeadFilter,
    *,
    actor: str | None = None,
    reason: str | None = None,
    limit: int = 10_000,
    dry_run: bool = False,
    schema: str | None = None,
) -> list[uuid.UUID]:
    """Delete matching dead messages for good, audited (a held key then moves on)."""
    stmt = relay_statements(schema).dead_purge
    return _change(
        stmt, url, where, actor=actor, reason=reason, limit=limit, dry_run=dry_run, schema=schema
    )


def audit_log(url: str, *, limit: int = 50, schema: str | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(relay_statements(schema).audit_list, {"limit": limit}).fetchall()


def delete_published(
    url: str, older_than: float, *, batch: int = 1000, schema: str | None = None
) -> int:
    """Delete published rows older than ``older_than`` seconds, ``batch`` rows per transaction."""
    stmt = relay_statements(schema).retention
    total = 0
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            cur = conn.execute(stmt, {"keep_seconds": older_than, "limit": batch})
            total += cur.rowcount
            if cur.rowcount < batch:
                return total
