"""'polling' mode: the relays number what the ledger holds, then send it.

Every writer inserts one row per message into the ledger, ``outbox_wal_pending``
(outbox/statements.sql, ``ledger_insert_one``). In 'wal' mode the streaming relay decodes those
inserts from its slot (relay/_capture.py). In 'polling' mode every relay runs a
:class:`LedgerReader`: it reads the committed rows, oldest written first, and per batch does
what the streaming relay does with a decoded one (``WalCapture.record``): in one transaction,
flushed before anything is sent, it drops the ids that already have a row, numbers the rest per
(topic, key) with the counter rows, writes them to ``outbox_messages`` (those it is about to
send under the batch's lease) and deletes their ledger rows; then it sends them and marks what
the broker took. What it holds back (a key behind an earlier unpublished row, a delayed
message, an at-most-once topic, a refusal) is pending for the claim loops of every relay, which
the write counter wakes.

One relay numbers at a time: the batch's transaction first takes the transaction-scoped form of
the capture lock (``outbox_ledger_lock``, the key of the slot's name, which a relay streaming
the slot holds in the session-level form; relay/_fence.py); a relay that does not get it leaves
the batch to the one that did. The sends run after the commit, so one relay sends a batch while
another numbers the next: a key whose earlier message is still being sent by the first waits,
pending, for the claim loops (``capture_waiting_keys``). Each look takes the ids of many
batches in one scan and sort of the ledger (a round), then each batch's rows by id: a backlog
is read a few times, not once per batch. Nothing has to be handed over: the lock goes with the
transaction; a transaction that stops making progress (its relay frozen or cut off) is ended
by the server after ``lease_seconds`` idle in it (``outbox_ledger_bound``), which rolls the
batch back; and the sends stop before the rows' lease (``lease_seconds``) can lapse, after
which the claim loops publish them (the inbox absorbs what was sent twice).

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
    WalCapture,
    batches,
    decode_rows,
    ledger_round,
    ledger_rows,
    number_batch,
    store_batch,
)
from relay._config import RelayConfig
from relay._fence import LedgerFence
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
    capture: WalCapture | None = None,
) -> int:
    """Number and record what the ledger holds now, on ``conn`` (autocommit), one transaction
    per batch under the lock ``name`` (default: looked up); return how many messages. With
    ``capture`` (a relay's), each batch is then sent as the streaming relay sends one, and
    what it holds back is left pending; without, all of it is left pending for the claim
    loops. 0 when another relay holds the lock (it numbers them) or the database is in 'wal'
    mode (the streaming relay does)."""
    if name is None:
        name = await lock_name(conn, stmts)
        if name is None:
            return 0
    limit = config.batch_size
    total = 0
    while True:
        ids = await ledger_round(conn, stmts, 0.0, limit)
        for chunk in batches(ids, limit):
            rows = await ledger_rows(conn, stmts, chunk)  # others numbered may be gone
            if not rows:
                continue
            fence = LedgerFence(stmts, name, config.lease_seconds)
            if capture is not None:
                recorded = await capture.record(conn, fence, decode_rows(rows), chunk)
            else:
                recorded = await _number(conn, stmts, config, fence, rows, chunk)
            if recorded is None:
                return total  # another relay is numbering
            total += recorded
        if len(ids) < limit * ROUND_BATCHES:
            return total


async def _number(
    conn: psycopg.AsyncConnection[Any],
    stmts: RelayStatements,
    config: RelayConfig,
    fence: LedgerFence,
    rows: list[dict[str, Any]],
    chunk: list[uuid.UUID],
) -> int | None:
    """Number one batch and record it all pending, the write counter moved; None when the
    fence refused."""
    async with conn.transaction():
        if not await fence.enter(conn):
            return None
        batch, _ = await number_batch(conn, stmts, config, decode_rows(rows), chunk, None)
        if batch:
            await store_batch(conn, stmts, config, batch, uuid.uuid4(), send=False)
    return len(batch)


class LedgerReader:
    """The reader of the ledger of a relay in 'polling' mode; ``run()`` until the relay stops."""

    def __init__(
        self,
        config: RelayConfig,
        pool: AsyncConnectionPool[Any],
        stmts: RelayStatements,
        state: RunState,
        capture: WalCapture,
    ) -> None:
        self._capture = capture
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
            recorded = await record_ledger(
                conn, self._stmts, self._config, self._name, self._capture
            )
        if recorded:
            self._state.wake.set()  # this relay's claim loop has work too
        return recorded
