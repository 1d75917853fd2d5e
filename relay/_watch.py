"""The commit watch: a polling relay sees new messages commit without any help from the writer.

Writers in 'polling' mode take one number from the ``outbox_write_counter`` sequence in the
statement that writes their rows, after the rows (so their transaction already has an id). The
watch reads, in one statement on its own connection: the server's snapshot (taken as the
statement starts), then the counter, then the next transaction id to be assigned (``age`` of a
fixed xid: the server's transaction counter, read without taking an id). In a snapshot every
id below its ``xmax`` that is not listed as running has ended; ids from ``xmax`` on may be
running or not yet assigned.

When the counter moved since the last reading, a writer bumped it, and that writer's id is
below the next id read after the counter. Every id below that bound that had not ended at the
snapshot is a *candidate*: the ids listed as running, and the range from ``xmax`` to the bound.
The watch wakes the claim loop

* when the counter moved and anything ended since the previous reading (the writer may have
  committed before this reading's snapshot), and
* when a candidate has ended: it left the running list, or ``xmax`` passed it without listing
  it. Candidates that ``xmax`` passes while they still run join the listed ones.

Why nothing is missed. Let writer X get its id, bump at ``n``, commit at ``c``. Let reading k be
the first whose counter read comes after ``n``: X's id is below the bound of reading k. If X
ended before reading k's snapshot, it ended after reading k-1's (whose counter read came
before ``n``), so something ended since: a wake at k. Otherwise X is a candidate, and the first
reading whose snapshot comes after ``c`` sees it ended: a wake then. A wake can be spurious (the
ended transaction was someone else's, or rolled back): the claim then finds nothing, which is
cheap. Nothing here is ever the only way: the claim loop's ``poll_interval`` still polls, and
the LISTEN connection still takes NOTIFYs (``publish(..., wakeup=True)``).

What it costs. The writer: one ``nextval`` in a statement it runs anyway (no round trip, no
lock, no NOTIFY, no thread). The relay: one small statement per reading, every
``watch_interval`` (2 ms) while writers are active, backing off (doubling) to
``watch_idle_interval`` (50 ms) while nothing moves: about 20 tiny statements a second when idle.
The wait from a commit to the wake-up is at most the current interval: a few milliseconds while
messages flow, up to ``watch_idle_interval`` for the first one after a quiet spell (or after a
transaction that stayed open that long after publishing).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from relay._connection import keep_connected
from relay._retry import Backoff
from relay._state import RunState
from relay._statements import RelayStatements

__all__ = ["CommitWatch", "Snapshot", "WatchState", "next_xid"]


@dataclass(frozen=True)
class Snapshot:
    """The part of ``pg_current_snapshot()`` the watch uses: ``xmax`` (every id below it that is
    not listed has ended) and the ids below it still running."""

    xmax: int
    running: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        """From the text form ``xmin:xmax:xip,xip,...`` (xid8: no wraparound)."""
        try:
            _, xmax, xip = text.split(":")
            running = frozenset(int(x) for x in xip.split(",") if x)
            return cls(int(xmax), running)
        except ValueError as exc:
            raise ValueError(f"not a pg_snapshot: {text!r}") from exc


class WatchState:
    """Decides from successive readings (counter, snapshot, next id) when to wake the claim
    loop."""

    __slots__ = ("_counter", "_last", "_listed", "_range")

    def __init__(self) -> None:
        self._counter: object = None
        self._last: Snapshot | None = None
        #: candidates known to be running (below some reading's xmax)
        self._listed: set[int] = set()
        #: candidates at or above the last xmax: [lo, hi), status unknown
        self._range = (0, 0)

    @property
    def candidates(self) -> tuple[frozenset[int], tuple[int, int]]:
        """The running transactions that may have written, and the id range still unknown."""
        return frozenset(self._listed), self._range

    def observe(self, counter: object, snap: Snapshot, next_xid: int) -> tuple[bool, bool]:
        """Take one reading; return (wake the claim loop, writers were active)."""
        last = self._last
        moved = last is None or counter != self._counter
        # Anything ended between the two snapshots: xmax moved, or a listed id left.
        ended = last is None or snap.xmax > last.xmax or bool(last.running - snap.running)
        wake = moved and ended
        # Candidates that ended: listed ones no longer running, range ids xmax passed unlisted.
        if self._listed - snap.running:
            wake = True
        self._listed &= snap.running
        lo, hi = self._range
        passed = min(hi, snap.xmax)
        if passed > lo:
            running = {x for x in snap.running if lo <= x < passed}
            wake = wake or len(running) < passed - lo
            self._listed |= running
            lo = passed
        if moved:  # a writer bumped: everything not ended below the next id may be it
            self._listed |= snap.running
            lo, hi = (snap.xmax, next_xid) if lo >= hi else (lo, max(hi, next_xid))
        self._range = (lo, hi) if lo < hi else (0, 0)
        self._counter, self._last = counter, snap
        return wake, moved or wake


def next_xid(xmax: int, counter32: int) -> int:
    """The full (64-bit) id of the 32-bit transaction counter, from a snapshot's xmax taken
    just before it (the counter is at or above xmax, by less than 2**31)."""
    return xmax + ((counter32 - xmax) % 2**32)


class CommitWatch:
    """Runs the readings on a connection of its own; reconnects with backoff."""

    def __init__(
        self,
        dsn: str,
        stmts: RelayStatements,
        state: RunState,
        *,
        interval: float,
        idle_interval: float,
        bound: float,
    ) -> None:
        self._dsn = dsn
        self._stmts = stmts
        self._state = state
        self._interval = interval
        self._idle = idle_interval
        self._bound = bound
        #: readings taken (tests and metrics read it)
        self.readings = 0

    async def run(self) -> None:
        await keep_connected(self._dsn, self._state, self._bound, "commit watch", self._watch)

    async def _watch(self, conn: psycopg.AsyncConnection[Any], backoff: Backoff) -> None:
        backoff.succeeded()
        state = self._state
        watch = WatchState()
        interval = self._interval
        while not state.stopping:
            async with asyncio.timeout(self._bound):
                cur = conn.cursor(row_factory=dict_row)
                row = await (await cur.execute(self._stmts.watch_reading)).fetchone()
            assert row is not None
            last_value, is_called = row["last_value"], row["is_called"]
            snapshot, counter32 = row["snapshot"], row["counter32"]
            self.readings += 1
            snap = Snapshot.parse(snapshot)
            wake, active = watch.observe(
                (last_value, is_called), snap, next_xid(snap.xmax, counter32)
            )
            if wake:
                state.wake.set()
            interval = self._interval if active else min(interval * 2, self._idle)
            await state.sleep(interval)
