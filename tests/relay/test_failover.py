"""Relays as real processes: kill -9 mid-batch (takeover after the lease), SIGTERM (exit 0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from tests.relay.relay_helpers import statuses, wait_for, write

PROC = str(Path(__file__).with_name("relay_proc.py"))


def _start(url: str, out: Path, lease: float, delay: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, PROC, url, str(out), str(lease), str(delay)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def _leased_by_others(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox_messages WHERE lease_until > clock_timestamp()"
        ).fetchone()
    return int(row[0]) if row else 0


def _lines(out: Path) -> list[tuple[str, int, int]]:
    if not out.exists():
        return []
    return [
        (k, int(s), int(p))
        for k, s, p, _id in (ln.split() for ln in out.read_text().split("\n") if ln)
    ]


def test_failover_kill9_rows_taken_over_after_lease(url: str, tmp_path: Path) -> None:
    out = tmp_path / "published.txt"
    write(url, [("t", f"k{i % 5}") for i in range(40)])
    lease = 2.0
    victim = _start(url, out, lease, delay=60.0)  # claims, then hangs in the broker call
    try:
        wait_for(lambda: _leased_by_others(url) > 0, what="victim holds leases")
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        victim.wait(10)
    finally:
        _reap(victim)
    heir = _start(url, out, lease, delay=0.0)
    try:
        wait_for(lambda: statuses(url) == {"published": 40}, timeout=30, what="takeover")
        took = time.monotonic() - killed_at
    finally:
        heir.send_signal(signal.SIGTERM)
        code = heir.wait(20)
        _reap(heir)
    assert code == 0
    # The guarantee is that the heir takes the rows over once the lease lapsed (the 30 s wait
    # above bounds it); how long after depends on the heir's start-up, slow on a loaded machine.
    print(f"takeover {took:.2f}s after the kill (lease {lease:g}s)")
    lines = _lines(out)
    assert {p for _, _, p in lines} == {heir.pid}  # the victim never got an ack
    for key in {k for k, _, _ in lines}:
        assert [s for k, s, _ in lines if k == key] == list(range(1, 9))


def test_failover_sigterm_exits_zero_and_releases_leases(url: str, tmp_path: Path) -> None:
    out = tmp_path / "published.txt"
    write(url, [("t", "a")] * 5)
    proc = _start(url, out, lease=30.0, delay=60.0)  # stuck in the broker call
    try:
        # one key: its head carries the lease of the key's five rows
        wait_for(lambda: _leased_by_others(url) == 1, what="claimed")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        took = time.monotonic() - started
    finally:
        _reap(proc)
    assert code == 0
    # shutdown_timeout 5 s, then release and close; the margin is for a loaded machine, the
    # point is that a relay stuck in a broker call still exits (not after its 60 s delay)
    assert took < 5 + 15, took
    assert _leased_by_others(url) == 0  # given back: another relay may take them at once
    with psycopg.connect(url) as conn:
        registered = conn.execute("SELECT count(*) FROM outbox_relays").fetchone()
    assert registered == (0,)
