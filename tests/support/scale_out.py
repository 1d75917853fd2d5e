"""Several consumer processes under one consumer name: start them (tests/support/scale_worker.py)
and check, from the handler's own ``applies`` table, what they did together.

The checks: every expected message applied once (**lost**, **duplicates**), each key in seq
order (**order violations**), and **overlaps**: a key's handler running in two processes at
overlapping times (an apply that started in one process before another process's apply of
the same key had ended). ``takeover`` measures how long a process's keys waited after it died,
joined or froze.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

__all__ = [
    "SCHEMA", "Applied", "Check", "applied", "check", "joined_at", "ready", "refusals", "spawn",
    "takeover",
]  # fmt: skip

SCHEMA = """
CREATE TABLE IF NOT EXISTS applies (
    n bigserial PRIMARY KEY, consumer text NOT NULL, message_id uuid NOT NULL,
    key text NOT NULL, seq bigint NOT NULL, pid int NOT NULL,
    started double precision NOT NULL, ended double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS scale_procs (
    pid int PRIMARY KEY, consumer text NOT NULL, refused bigint NOT NULL DEFAULT 0,
    ready boolean NOT NULL DEFAULT false,
    --  when the process started to join (its imports done): wall clock, seconds
    since double precision
);
"""


@dataclass(frozen=True)
class Applied:
    message_id: uuid.UUID
    key: str
    seq: int
    pid: int
    started: float
    ended: float


@dataclass(frozen=True)
class Check:
    applied: int
    lost: int
    duplicates: int
    order_violations: int
    overlaps: int
    #: how many messages each process applied, by pid
    per_process: dict[int, int]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.order_violations or self.overlaps)


def spawn(url: str, broker: str, broker_url: str, source: str, consumer: str, log: Path,
          delay_ms: float = 0.0, session_ms: int = 6000, *extra: str,
          ) -> subprocess.Popen[bytes]:  # fmt: skip
    """A worker process (it inherits PYTHONPATH); its output goes to ``log``. ``extra``:
    more of its options (``--partitions``, ``--subject``, ``--lease``)."""
    args = [sys.executable, "-m", "tests.support.scale_worker", url, broker, broker_url, source,
            consumer, "--delay-ms", str(delay_ms), "--session-ms", str(session_ms),
            *extra]  # fmt: skip
    with open(log, "ab") as out:  # the child keeps its own copy
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate ``procs``, then kill any that has not exited within 20 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def applied(url: str, consumer: str) -> list[Applied]:
    """The committed applies of ``consumer``, in the order their handlers started."""
    with psycopg.connect(url) as conn:
        cur = conn.execute(
            "SELECT message_id, key, seq, pid, started, ended FROM applies "
            "WHERE consumer = %s ORDER BY started, n",
            (consumer,),
        )
        names = [c.name for c in cur.description or ()]
        return [Applied(**dict(zip(names, row, strict=True))) for row in cur.fetchall()]


def refusals(url: str, consumer: str) -> int:
    """Out-of-order refusals the processes reported (each reports its count every second)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(refused), 0) AS refused FROM scale_procs WHERE consumer = %s",
            (consumer,),
        ).fetchone()
    return int(row[0]) if row else 0


def ready(url: str, consumer: str) -> set[int]:
    """The pids of the processes that reported themselves ready (joined, first assignment)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT pid FROM scale_procs WHERE consumer = %s AND ready", (consumer,)
        ).fetchall()
    return {int(r[0]) for r in rows}


def joined_at(url: str, pid: int) -> float | None:
    """When process ``pid`` started to join (its first report), or None before it reported."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT since FROM scale_procs WHERE pid = %s", (pid,)).fetchone()
    return float(row[0]) if row and row[0] is not None else None


def check(rows: Sequence[Applied], expected: Iterable[uuid.UUID]) -> Check:
    ids = [r.message_id for r in rows]
    lost = len(set(expected) - set(ids))
    order = overlaps = 0
    last_seq: dict[str, int] = {}
    #: per key: the latest end of an apply so far, and the process of that apply
    busy: dict[str, tuple[float, int]] = {}
    per_process: dict[int, int] = {}
    for r in rows:  # in the order the handlers started
        if r.seq <= last_seq.get(r.key, 0):
            order += 1
        last_seq[r.key] = r.seq
        end, pid = busy.get(r.key, (0.0, r.pid))
        if r.started < end and pid != r.pid:
            overlaps += 1
        if r.ended >= end:
            busy[r.key] = (r.ended, r.pid)
        per_process[r.pid] = per_process.get(r.pid, 0) + 1
    return Check(
        applied=len(ids), lost=lost, duplicates=len(ids) - len(set(ids)), order_violations=order,
        overlaps=overlaps, per_process=per_process,
    )  # fmt: skip


def takeover(rows: Sequence[Applied], pid: int, at: float) -> tuple[float, float]:
    """Seconds from ``at`` (process ``pid`` killed or frozen) until another process applied
    one of the keys ``pid`` was applying last (its partitions or groups were handed over), and
    until it had applied every one of them that came again. NaN if none did yet."""
    owner: dict[str, int] = {}
    for r in rows:
        if r.started < at:
            owner[r.key] = r.pid
    keys = {k for k, p in owner.items() if p == pid}
    first: dict[str, float] = {}
    for r in rows:
        if r.key in keys and r.pid != pid and r.started >= at and r.key not in first:
            first[r.key] = r.started
    if not first:
        return float("nan"), float("nan")
    return min(first.values()) - at, max(first.values()) - at
