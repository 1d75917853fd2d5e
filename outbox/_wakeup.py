"""Waking relays without making business commits wait on each other.

A transaction that issues NOTIFY takes a cluster-wide lock at commit (PreCommit_Notify locks
"database 0" so queue entries appear in commit order) and holds it until its commit record is
flushed: every notifying commit in the cluster waits for the previous one's fsync, and group
commit is lost. So ``publish`` never notifies inside the caller's transaction.

Instead a per-process :class:`Doorbell` (a background thread with its own autocommit
connection) sends one ``NOTIFY`` from its own tiny transaction once the caller has committed:

* for a SQLAlchemy ``Session`` / ``AsyncSession`` an ``after_commit`` hook rings it;
* for connections without such a hook (psycopg, SQLAlchemy ``Connection``) ``publish`` hands it
  the writing transaction's id (``tx_id``, an xid8) and the doorbell checks, every few
  milliseconds and for all watched transactions in one statement, whether they have ended
  (``pg_xact_status``), notifying if any committed.

NOTIFY gives its transaction an xid, so even the doorbell's tiny transaction writes a commit
record; the doorbell's session runs with ``synchronous_commit = off`` so that commit never
waits for a WAL flush (a notification has nothing to make durable) and the lock is held for
microseconds, never while a business commit flushes. Rings coalesce: many commits, one
notification. A rolled-back transaction rings nothing.

The doorbell is best effort by design: if it cannot connect, messages are not lost, the
relay's fallback poll picks them up a little later.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from outbox._statements import WAKEUP_CHANNEL

__all__ = ["Doorbell", "doorbell_for", "ring_after_commit"]

log = logging.getLogger("outbox.wakeup")

_MIN_POLL = 0.002  # cadence of the xid check: bounds the added wake-up latency
_MAX_POLL = 0.05  # backoff while the watched transactions stay open
_COMMITTED = "committed"  # marker for rings that come after a known commit


class Doorbell:
    """Sends one NOTIFY on ``channel`` once any of the rung transactions has committed."""

    def __init__(self, conninfo: str, channel: str = WAKEUP_CHANNEL) -> None:
        self.conninfo = conninfo
        self.channel = channel
        self.notifications_sent = 0
        self._pending: set[str] = set()
        self._poll = _MIN_POLL  # current cadence; guarded by _cond
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="outbox-doorbell", daemon=True)
        self._thread.start()

    def ring(self, tx_ids: Iterable[str]) -> None:
        """Note transactions to watch. Thread-safe, never blocks on I/O, never raises."""
        with self._cond:
            idle = not self._pending
            fresh = not self._pending.issuperset(tx_ids)
            self._pending.update(tx_ids)
            if fresh and self._poll > _MIN_POLL:
                # Backed off because some old transaction stays open: a new writer must not
                # wait for that backoff. Back to the short cadence, and cut the sleep short.
                self._poll = _MIN_POLL
                self._cond.notify_all()
            elif idle:  # an idle doorbell needs waking; a busy one sees the set next check
                self._cond.notify_all()

    def ring_committed(self) -> None:
        """A transaction that wrote messages has just committed: notify without checking."""
        self.ring([_COMMITTED])

    def pending(self) -> int:
        """How many rung transactions are still being watched."""
        with self._cond:
            return len(self._pending)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no rung transaction is being watched; True if idle."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def cadence(self) -> float:
        """Seconds between checks right now: short, or backed off while writers stay open."""
        with self._cond:
            return self._poll

    def close(self, timeout: float = 2.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def connect(self) -> psycopg.Connection[Any]:
        """The doorbell's own session: autocommit, and commits that wait for no WAL flush."""
        conn = psycopg.connect(self.conninfo, autocommit=True)
        # The NOTIFY commit record needs no flush: see the module docstring.
        conn.execute("SET synchronous_commit = off")
        return conn

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        last = 0.0
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    break
            # Coalesce: at most one check per cadence, however many rings arrive meanwhile.
            self._sleep_cadence(last)
            last = time.monotonic()
            with self._cond:
                watched = list(self._pending)
            try:
                if conn is None or conn.closed:
                    conn = self.connect()
                finished = self._settle(conn, watched)
            except psycopg.Error as exc:
                log.warning("outbox doorbell cannot reach the database: %s", exc)
                conn = None
                finished = watched  # best effort: the relay's fallback poll covers it
                self._sleep_until(time.monotonic() + _MAX_POLL * 20)
            with self._cond:
                self._pending.difference_update(finished)
                self._cond.notify_all()
                # Progress (or nothing left): keep the short cadence. Only transactions that
                # stay open with nothing else settling make it back off (see ring()).
                progress = bool(finished) or not self._pending
                self._poll = _MIN_POLL if progress else min(self._poll * 2, _MAX_POLL)
        if conn is not None:
            conn.close()

    def _settle(self, conn: psycopg.Connection[Any], watched: list[str]) -> list[str]:
        committed = _COMMITTED in watched
        xids = [x for x in watched if x != _COMMITTED]
        # One round trip: which watched transactions ended, and NOTIFY if one committed (or a
        # commit hook already told us so). Its commit does not wait for a WAL flush.
        row = conn.execute(_SETTLE, [xids, self.channel, committed]).fetchone()
        assert row is not None
        done, notified = row
        if notified:
            self.notifications_sent += 1
        return [*done, _COMMITTED] if committed else list(done)

    def _sleep_cadence(self, last: float) -> None:
        """Sleep until one cadence after ``last``; a ring that resets the cadence cuts it."""
        with self._cond:
            while not self._closed:
                remaining = last + self._poll - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)

    def _sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline``; only close() cuts it short (rings do not)."""
        with self._cond:
            while not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)


# outbox_doorbell_settle: statuses of the watched xids; pg_notify runs only if one committed.
_SETTLE = """
WITH s AS (SELECT x::text AS x, pg_xact_status(x) AS st FROM unnest(%s::xid8[]) AS x),
n AS (
    SELECT pg_notify(%s, '') AS sent
    WHERE %s OR EXISTS (SELECT 1 FROM s WHERE st = 'committed')
)
SELECT coalesce(array_agg(x) FILTER (WHERE st IS DISTINCT FROM 'in progress'), '{}'),
       EXISTS (SELECT 1 FROM n)
