"""Keys an ordered consumer cannot move on: their next message keeps arriving out of order.

A message ahead of a gap is refused and leaves no record (it must come again), so a key whose
predecessor never arrives fails nothing and goes dead nowhere. The runners note each refusal
on the key's position (``inbox_forget``); :func:`blocked_keys` lists the keys that have waited
longer than a threshold, with the dead message at the head of the gap when there is one.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

from inbox._receive import translate
from inbox._retention import _libpq_url
from inbox._statements import inbox_statements
from outbox.exceptions import ConfigurationError

__all__ = ["BlockedKey", "blocked_keys"]


@dataclass(frozen=True)
class BlockedKey:
    """One key of one consumer waiting for its message ``last_seq + 1``."""

    consumer: str
    topic: str
    key: str
    #: the last seq applied (or skipped past a dead message)
    last_seq: int
    #: the seq that last arrived too early
    waiting_seq: int | None
    #: since when the key has waited without moving on
    blocked_since: dt.datetime
    #: early deliveries refused so far (all time)
    out_of_order: int
    waited: dt.timedelta
    #: the dead message at the head of the gap, if the gap is a dead message
    dead_id: uuid.UUID | None
    dead_error: str | None
    #: the database the key's messages come from ('' for messages without an origin)
    origin: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def blocked_keys(
    url: str,
    *,
    consumer: str | None = None,
    min_age: dt.timedelta = dt.timedelta(minutes=1),
    limit: int = 100,
    schema: str | None = None,
) -> list[BlockedKey]:
    """The keys that have waited at least ``min_age`` for a predecessor, oldest wait first."""
    if not isinstance(min_age, dt.timedelta) or min_age < dt.timedelta(0):
        raise ConfigurationError(f"min_age must be a timedelta >= 0, not {min_age!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"limit must be a positive int, not {limit!r}")
    stmts = inbox_statements(schema)
    params = {"consumer": consumer, "min_age": min_age, "limit": limit}
    try:
        with (
            psycopg.connect(_libpq_url(url), autocommit=True) as conn,
            conn.cursor(row_factory=class_row(BlockedKey)) as cur,
        ):
            return cur.execute(stmts.blocked_keys, params).fetchall()
    except psycopg.Error as exc:
        raise translate(exc, stmts) from exc
