"""Operator functions behind ``outbox inbox held`` and ``outbox inbox dead retry|purge|audit``.

The same words as the relay's ``outbox dead``: *retry* gives a dead message another go,
*purge* gives it up; both are audited (who, when, why) in the statement that records the
decision. The decision is the operator's; applying it needs the consumer's handler, so the
consumer process applies it (``resolve_held``), in the key's order, and audits the outcome.
Only dead messages that hold their key (``on_dead="hold"``) have a decision to take: with
``skip`` the key has already moved on.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg.rows import RowFactory, class_row, dict_row

from inbox._receive import translate
from inbox._retention import _libpq_url
from inbox._statements import inbox_statements
from outbox.exceptions import ConfigurationError
from outbox.kit import Database, connected, default_actor

__all__ = ["HeldFilter", "HeldKey", "dead_audit", "dead_purge", "dead_retry", "held_keys"]


@dataclass(frozen=True)
class HeldFilter:
    """Which held dead messages: every given field must match (none given: all of them)."""

    consumer: str | None = None
    topic: str | None = None
    key: str | None = None
    ids: Sequence[uuid.UUID] = ()

    @property
    def empty(self) -> bool:
        return not any((self.consumer, self.topic, self.key, self.ids))

    def params(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "topic": self.topic,
            "key": self.key,
            "ids": [uuid.UUID(str(i)) for i in self.ids],
        }


@dataclass(frozen=True)
class HeldKey:
    """A key held behind its dead message ``message_id`` (seq ``seq``)."""

    consumer: str
    topic: str
    key: str
    seq: int
    message_id: uuid.UUID
    last_error: str | None
    attempts: int | None
    held_at: dt.datetime
    #: 'retry' or 'purge' once an operator has decided and the consumer has not applied it yet
    decision: str | None
    #: later messages of the key kept behind it
    parked: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _libpq(url: Database) -> Database:
    return _libpq_url(url) if isinstance(url, str) else url


def _run(
    url: Database,
    schema: str | None,
    statement_name: str,
    params: dict[str, Any],
    row_factory: RowFactory[Any] = dict_row,
) -> list[Any]:
    stmts = inbox_statements(schema)
    try:
        with (
            connected(_libpq(url), transaction=True) as conn,  # one transaction: change + audit
            conn.cursor(row_factory=row_factory) as cur,
        ):
            rows = cur.execute(getattr(stmts, statement_name), params).fetchall()
    except psycopg.Error as exc:
        raise translate(exc, stmts) from exc
    return rows


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"limit must be a positive int, not {limit!r}")


def held_keys(
    url: Database, where: HeldFilter = HeldFilter(), *, limit: int = 100, schema: str | None = None
) -> list[HeldKey]:
    """Held keys, the longest held first."""
    _check_limit(limit)
    return _run(url, schema, "held_list", {**where.params(), "limit": limit}, class_row(HeldKey))


def _decide(
    decision: str,
    url: Database,
    where: HeldFilter,
    *,
    reason: str | None,
    actor: str | None,
    limit: int,
    dry_run: bool,
    schema: str | None,
) -> list[uuid.UUID]:
    _check_limit(limit)
    if dry_run:
        return [k.message_id for k in held_keys(url, where, limit=limit, schema=schema)]
    params = {
        **where.params(),
        "decision": decision,
        "reason": reason,
        "actor": actor or default_actor(),
        "limit": limit,
    }
    return [row["message_id"] for row in _run(url, schema, "dead_decide", params)]


def dead_retry(
    url: Database,
    where: HeldFilter,
    *,
    reason: str | None = None,
    actor: str | None = None,
    limit: int = 10_000,
    dry_run: bool = False,
    schema: str | None = None,
) -> list[uuid.UUID]:
    """Decide to retry matching held dead messages (audited). The consumer applies each, then
    its key's parked messages in seq order; a retry that fails again leaves it held."""
    return _decide(
        "retry",
        url,
        where,
        reason=reason,
        actor=actor,
        limit=limit,
        dry_run=dry_run,
        schema=schema,
    )


def dead_purge(
    url: Database,
    where: HeldFilter,
    *,
    reason: str | None = None,
    actor: str | None = None,
    limit: int = 10_000,
    dry_run: bool = False,
    schema: str | None = None,
) -> list[uuid.UUID]:
    """Decide to give up matching held dead messages (audited). The consumer moves each key on
    past its dead message (no effect), then applies the parked messages in seq order."""
    return _decide(
        "purge",
        url,
        where,
        reason=reason,
        actor=actor,
        limit=limit,
        dry_run=dry_run,
        schema=schema,
    )


def dead_audit(
    url: Database, *, consumer: str | None = None, limit: int = 50, schema: str | None = None
) -> list[dict[str, Any]]:
    """The newest audit rows first: decisions and what the consumer made of them."""
    _check_limit(limit)
    stmts = inbox_statements(schema)
    try:
        with connected(_libpq(url)) as conn:
            cur = conn.execute(stmts.dead_audit_list, {"consumer": consumer, "limit": limit})
            names = [d.name for d in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    except psycopg.Error as exc:
        raise translate(exc, stmts) from exc
