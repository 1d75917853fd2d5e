"""What guards a batch that a relay numbers and then sends itself: a :class:`BatchFence`.

Two relays must never number the same messages, and a relay may send a batch only while no
other relay can have taken its rows over. In 'wal' mode the guard is the capture lease (the
streaming relay's, relay/_capture_lease.py). In 'polling' mode it is :class:`LedgerFence`: the
batch's numbering transaction holds the transaction-scoped capture lock (``ledger_lock``) and
ends, by the server, after ``lease_seconds`` idle in it (``ledger_bound``); the rows it records
for sending carry a lease of ``lease_seconds``, so the sends stop before that lease can lapse
and the claim loops take them.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import psycopg
from psycopg.rows import dict_row

from relay._statements import RelayStatements

__all__ = ["BatchFence", "LedgerFence"]

#: the share of a lease a batch's sends may use (as a claim's: relay/_claim.py)
_SEND_FRACTION = 0.9


class BatchFence(Protocol):
    """The guard of one relay's numbering and sending of a batch."""

    async def enter(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """First in the batch's transaction: False when another relay numbers (leave it)."""
        ...

    async def send_check_in(self, conn: psycopg.AsyncConnection[Any]) -> Any:
        """A check sent in the numbering pipeline; its cursor, or None for none."""
        ...

    def checked_in(self, row: Any) -> None:
        """The check's row (raises when the guard is lost)."""
        ...

    def check(self) -> None:
        """Raise when the guard is lost (nothing may be committed or sent)."""
        ...

    def progress(self) -> None:
        """The batch made a step."""
        ...

    def publish_deadline(self, publish_timeout: float) -> float:
        """The monotonic time after which the batch's sends must stop."""
        ...


class LedgerFence:
    """'polling' mode's guard of one batch, under the capture lock named ``name``."""

    def __init__(self, stmts: RelayStatements, name: str, lease_seconds: float) -> None:
        self._stmts = stmts
        self._name = name
        self._bound = {"ms": str(int(lease_seconds * 1000))}
        self._lease_seconds = lease_seconds
        #: the rows' lease starts on the server no earlier than this (monotonic)
        self._started = time.monotonic()

    async def enter(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        self._started = time.monotonic()
        cur = conn.cursor(row_factory=dict_row)
        async with conn.pipeline():
            await conn.execute(self._stmts.ledger_bound, self._bound)
            locking = await cur.execute(self._stmts.ledger_lock, {"slot": self._name})
            row = await locking.fetchone()
        return bool(row and row["locked"])

    async def send_check_in(self, conn: psycopg.AsyncConnection[Any]) -> Any:
        return None  # the lock is the transaction's until it ends

    def checked_in(self, row: Any) -> None:
        return None

    def check(self) -> None:
        return None  # a session the server ended fails its next statement

    def progress(self) -> None:
        return None

    def publish_deadline(self, publish_timeout: float) -> float:
        return min(
            time.monotonic() + publish_timeout,
            self._started + self._lease_seconds * _SEND_FRACTION,
        )