FROM s
"""

_lock = threading.Lock()
_doorbells: dict[str, Doorbell] = {}
_by_connection: weakref.WeakKeyDictionary[Any, Doorbell] = weakref.WeakKeyDictionary()


def _conninfo(raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> str:
    params = raw.info.get_parameters()
    password = raw.info.password
    if password:
        params["password"] = password
    return make_conninfo("", **params)


def doorbell_for(raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Doorbell:
    """The process's doorbell for the database ``raw`` is connected to."""
    bell = _by_connection.get(raw)
    if bell is not None and not bell.closed:
        return bell
    key = _conninfo(raw)  # a few hundred microseconds: once per connection, not per publish
    with _lock:
        bell = _doorbells.get(key)
        if bell is None or bell.closed:
            bell = _doorbells[key] = Doorbell(key)
        _by_connection[raw] = bell
        return bell


_ARMED = "outbox.wakeup_armed"


def _session_of(target: Any) -> Any:
    """The ORM Session behind ``target`` (AsyncSession wraps one), or None."""
    try:
        from sqlalchemy.orm import Session
    except ImportError:  # pragma: no cover
        return None
    session = getattr(target, "sync_session", target)
    return session if isinstance(session, Session) else None


def _arm_session(session: Any, bell: Doorbell) -> None:
    """Ring ``bell`` from the session's after_commit hook, once per transaction."""
    from sqlalchemy import event

    if session.info.get(_ARMED):
        return
    session.info[_ARMED] = True

    def committed(sess: Any) -> None:
        sess.info.pop(_ARMED, None)
        bell.ring_committed()

    # A rolled-back transaction leaves the hook armed: the next commit rings (one spare wake-up).
    event.listen(session, "after_commit", committed, once=True)


def ring_after_commit(
    target: Any, raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], tx_ids: Iterable[str]
) -> None:
    """Wake relays once the caller's transaction (writer of ``tx_ids``) has committed."""
    try:
        bell = doorbell_for(raw)
        session = _session_of(target)
        if session is not None:
            _arm_session(session, bell)
        else:
            bell.ring(tx_ids)
    except Exception:  # a wake-up must never fail the business transaction
        log.exception("outbox doorbell failed; relays will find the message by polling")


def _close_all() -> None:
    with _lock:
        bells = list(_doorbells.values())
        _doorbells.clear()
        _by_connection.clear()
    for bell in bells:
        bell.close()


def _forget_after_fork() -> None:
    # The parent's threads do not exist in a forked child; start afresh there.
    global _lock
    _lock = threading.Lock()
    _doorbells.clear()
    _by_connection.clear()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forget_after_fork)
