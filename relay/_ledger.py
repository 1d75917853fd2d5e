"""'polling' mode: the relays number what the ledger holds, and their claim loops publish it.

Every writer inserts one row per message into the ledger, ``outbox_wal_pending``
(outbox/statements.sql, ``ledger_insert_one``). In 'wal' mode the streaming relay decodes those
inserts from its slot (relay/_capture.py). In 'polling' mode every relay runs a
:class:`LedgerReader`: it reads the committed rows, oldest written first, and in one
transaction per batch drops the ids that already have a row, numbers the rest per (topic, key)
with the counter rows, writes them to ``outbox_messages`` as 'pending' without a lease,
deletes their ledger rows, and takes one number of the write counter, which wakes every relay's
commit watch (relay/_watch.py): the claim loops then publish them, shared by key, as they do
retries.

One relay numbers at a time: the batch's transaction first takes the transaction-scoped form of
the capture lock (``outbox_ledger_lock``, the key of the slot's name, which a relay streaming
the slot holds in the session-level form); a relay that does not get it leaves the batch to the
one that did. Each look takes the ids of many batches in one scan and sort of the ledger (a round),
then each batch's rows by id: a backlog is read a few times, not once per batch. Nothing has to
be handed over or fenced: the lock goes with the transaction, and
a transaction that stops making progress (its relay frozen or cut off) is ended by the server
after ``lease_seconds`` idle in it (``outbox_ledger_bound``), which rolls the batch back.

The order argument: a row is read only once its transaction has committed, so a key's
messages are numbered in the order they became visible, and those that became visible between
two reads in the order they were written (``written_at``, then id), which is their commit
order whenever the key's writers serialize (docs/explanation/capture.md).

How often: at once again after a read that found rows; while reads find nothing, every
``watch_interval`` (2 ms) doubling up to ``watch_idle_interval`` (50 ms), or
``poll_interval`` for a relay without the commit watch (``watch = false``: one look a second
per database, as its claims); at once on a NOTIFY (``publish(..., wakeup=True)``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from outbox.kit import MODE_WAL
from relay._capture import (
    ROUND_BATCHES,
    batches,
    decode_rows,
    ledger_round,
    ledger_rows,
    number_batch,
    store_batch,
)
from relay._config import RelayConfig
from relay._retry import Backoff, retry
from relay._slot import default_slot
from relay._state import RunState
from relay._statements import RelayStatements

__all__ = ["LedgerReader", "record_ledger"]

log = logging.getLogger("relay")

#: how often the reader looks at the capture mode (and the lock's name) again
RECHECK_SECONDS = 1.0


async def lock_name(conn: psycopg.AsyncConnection[Any], stmts: RelayStatements) -> str | None:
    """The capture lock's name in 'polling' mode (the slot the database has, or the one
    ``outbox capture enable`` would make); None in 'wal' mode or before the migrations."""
    cur = conn.cursor(row_factory=dict_row)
    row = await (await cur.execute(stmts.capture_mode)).fetchone()
    if row is None or row["mode"] == MODE_WAL:
        return None
    if row["slot"] is not None:
        return str(row["slot"])
    named = await (await cur.execute(stmts.current_database)).fetchone()
    return default_slot(str(named["database"])) if named else None


async def record_ledger(
    conn: psycopg.AsyncConnection[Any],
    stmts: RelayStatements,
    config: RelayConfig,
    name: str | None = None,
) -> int:
    """Number and record, pending for the claim loops, what the ledger holds now, on ``conn``
    (autocommit), one transaction per batch under the lock ``name`` (default: looked up);
    return how many messages. 0 when another relay holds the lock (it numbers them) or the
    database is in 'wal' mode (the streaming relay does)."""
    if name is None:
        name = await lock_name(conn, stmts)
        if name is None:
            return 0
    limit = config.batch_size
    bound = {"ms": str(int(config.lease_seconds * 1000))}
    total = 0
    while True:
        ids = await ledger_round(conn, stmts, 0.0, limit)
        for chunk in batches(ids, limit):
            async with conn.transaction():
                cur = conn.cursor(row_factory=dict_row)
                async with conn.pipeline():
                    await conn.execute(stmts.ledger_bound, bound)
                    locking = await cur.execute(stmts.ledger_lock, {"slot": name})
                    locked = await locking.fetchone()
                if not locked or not locked["locked"]:
                    return total  # another relay is numbering
                rows = await ledger_rows(conn, stmts, chunk)  # others numbered may be gone
                if not rows:
                    continue
                batch, _ = await number_batch(conn, stmts, config, decode_rows(rows), chunk, None)
                if batch:
                    await store_batch(conn, stmts, config, batch, uuid.uuid4(), send=False)
            total += len(batch)
        if len(ids) < limit * ROUND_BATCHES:
            return total


class LedgerReader:
    """The reader of the ledger of a relay in 'polling' mode; ``run()`` until the relay stops."""

    def __init__(
        self,
        config: RelayConfig,
        pool: AsyncConnectionPool[Any],
        stmts: RelayStatements,
        state: RunState,
    ) -> None:
        self._config = config
        self._pool = pool
        self._stmts = stmts
        self._state = state
        self._name: str | None = None
        self._named_at = 0.0

    async def run(self) -> None:
        config = self._config
        idle = config.watch_idle_interval if config.watch else config.poll_interval
        wait = config.watch_interval
        backoff = Backoff(0.1, 5.0)
        while not self._state.stopping:
            self._state.ledger.clear()
            found = await retry("numbering the ledger", self._read, backoff, state=self._state)
            if found:
                wait = config.watch_interval
                continue
            await self._state.wait_for_ledger(wait)
            wait = min(wait * 2, idle)

    async def _read(self) -> int:
        """One look: number what the ledger holds (nothing in 'wal' mode)."""
        async with self._pool.connection() as conn:
            now = time.monotonic()
            if now >= self._named_at:
                self._name = await lock_name(conn, self._stmts)
                self._named_at = now + RECHECK_SECONDS
            if self._name is None:
                return 0
            recorded = await record_ledger(conn, self._stmts, self._config, self._name)
        if recorded:
            self._state.wake.set()  # this relay's claim loop has work too
        return recorded
