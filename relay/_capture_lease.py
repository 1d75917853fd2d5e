"""The streaming relay's lease on its replication slot (``outbox_capture_lease``).

One relay of a group streams the slot: the holder of the capture lock (``outbox_capture_lock``).
The lock alone ends only with the holder's connection, so a holder that is alive but frozen
(SIGSTOP, a VM pause, a stuck event loop) would keep the slot until it woke. Hence a lease, as
the polling relays have on their claims:

* the holder writes the lease row with a new epoch on its lock session, and records every
  batch on that same session, so ending the session rolls back an open batch, frees the
  counter rows it locked and releases the lock;
* it heartbeats every quarter lease (:meth:`CaptureLease.heartbeat`, a task on the event loop
  that does the work: a loop that is stuck heartbeats no more), on the server's clock;
* a standby that cannot take the lock and finds the heartbeat older than the holder's lease
  terminates the holder's sessions (the lock's and the walsender's), takes the lock, ends any
  walsender still on the slot and streams from the slot's confirmed position;
* the heartbeat is a watchdog too: it renews the lease only while the capture loop shows
  progress (:meth:`CaptureLease.progress`, marked by every step of the loop). A loop stuck for
  a whole lease (an await that never returns, a cancelled task that does not end) ends its
  own lease: the heartbeat terminates the lease's sessions (``outbox_capture_lease_resign``),
  which releases the lock at once, and cancels the stuck round; a heartbeat that cannot renew
  lets the lease lapse, and a standby takes over;
* the holder checks the lease before it sends a batch, in the batch's transaction before it
  records it, and before it confirms a position to the slot: a holder that wakes up after a
  takeover finds its sessions gone, its batch rolled back, and what it had sent is sent again
  by the new holder with the same ids and seqs (the inbox absorbs the repeats). Its old
  walsender is gone, and the slot has taken a new one, so it cannot confirm a position.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from relay._statements import RelayStatements
from relay.exceptions import CaptureLeaseLostError

__all__ = ["CaptureLease", "fence_lapsed_holder", "standby_interval"]

log = logging.getLogger("relay")

#: a heartbeat every this fraction of the lease: three may fail before it lapses
_BEAT_FRACTION = 0.25
#: the holder stops sending and recording once its last heartbeat is this fraction of the
#: lease old (a standby may take over at the full lease)
_VALID_FRACTION = 0.9
#: the watchdog ends the lease once the capture loop has shown no progress for this fraction
#: of the lease (no step of a working loop waits longer: a send's deadline is within 90 % of
#: the lease, and a stream read waits half a second)
_STALL_FRACTION = 1.0


def standby_interval(lease_seconds: float) -> float:
    """How often a standby looks at the lock and the holder's heartbeat: a takeover follows a
    lapsed lease within this (plus the takeover itself)."""
    return min(0.25, max(lease_seconds / 10, 0.02))


class CaptureLease:
    """This relay's lease on ``slot``, from :meth:`take` until it is lost or given up."""

    def __init__(
        self, stmts: RelayStatements, slot: str, holder: str, lease_seconds: float
    ) -> None:
        self._stmts = stmts
        self.slot = slot
        self.holder = holder
        self.lease_seconds = lease_seconds
        self.epoch = 0
        #: monotonic time the last successful heartbeat was sent (the lease runs from there)
        self._renewed = 0.0
        #: why the lease is lost (None: held)
        self.lost: str | None = None
        #: monotonic time the capture loop last showed progress (the watchdog reads it)
        self._progress = time.monotonic()
        #: the watchdog ended the lease: the loop was stuck
        self.stalled = False

    async def enter(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """A batch's transaction starts (the lock is this relay's while the lease holds: the
        numbering pipeline checks it, :meth:`send_check_in`)."""
        return True

    def progress(self) -> None:
        """The capture loop made a step: the heartbeat may renew the lease."""
        self._progress = time.monotonic()

    async def take(self, lock: psycopg.AsyncConnection[Any]) -> None:
        """Write the lease with a new epoch, on the lock's session (the lock is held)."""
        sent = time.monotonic()
        params = {"slot": self.slot, "holder": self.holder, "lease_seconds": self.lease_seconds}
        cur = lock.cursor(row_factory=dict_row)
        row = await (await cur.execute(self._stmts.capture_lease_take, params)).fetchone()
        assert row is not None  # an upsert returns its row
        self.epoch = int(row["epoch"])
        self._renewed = sent

    async def streaming(self, lock: psycopg.AsyncConnection[Any], stream_pid: int) -> None:
        """Name the walsender in the lease."""
        sent = time.monotonic()
        params = {"slot": self.slot, "epoch": self.epoch, "stream_pid": stream_pid}
        row = await (await lock.execute(self._stmts.capture_lease_stream, params)).fetchone()
        self._renewed = sent
        if row is None:
            self._lose("the lease was taken over while the stream started")

    def check(self) -> None:
        """Raise :class:`CaptureLeaseLostError` unless the lease is surely still ours: not taken
        over, and renewed recently enough that no standby can have taken it over yet."""
        if self.lost is None:
            silent = time.monotonic() - self._renewed
            if silent > self.lease_seconds * _VALID_FRACTION:
                self._lose(
                    f"no heartbeat for {silent:.1f}s (lease {self.lease_seconds:g}s): a "
                    "standby may have taken the slot over"
                )
        if self.lost is not None:
            raise CaptureLeaseLostError(self.lost)

    async def check_in(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """:meth:`check`, and in ``conn``'s transaction (the lock's session, where batches are
        recorded) that the lease row still names this epoch and this session."""
        cur = await self.send_check_in(conn)
        self.checked_in(await cur.fetchone())

    async def send_check_in(self, conn: psycopg.AsyncConnection[Any]) -> Any:
        """:meth:`check_in` in two steps, for a pipeline: send the check (after :meth:`check`)
        and return its cursor; :meth:`checked_in` takes its row."""
        self.check()
        params = {"slot": self.slot, "epoch": self.epoch}
        return await conn.execute(self._stmts.capture_lease_check, params)

    def checked_in(self, row: Any) -> None:
        if row is None:
            self._lose("the lease row names another holder")
            self.check()

    def publish_deadline(self, publish_timeout: float) -> float:
        """The monotonic time after which a batch's sends must stop: the lease may lapse."""
        return min(
            time.monotonic() + publish_timeout,
            self._renewed + self.lease_seconds * _VALID_FRACTION,
        )

    async def heartbeat(
        self, pool: AsyncConnectionPool[Any], on_stall: Callable[[], None] | None = None
    ) -> None:
        """Renew the lease every quarter lease while the capture loop makes progress, until
        the lease is lost (then return). A failed heartbeat is retried at the next beat;
        :meth:`check` notices when they fail too long. A loop that made no progress for a
        whole lease is stuck: the lease is ended (its sessions terminated, so the lock is released
        and a standby takes over at once) and ``on_stall`` is called (it cancels the round)."""
        interval = self.lease_seconds * _BEAT_FRACTION
        params = {"slot": self.slot, "epoch": self.epoch}
        while self.lost is None:
            await asyncio.sleep(interval)
            stalled = time.monotonic() - self._progress
            if stalled > self.lease_seconds * _STALL_FRACTION:
                self.stalled = True
                self._lose(f"the capture loop made no progress for {stalled:.1f}s")
                await self._resign(pool, params, interval)
                if on_stall is not None:
                    on_stall()
                return
            sent = time.monotonic()
            try:
                async with asyncio.timeout(interval):
                    async with pool.connection(timeout=interval) as conn:
                        cur = await conn.execute(self._stmts.capture_lease_beat, params)
                        row = await cur.fetchone()
            except Exception as exc:
                log.warning("relay: capture lease heartbeat failed (%s)", exc)
                continue
            if row is None:
                self._lose("a standby took the slot over")
                return
            self._renewed = max(self._renewed, sent)

    async def _resign(
        self, pool: AsyncConnectionPool[Any], params: dict[str, Any], within: float
    ) -> None:
        """End this lease's sessions from another connection (the lock is released at once);
        if that fails, the lease lapses by itself (no more heartbeats) and a standby fences."""
        try:
            async with asyncio.timeout(within):
                async with pool.connection(timeout=within) as conn:
                    await conn.execute(self._stmts.capture_lease_resign, params)
        except Exception as exc:
            log.warning(
                "relay: could not end the stuck capture lease's sessions (%s); it lapses in %gs",
                exc,
                self.lease_seconds,
            )

    def _lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            log.warning(
                "relay %s: lost the capture lease on slot %s (%s); standing by",
                self.holder,
                self.slot,
                reason,
            )


async def fence_lapsed_holder(
    lock: psycopg.AsyncConnection[Any], stmts: RelayStatements, slot: str
) -> bool:
    """Terminate the sessions of a holder whose lease lapsed; True when one was terminated
    (the lock is free, or about to be: try it again now)."""
    try:
        cur = await lock.cursor(row_factory=dict_row).execute(
            stmts.capture_lease_fence, {"slot": slot}
        )
        rows = await cur.fetchall()
    except psycopg.errors.InsufficientPrivilege as exc:
        log.error(
            "relay: the capture holder's lease on slot %s lapsed, but this relay may not end "
            "its sessions (%s): run every relay of a database as the same role (or grant this "
            "role membership in the holder's role)",
            slot,
            str(exc).strip(),
        )
        return False
    ended = [int(row["pid"]) for row in rows if row["terminated"]]
    holder = rows[0]["holder"] if rows else None
    if ended:
        log.warning(
            "relay: the capture lease of relay %s on slot %s lapsed: terminated its sessions "
            "(pids %s) to take the slot over",
            holder,
            slot,
            ", ".join(map(str, ended)),
        )
    return bool(ended)
