"""The origin the relay puts on every message: which database it came from.

Several databases may publish one topic with the same keys (a database per tenant); each
numbers a key's messages from 1. An ordered consumer keeps one position per (origin, topic,
key), so the origin must be on every message: the relay's ``origin`` setting, else the
database's own (``outbox_identity``, set by migration outbox_0020 for a database that had
never published). A database without either publishes without an origin, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from outbox.envelope import Envelope

__all__ = ["read_origin", "stamped"]

log = logging.getLogger("relay")


async def read_origin(conn: psycopg.AsyncConnection[Any], statement: bytes) -> str | None:
    """The database's origin (``statement``: relay_statements(...).origin); None when it has
    none, or its schema predates outbox_0020 (logged: consumers then need distinct keys)."""
    try:
        async with conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            row = await (await cur.execute(statement)).fetchone()
    except (pg_errors.UndefinedTable, pg_errors.InsufficientPrivilege) as exc:
        log.warning(
            "relay: the database's origin cannot be read (%s): messages go out without one; "
            "run `outbox migrate` (outbox_0020) and grant the relay SELECT on outbox_identity, "
            "or set the relay's `origin`",
            type(exc).__name__,
        )
        return None
    return row["origin"] if row and row["origin"] else None


def stamped(envelopes: Sequence[Envelope], origin: str | None) -> list[Envelope]:
    """``envelopes`` with ``origin`` on each (unchanged without one)."""
    if not origin:
        return list(envelopes)
    # the constructor by position: a quarter of dataclasses.replace's cost, per message
    out = []
    for e in envelopes:
        if e.origin != origin:
            e = Envelope(e.id, e.topic, e.key, e.seq, e.payload, e.content_type, e.headers,
                         e.traceparent, e.created_at, origin)  # fmt: skip
        out.append(e)
    return out
