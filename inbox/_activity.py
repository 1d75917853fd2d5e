"""What each consumer of an inbox database has done lately (the console's overview)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from psycopg.rows import class_row

from inbox._statements import inbox_statements
from outbox.kit import Database, connected

__all__ = ["ConsumerActivity", "consumer_activity"]


@dataclass(frozen=True)
class ConsumerActivity:
    """One consumer's records: when it last processed one, and how many wait or failed."""

    consumer: str
    last_processed_at: dt.datetime | None
    #: seconds since ``last_processed_at`` (None: it never processed one)
    silent_s: float | None
    #: messages processed in the last minute
    last_minute: int
    dead: int
    parked: int


def consumer_activity(url: Database, *, schema: str | None = None) -> list[ConsumerActivity]:
    """Every consumer with a record in the inbox table, by name (one scan of the table)."""
    with (
        connected(url) as conn,
        conn.cursor(row_factory=class_row(ConsumerActivity)) as cur,
    ):
        return cur.execute(inbox_statements(schema).consumer_activity).fetchall()
