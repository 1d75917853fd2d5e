"""What the console reads and changes, on a pool of connections opened for the app's lifetime.

The console has no SQL of its own: it reads through the public functions of the packages that
own the tables (:mod:`relay.admin`, :mod:`inbox.admin`, :mod:`spark_ingest`,
:mod:`outbox.trace`), and every change goes through the functions behind the CLI (``outbox
dead retry`` and ``purge``, ``outbox inbox dead retry`` and ``purge``), which write the audit
row in the same transaction as the change and wake the relays. Each call runs in a worker
thread on a connection of the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolClosed

import inbox.admin as inbox_admin
from outbox.kit import redact
from outbox.trace import Journey, TraceSource, TraceSources, trace_message
from relay.admin import (
    DeadFilter,
    DeadMessage,
    RelayStatus,
    audit_log,
    dead_drop,
    dead_list,
    dead_listing,
    dead_requeue,
    relay_status,
)
from spark_ingest import latest_runs, run_report

__all__ = [
    "CHANGE_LIMIT",
    "INBOX_HELD",
    "LIST_LIMIT",
    "OUTBOX_DEAD",
    "ConsoleData",
    "Decisions",
]

#: how many rows a listing shows, and how many messages one change may touch
LIST_LIMIT = 200
CHANGE_LIMIT = 10_000
#: how long a request waits for a pooled connection before the page says the database is gone
POOL_WAIT = 5.0

T = TypeVar("T")
Row = dict[str, Any]


@dataclass(frozen=True)
class Decisions:
    """The audited functions that requeue (``retry``) or purge what a filter selects."""

    retry: Callable[..., list[uuid.UUID]]
    purge: Callable[..., list[uuid.UUID]]


#: the outbox's dead letters (``outbox dead retry/purge``)
# through the operator functions: the console role may not UPDATE or DELETE rows itself
OUTBOX_DEAD = Decisions(retry=dead_requeue, purge=dead_drop)
#: the inbox's held keys (``outbox inbox dead retry/purge``)
INBOX_HELD = Decisions(retry=inbox_admin.dead_retry, purge=inbox_admin.dead_purge)


class ConsoleData:
    """The console's reads and changes for the tables in ``schema`` at ``url``."""

    def __init__(
        self,
        url: str,
        schema: str | None,
        pool_size: int,
        inboxes: tuple[TraceSource, ...] = (),
        reports: Path | None = None,
    ) -> None:
        self.url, self.schema, self.pool_size = url, schema, pool_size
        #: where the message page looks: this database, then the inbox databases
        self.sources = TraceSources(TraceSource("outbox", url, schema=schema), inboxes)
        self.reports = reports
        self._pool: ConnectionPool | None = None

    # ---- the pool ------------------------------------------------------------------------

    def open(self) -> None:
        """Open the pool without waiting: an unreachable database is a page that says so."""
        self._pool = ConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            open=False,
            timeout=POOL_WAIT,
            check=ConnectionPool.check_connection,
            kwargs={"autocommit": True, "application_name": "outbox console"},
            name="outbox-console",
        )
        self._pool.open(wait=False)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.close)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool (PoolClosed before the app's lifespan opened it)."""
        if self._pool is None:
            raise PoolClosed("the console's connection pool is not open (the app is not served)")
        with self._pool.connection() as conn:
            yield conn

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(conn, *args, **kwargs)`` in a worker thread, on a connection of the pool."""

        def call() -> T:
            with self.connection() as conn:
                return fn(conn, *args, **kwargs)

        return await asyncio.to_thread(call)

    async def why_unreachable(self) -> str:
        """Why no pooled connection came: one direct attempt, for its error (the pool's own
        attempts only log theirs)."""
        return await asyncio.to_thread(_why, self.url)

    # ---- reads ---------------------------------------------------------------------------

    async def overview(self) -> dict[str, Any]:
        """The overview page: relays and topics, consumers, held keys per consumer, runs."""
        return await self.run(self._overview)

    def _overview(self, conn: psycopg.Connection[Any]) -> dict[str, Any]:
        status: RelayStatus = relay_status(conn, schema=self.schema)
        held: dict[str, int] = {}
        for k in inbox_admin.held_keys(conn, limit=LIST_LIMIT, schema=self.schema):
            held[k.consumer] = held.get(k.consumer, 0) + 1
        return {
            "status": status,
            "consumers": inbox_admin.consumer_activity(conn, schema=self.schema),
            "held": held,
            "runs": latest_runs(conn, limit=5, schema=self.schema),
        }

    async def dead_letters(self, where: DeadFilter, error: str, limit: int) -> list[Row]:
        """The dead letters ``where`` selects whose error contains ``error`` (no payloads)."""
        return await self.run(dead_listing, where, error=error, limit=limit, schema=self.schema)

    async def dead_message(self, message_id: uuid.UUID) -> DeadMessage | None:
        """One dead letter, payload and headers included; None if it is not dead."""
        found = await self.run(dead_list, DeadFilter(ids=[message_id]), limit=1, schema=self.schema)
        return found[0] if found else None

    async def trace(self, message_id: uuid.UUID | None = None, **lookup: Any) -> Journey:
        """One message's journey (``outbox trace``): by id, or ``lookup`` (idempotency_key and
        topic, or topic, key and seq). Read-only, on connections of its own (one per database,
        each in one read-only transaction), not the pool's."""
        return await asyncio.to_thread(
            trace_message, self.sources, message_id, reports_dir=self.reports, **lookup
        )

    async def held_keys(self, where: inbox_admin.HeldFilter) -> list[inbox_admin.HeldKey]:
        return await self.run(inbox_admin.held_keys, where, limit=LIST_LIMIT, schema=self.schema)

    async def audit(self) -> dict[str, Any]:
        """The newest audit rows of the outbox's and the inbox's decisions."""
        return await self.run(self._audit)

    def _audit(self, conn: psycopg.Connection[Any]) -> dict[str, Any]:
        return {
            "outbox_rows": audit_log(conn, limit=LIST_LIMIT, schema=self.schema),
            "inbox_rows": inbox_admin.dead_audit(conn, limit=LIST_LIMIT, schema=self.schema),
        }

    async def report_of(self, run_id: uuid.UUID) -> str | None:
        """Where the report of run ``run_id`` was written, as its row says (None: nowhere)."""
        return await self.run(run_report, run_id, schema=self.schema)

    # ---- changes -------------------------------------------------------------------------

    async def change(
        self,
        decisions: Decisions,
        action: Literal["retry", "purge"],
        selected: Any,
        *,
        actor: str,
        reason: str,
        dry_run: bool,
    ) -> list[uuid.UUID]:
        """Requeue or purge what ``selected`` (a filter) selects, audited as ``actor``'s;
        the ids changed (with ``dry_run``: the ids it would change)."""
        return await self.run(
            decisions.retry if action == "retry" else decisions.purge,
            selected,
            actor=actor,
            reason=reason,
            limit=CHANGE_LIMIT,
            dry_run=dry_run,
            schema=self.schema,
        )


def _why(url: str) -> str:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return "no connection became free in time"
    except psycopg.Error as exc:
        text = redact(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
