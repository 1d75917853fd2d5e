"""Re-queue lost messages for the relay: same ids, so inboxes drop anything that did arrive.

The statements are ``outbox._statements.redrive_statements`` (audited like a dead-letter retry);
this module only runs them and wakes the relays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox.exceptions import ConfigurationError
from outbox.kit import default_actor, doorbell_for, redrive_statements, ring_after_commit

__all__ = ["RedriveResult", "read_id_file", "redrive", "wait_for_wakeup"]


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
    actor: str | None = None,
    reason: str | None = None,
) -> RedriveResult:
    """Set ``ids`` back to pending, available now, in one statement in the caller's transaction,
    with an audit row each in ``outbox_dead_audit`` (action 'redrive'; ``actor`` defaults to
    user@host). Relays are woken once the caller commits, the way ``publish()`` wakes them
    (``outbox._wakeup``); rolled back, nothing changes and nobody is woken.
    """
    wanted = sorted(set(ids))
    stmts = redrive_statements(schema or None)
    with conn.cursor(row_factory=dict_row) as cur:
        found = {r["id"]: r["status"] for r in cur.execute(stmts.preview, {"ids": wanted})}
    missing = [i for i in wanted if i not in found]
    pending = sorted(i for i, s in found.items() if s == "pending")
    if dry_run:
        requeued = sorted(i for i, s in found.items() if s != "pending")
    else:
        params = {"ids": wanted, "actor": actor or default_actor(), "reason": reason}
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(stmts.redrive, params).fetchall()
        requeued = sorted(row["message_id"] for row in rows)
        if rows:
            ring_after_commit(conn, conn, {row["xact"] for row in rows})
    return RedriveResult(requeued, pending, missing, dry_run)


def wait_for_wakeup(conn: psycopg.Connection[Any], timeout: float = 5.0) -> bool:
    """After the commit of a re-drive on ``conn``: wait until the relays' wake-up has gone out
    (for a process about to exit, whose doorbell thread would otherwise die with it). True if
    it went out (or the doorbell gave up: the relays' fallback poll finds the rows anyway)."""
    return doorbell_for(conn).wait_idle(timeout)
