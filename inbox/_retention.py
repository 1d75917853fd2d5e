"""Retention: delete finished inbox records older than a window, in small batches.

The window must exceed the longest time a message can still be delivered again (broker
retention, replays, DLQ re-drives, relay outages) and the reconciliation window: a redelivery
older than the window is no longer recognised as a duplicate (failure mode F31). Ordered
consumers keep ``inbox_key_positions`` forever, so for them a very old redelivery is still
dropped as stale.
"""

from __future__ import annotations

import datetime as dt

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import make_url

from inbox._receive import translate
from inbox._statements import inbox_statements
from outbox.exceptions import ConfigurationError

__all__ = ["purge"]


def _libpq_url(url: str) -> str:
    """Accept SQLAlchemy-style URLs (postgresql+psycopg://) as well as libpq ones."""
    if "+" in url.split("://", 1)[0]:
        return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return url


def purge(
    url: str,
    *,
    older_than: dt.timedelta,
    consumer: str | None = None,
    batch_size: int = 1000,
    include_dead: bool = False,
    schema: str | None = None,
) -> int:
    """Delete processed (and stale; with ``include_dead`` also dead) records received more than
    ``older_than`` ago, ``batch_size`` rows per transaction. Returns the number deleted.
    Records still 'processing' (failed, awaiting redelivery) are never deleted."""
    if not isinstance(older_than, dt.timedelta) or older_than <= dt.timedelta(0):
        raise ConfigurationError(f"older_than must be a positive timedelta, not {older_than!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigurationError(f"batch_size must be a positive int, not {batch_size!r}")
    stmts = inbox_statements(schema)
    statuses = ["processed", "stale", *(["dead"] if include_dead else [])]
    total = 0
    with psycopg.connect(_libpq_url(url), autocommit=True) as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cutoff = cur.execute(stmts.purge_cutoff, {"older_than": older_than}).fetchone()
        params = {
            "before": cutoff["before"] if cutoff else None,
            "statuses": statuses,
            "consumer": consumer,
            "batch_size": batch_size,
        }
        while True:  # each DELETE is its own short transaction (autocommit)
            try:
                deleted = conn.execute(stmts.purge_batch, params).rowcount
            except psycopg.Error as exc:
                raise translate(exc, stmts) from exc
            total += deleted
            if deleted < batch_size:
                return total
