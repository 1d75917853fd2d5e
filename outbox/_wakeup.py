"""Waking relays without making business commits wait on each other.

A transaction that issues NOTIFY takes a cluster-wide lock at commit (PreCommit_Notify locks
"database 0" so queue entries appear in commit order) and holds it until its commit record is
flushed: every notifying commit in the cluster waits for the previous one's fsync, and group
commit is lost. So ``publish`` never notifies inside the caller's transaction.

Instead a per-process :class:`Doorbell` (a background thread with its own autocommit
connection) sends one ``NOTIFY`` from its own tiny transaction once the caller has committed:

* for a SQLAlchemy ``Session`` / ``AsyncSession`` an ``after_commit`` hook rings it;
* for connections without such a hook (psycopg, SQLAlchemy ``Connection``) ``publish`` hands it
  the writing transaction's id (``tx_id``, an xid8) and the doorbell checks, for all watched
  transactions in one statement, whether they have ended (``pg_xact_status``), notifying if
  any committed.

When it checks. ``publish`` runs inside the caller's open transaction, so the commit comes only
after it returns: checking at once would almost always find the transaction in progress. The
doorbell keeps, per watched transaction, when it was first rung, and first checks it MIN (2 ms)
later. While it stays open it is due again at ages of 4, 8, 16, 32 and 64 ms (its age doubles
from check to check), then every MAX (50 ms). A ring from a commit hook (the commit already
happened) is due at once. The next check is the earliest one due, and never within MIN of the
previous one: rings coalesce, one check per MIN at most however many arrive. Each check covers
every watched transaction, due or not; one checked early that way keeps its own schedule. The
backoff belongs to each transaction, so a new writer never waits for the backoff of an old one
that stays open; and a ring wakes the thread only if it brings the next check forward, so a
busy producer does not wake it on every publish.

What that guarantees. After a check that finds a transaction open at age ``a`` (time since the
ring of its first ``publish``), the next check starts within ``max(MIN, min(a, MAX))``; the first
starts within MIN of the ring. Let the transaction commit at age ``c``: the last check that
found it open had ``a <= c``, so the check that sees the commit, and sends the NOTIFY, starts
at most ``max(MIN, min(c, MAX))`` after the commit (plus thread scheduling, and a previous
check still running). That is at most MIN for a transaction that commits within MIN of
``publish``, at most about as long again as it stayed open after ``publish`` for a longer one,
and never more than MAX.

NOTIFY gives its transaction an xid, so even the doorbell's tiny transaction writes a commit
record; the doorbell's session runs with ``synchronous_commit = off`` so that commit never
waits for a WAL flush (a notification has nothing to make durable) and the lock is held for
microseconds, never while a business commit flushes. Rings coalesce: many commits, one
notification. A rolled-back transaction rings nothing.

Neither way depends on the caller's driver: an ``AsyncSession`` or ``AsyncConnection`` on
asyncpg rings the same doorbell (its psycopg session connects to the engine's database), so
asyncpg writers do not notify inside their transaction either.

The doorbell is best effort by design: if it cannot connect, messages are not lost, the
relay's fallback poll picks them up a little later.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from outbox._statements import WAKEUP_CHANNEL, doorbell_statements

__all__ = ["Doorbell", "doorbell_for", "ring_after_commit"]

log = logging.getLogger("outbox.wakeup")

_MIN_POLL = 0.002  # first check after a ring, and the least time between two checks
_MAX_POLL = 0.05  # the most time between two checks of a transaction that stays open
_COMMITTED = "committed"  # marker for rings that come after a known commit
_BUSY = -math.inf  # planned check while the thread checks: it re-plans before it sleeps
_IDLE = math.inf  # planned check while nothing is watched


class Doorbell:
    """Sends one NOTIFY on ``channel`` once any of the rung transactions has committed."""

    def __init__(self, conninfo: str, channel: str = WAKEUP_CHANNEL) -> None:
        self.conninfo = conninfo
        self.channel = channel
        self.notifications_sent = 0
        self.checks = 0  # statements run to settle watched transactions
        # Guarded by _cond: watched xid -> (monotonic time first rung, next check due).
        self._watch: dict[str, tuple[float, float]] = {}
        self._last = -math.inf  # start of the last check
        self._planned = _IDLE  # when the sleeping thread means to check next
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="outbox-doorbell", daemon=True)
        self._thread.start()

    def ring(self, tx_ids: Iterable[str]) -> None:
        """Note transactions to watch. Thread-safe, never blocks on I/O, never raises."""
        now = time.monotonic()
        with self._cond:
            due = math.inf
            for tx in tx_ids:
                if tx == _COMMITTED:
                    # Already committed: due at once. Re-rung during a check, it is kept for
                    # the next one (that commit may come after the check's NOTIFY).
                    self._watch[tx] = (now, now)
                    due = now
                elif tx not in self._watch:
                    # The caller commits after publish returns: checking now would be wasted.
                    self._watch[tx] = (now, now + _MIN_POLL)
                    due = min(due, now + _MIN_POLL)
            # Coalesce: never two checks within _MIN_POLL. Wake the thread only if this ring
            # brings its next check forward, so a busy producer does not wake it per publish.
            due = max(due, self._last + _MIN_POLL)
            if due < self._planned:
                self._planned = due
                self._cond.notify_all()

    def ring_committed(self) -> None:
        """A transaction that wrote messages has just committed: notify without checking."""
        self.ring([_COMMITTED])

    def pending(self) -> int:
        """How many rung transactions are still being watched."""
        with self._cond:
            return len(self._watch)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no rung transaction is being watched; True if idle."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._watch, timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def cadence(self) -> float:
        """Seconds until the next planned check.

        At most ``_MIN_POLL`` right after a new transaction is rung, up to ``_MAX_POLL`` while
        only long-open ones are watched; 0 while a check runs, ``inf`` while none is watched.
        """
        with self._cond:
            return max(self._planned - time.monotonic(), 0.0)

    def close(self, timeout: float = 2.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # notify() might wake a wait_idle() caller instead
        self._thread.join(timeout)

    def connect(self) -> psycopg.Connection[Any]:
        """The doorbell's own session: autocommit, and commits that wait for no WAL flush."""
        conn = psycopg.connect(self.conninfo, autocommit=True)
        # The NOTIFY commit record needs no flush: see the module docstring.
        conn.execute(_STATEMENTS.doorbell_session)
        return conn

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while (due := self._await_due()) is not None:
            watched, started = due
            try:
                if conn is None or conn.closed:
                    conn = self.connect()
                finished = self._settle(conn, watched)
            except psycopg.Error as exc:
                log.warning("outbox doorbell cannot reach the database: %s", exc)
                conn = None
                finished = watched  # best effort: the relay's fallback poll covers it
                self._sleep_until(time.monotonic() + _MAX_POLL * 20)
            self._finish(watched, finished, started)
        if conn is not None:
            conn.close()

    def _await_due(self) -> tuple[list[str], float] | None:
        """Sleep until a check is due; what to check and when it started, or None if closed."""
        with self._cond:
            while not self._closed:
                planned = self._plan()
                now = time.monotonic()
                if planned <= now:
                    self._planned = _BUSY  # rings need not wake us: we re-plan after the check
                    self._last = now
                    self.checks += 1
                    return list(self._watch), now  # one statement checks all, due or not
                self._planned = planned
                self._cond.wait(None if planned == _IDLE else planned - now)
            return None

    def _plan(self) -> float:
        """The earliest due check, at least _MIN_POLL after the last one; _IDLE if none."""
        if not self._watch:
            return _IDLE
        return max(min(due for _, due in self._watch.values()), self._last + _MIN_POLL)

    def _finish(self, watched: list[str], finished: list[str], started: float) -> None:
        """Forget what ended; schedule what is still open by how long it has been watched."""
        done = set(finished)
        with self._cond:
            for tx in watched:
                rung, due = self._watch[tx]
                if tx not in done:
                    self._watch[tx] = (rung, _next_due(rung, due, started))
                elif tx != _COMMITTED or rung <= started:
                    # (A commit hook that rang again during the check may have committed after
                    # its NOTIFY: that ring stays for the next check.)
                    del self._watch[tx]
            self._cond.notify_all()  # wait_idle()

    def _settle(self, conn: psycopg.Connection[Any], watched: list[str]) -> list[str]:
        committed = _COMMITTED in watched
        xids = [x for x in watched if x != _COMMITTED]
        # One round trip: which watched transactions ended, and NOTIFY if one committed (or a
        # commit hook already told us so). Its commit does not wait for a WAL flush.
        params = (xids, self.channel, committed)
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(_STATEMENTS.doorbell_settle, params).fetchone()
        assert row is not None
        done, notified = row["done"], row["notified"]
        if notified:
            self.notifications_sent += 1
        return [*done, _COMMITTED] if committed else list(done)

    def _sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline``; only close() cuts it short (rings do not)."""
        with self._cond:
            while not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)


def _next_due(rung: float, due: float, started: float) -> float:
    """When to check again a transaction rung at ``rung`` and due at ``due`` that the check
    started at ``started`` found open."""
    if started < due:  # checked early, along with others: its own check is still to come
        return due
    # Its age doubles from check to check (2, 4, 8 ... ms), but never more than MAX passes;
    # counted from when it was due, so a check that starts a little late delays no other.
    nxt = due + _gap(due - rung)
    # A check so late that the next is missed too (a stalled thread): go on from its age.
    return nxt if nxt > started else started + _gap(started - rung)


def _gap(age: float) -> float:
    return min(max(age, _MIN_POLL), _MAX_POLL)


_STATEMENTS = doorbell_statements(None)

_lock = threading.Lock()
_doorbells: dict[str, Doorbell] = {}
_by_connection: weakref.WeakKeyDictionary[Any, Doorbell] = weakref.WeakKeyDictionary()


def _conninfo(raw: Any) -> str:
    own = getattr(raw, "conninfo", None)  # outbox._asyncpg.AsyncpgConnection: its engine's
    if isinstance(own, str):
        return own
    params = raw.info.get_parameters()
    password = raw.info.password
    if password:
        params["password"] = password
    return make_conninfo("", **params)


def doorbell_for(raw: Any) -> Doorbell:
    """The process's doorbell for the database ``raw`` is connected to (a psycopg connection,
    or an asyncpg one wrapped by ``outbox._asyncpg``: the doorbell itself always uses psycopg)."""
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


def ring_after_commit(target: Any, raw: Any, tx_ids: Iterable[str]) -> None:
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
