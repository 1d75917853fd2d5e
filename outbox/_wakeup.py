"""Waking relays without making business commits wait on each other.

A transaction that issues NOTIFY takes a cluster-wide lock at commit (PreCommit_Notify locks
"database 0" so queue entries appear in commit order) and holds it until its commit record is
flushed: every notifying commit in the cluster waits for the previous one's fsync, and group
commit is lost. So ``publish`` never notifies inside the caller's transaction.

Instead it hands the writing transaction's id (``tx_id``, an xid8) to a per-process
:class:`Doorbell`. A background thread with its own autocommit connection waits until those
transactions have ended (``pg_xact_status``), and if any committed, sends one ``NOTIFY`` from its
own tiny transaction. That transaction has no xid and writes no WAL, so it holds the lock only
for microseconds and never while a business commit flushes. Rings coalesce: many commits, one
notification. A rolled-back transaction rings nothing.

The doorbell is best effort by design: if it cannot connect, messages are not lost, the
relay's fallback poll picks them up a little later.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from outbox._statements import WAKEUP_CHANNEL

__all__ = ["Doorbell", "doorbell_for", "ring_after_commit"]

log = logging.getLogger("outbox.wakeup")

_MIN_POLL = 0.0005
_MAX_POLL = 0.05


class Doorbell:
    """Sends one NOTIFY on ``channel`` once any of the rung transactions has committed."""

    def __init__(self, conninfo: str, channel: str = WAKEUP_CHANNEL) -> None:
        self.conninfo = conninfo
        self.channel = channel
        self.notifications_sent = 0
        self._pending: set[str] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="outbox-doorbell", daemon=True)
        self._thread.start()

    def ring(self, tx_ids: Iterable[str]) -> None:
        """Note transactions to watch. Thread-safe, never blocks on I/O, never raises."""
        with self._cond:
            self._pending.update(tx_ids)
            self._cond.notify()

    def close(self, timeout: float = 2.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        poll = _MIN_POLL
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    break
                watched = list(self._pending)
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.conninfo, autocommit=True)
                finished = self._settle(conn, watched)
            except psycopg.Error as exc:
                log.warning("outbox doorbell cannot reach the database: %s", exc)
                conn = None
                finished = watched  # best effort: the relay's fallback poll covers it
                self._wait(_MAX_POLL * 20)
            with self._cond:
                self._pending.difference_update(finished)
                more = bool(self._pending)
            if len(finished) < len(watched) and more:
                self._wait(poll)  # some writers are still open: look again soon
                poll = min(poll * 2, _MAX_POLL)
            else:
                poll = _MIN_POLL
        if conn is not None:
            conn.close()

    def _settle(self, conn: psycopg.Connection[Any], watched: list[str]) -> list[str]:
        rows = conn.execute(
            "SELECT x::text, pg_xact_status(x) FROM unnest(%s::xid8[]) AS x", [watched]
        ).fetchall()
        finished = [x for x, status in rows if status != "in progress"]
        if any(status == "committed" for _, status in rows):
            conn.execute("SELECT pg_notify(%s, '')", [self.channel])
            self.notifications_sent += 1
        return finished

    def _wait(self, seconds: float) -> None:
        with self._cond:
            if not self._closed:
                self._cond.wait(seconds)


_lock = threading.Lock()
_doorbells: dict[str, Doorbell] = {}


def _conninfo(raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> str:
    params = raw.info.get_parameters()
    password = raw.info.password
    if password:
        params["password"] = password
    return make_conninfo("", **params)


def doorbell_for(raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Doorbell:
    """The process's doorbell for the database ``raw`` is connected to."""
    key = _conninfo(raw)
    with _lock:
        bell = _doorbells.get(key)
        if bell is None:
            bell = _doorbells[key] = Doorbell(key)
        return bell


def ring_after_commit(
    raw: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], tx_ids: Iterable[str]
) -> None:
    """Wake relays once the transactions ``tx_ids`` have committed."""
    try:
        doorbell_for(raw).ring(tx_ids)
    except Exception:  # a wake-up must never fail the business transaction
        log.exception("outbox doorbell failed; relays will find the message by polling")


def _close_all() -> None:
    with _lock:
        bells = list(_doorbells.values())
        _doorbells.clear()
    for bell in bells:
        bell.close()


def _forget_after_fork() -> None:
    # The parent's threads do not exist in a forked child; start afresh there.
    global _lock
    _lock = threading.Lock()
    _doorbells.clear()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forget_after_fork)
