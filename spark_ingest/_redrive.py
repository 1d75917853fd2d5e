"""Re-queue lost messages for the relay: same ids, so inboxes drop anything that did arrive."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from outbox.exceptions import ConfigurationError
from outbox.schema import OUTBOX_MESSAGES, check_identifier

__all__ = ["RedriveResult", "read_id_file", "redrive"]

# One statement: rows are re-queued only if they exist and are not already pending, so running
# it twice, or concurrently with the relay, is harmless. attempts and last_error are kept as the
# audit of what happened before; published_at is cleared because the row is no longer
# published (the relay sets it again). Returning the ids tells the caller which ones changed.
_REDRIVE = """
UPDATE {table}
   SET status = 'pending', available_at = clock_timestamp(), published_at = NULL
 WHERE id = ANY(%(ids)s::uuid[]) AND status <> 'pending'
RETURNING id::text
"""
_DRY_RUN = """
SELECT id::text, status FROM {table} WHERE id = ANY(%(ids)s::uuid[])
"""


@dataclass(frozen=True)
class RedriveResult:
    """``requeued``: ids set back to pending (or that would be, with dry_run);
    ``already_pending`` and ``missing``: ids left alone."""

    requeued: list[str]
    already_pending: list[str]
    missing: list[str]
    dry_run: bool


def read_id_file(path: str | Path) -> list[str]:
    """Ids one per line (blank lines and ``#`` comments ignored), validated as UUIDs."""
    import uuid

    ids = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            ids.append(str(uuid.UUID(text)))
        except ValueError as exc:
            raise ConfigurationError(
                f"{path}:{n}: {text!r} is not a message id (UUID); nothing was re-queued",
                line=n,
            ) from exc
    return ids


def redrive(
    conn: psycopg.Connection[Any],
    ids: Iterable[str],
    *,
    schema: str | None = None,
    dry_run: bool = False,
) -> RedriveResult:
    """Set ``ids`` back to pending, available now, in one statement and one transaction."""
    wanted = sorted(set(ids))
    table = (
        sql.Identifier(check_identifier(schema), OUTBOX_MESSAGES)
        if schema
        else sql.Identifier(OUTBOX_MESSAGES)
    )
    found = dict(conn.execute(sql.SQL(_DRY_RUN).format(table=table), {"ids": wanted}).fetchall())
    missing = [i for i in wanted if i not in found]
    pending = sorted(i for i, s in found.items() if s == "pending")
    if dry_run:
        requeued = sorted(i for i, s in found.items() if s != "pending")
    else:
        rows = conn.execute(sql.SQL(_REDRIVE).format(table=table), {"ids": wanted}).fetchall()
        requeued = sorted(r[0] for r in rows)
    return RedriveResult(requeued, pending, missing, dry_run)
