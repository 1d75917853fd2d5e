"""A frozen streaming relay loses the slot to a standby (relay/_capture_lease.py), on the
private logical cluster: as real processes (SIGSTOP), the standby fences it and captures within
the lease plus a second; the frozen one, woken, commits and confirms nothing, and stands by; an
inbox fed with everything both sent applies every committed message once, in per-key order.
And a relay whose event loop is stuck loses the slot the same way, to a standby running as the
least-privilege role of `outbox migrate grants`."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from inbox import HandlerRunner
from outbox import publish
from outbox.cli import main as outbox_cli
from outbox.envelope import Envelope
from relay import Relay
from tests.relay.relay_helpers import FakePublisher, await_for, config, wait_for

PROC = str(Path(__file__).resolve().parents[1] / "relay" / "relay_proc.py")
LEASE = 3.0
KEYS = [f"k{i}" for i in range(5)]


def _start(url: str, out: Path, log: Path, delay: float) -> subprocess.Popen[str]:
    with log.open("w") as err:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, PROC, url, str(out), str(LEASE), str(delay)],
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def _lease(url: str) -> tuple[int, int, int | None, int | None] | None:
    """(epoch, pid of the holding relay process, its walsender's pid, the slot's streamer)."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT l.epoch, r.pid, l.stream_pid, s.active_pid FROM outbox_capture_lease AS l "
            "JOIN outbox_relays AS r ON r.relay_id = l.holder "
            "LEFT JOIN pg_replication_slots AS s ON s.slot_name = l.slot"
        ).fetchone()


def _sent(out: Path) -> list[tuple[str, int, int, uuid.UUID]]:
    if not out.exists():
        return []
    lines = [ln.split() for ln in out.read_text().split("\n") if ln]
    return [(k, int(s), int(p), uuid.UUID(i)) for k, s, p, i in lines]


def _produce(url: str, stop: threading.Event, committed: list[uuid.UUID]) -> None:
    """10 messages a second over a few keys, one per transaction."""
    with psycopg.connect(url) as conn:
        n = 0
        while not stop.wait(0.1):
            committed.append(publish(conn, topic="t", key=KEYS[n % len(KEYS)], payload={"n": n}))
            conn.commit()
            n += 1


def _apply_through_an_inbox(url: str, sent: list[tuple[str, int, int, uuid.UUID]]) -> list[Any]:
    """Every delivery, in the order sent, to an ordered inbox consumer; its effects."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE effects (n bigserial PRIMARY KEY, message_id uuid NOT NULL, "
            "key text NOT NULL, seq bigint NOT NULL)"
        )

    def handler(conn: Any, env: Envelope) -> None:
        conn.execute(
            "INSERT INTO effects (message_id, key, seq) VALUES (%s, %s, %s)",
            (env.id, env.key, env.seq),
        )

    with ConnectionPool(url, min_size=1, max_size=1) as pool:
        runner = HandlerRunner(pool, handler, consumer="c", ordered=True)
        for key, seq, _pid, id_ in sent:
            runner.handle(Envelope(id=id_, topic="t", key=key, seq=seq, payload=b"{}"))
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT message_id, key, seq FROM effects ORDER BY n").fetchall()


def test_a_frozen_streaming_relay_is_fenced_and_its_standby_captures_within_the_lease(
    wal_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "sent.txt"
    # Each batch stays in the broker a while: the holder is frozen with a batch open (its
    # counter rows locked), which only fencing its session ends.
    first = _start(wal_url, out, tmp_path / "first.log", delay=0.3)
    second: subprocess.Popen[str] | None = None
    stop = threading.Event()
    committed: list[uuid.UUID] = []
    producer = threading.Thread(target=_produce, args=(wal_url, stop, committed))
    try:
        wait_for(lambda: (_lease(wal_url) or (0, 0))[1] == first.pid, 30, "the first to capture")
        second = _start(wal_url, out, tmp_path / "second.log", delay=0.3)
        producer.start()
        wait_for(lambda: len(_sent(out)) >= 20, 30, "deliveries before the freeze")
        before = _lease(wal_url)
        assert before is not None
        assert before[1] == first.pid
        os.kill(first.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        seen_before = len(_sent(out))
        wait_for(
            lambda: (lease := _lease(wal_url)) is not None
            and lease[1] == second.pid and lease[2] is not None and lease[2] == lease[3],
            LEASE + 10, "the standby to stream",
        )  # fmt: skip
        took = time.monotonic() - frozen_at
        wait_for(
            lambda: any(p == second.pid for _, _, p, _ in _sent(out)[seen_before:]),
            10, "the standby's first delivery",
        )  # fmt: skip
        delivered = time.monotonic() - frozen_at
        after = _lease(wal_url)
        assert after is not None
        assert after[0] > before[0]  # a new epoch
        time.sleep(LEASE)  # the frozen one stays frozen past the takeover
        os.kill(first.pid, signal.SIGCONT)
        time.sleep(LEASE)  # woken: it must stand by (it cannot commit, confirm or take over)
        assert first.poll() is None, "the woken relay should stand by, not exit"
        assert _lease(wal_url) == after  # same epoch, holder and walsender: nothing taken back
        stop.set()
        producer.join(10)
        wait_for(
            lambda: set(committed) <= {i for *_, i in _sent(out)}, 60, "every message sent"
        )
        with psycopg.connect(wal_url) as conn:
            recorded = conn.execute(
                "SELECT id, key, seq FROM outbox_messages WHERE status = 'published'"
            ).fetchall()
        for proc in (first, second):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(10)
        _reap(first)
        if second is not None:
            _reap(second)
    print(f"takeover {took:.2f}s, first delivery by the standby {delivered:.2f}s after SIGSTOP")
    # lease + the standby's look + opening the stream; the margin is for a loaded machine
    # (tests/faults measures the takeover time itself)
    assert took <= LEASE + 5.0, took
    sent = _sent(out)
    assert {i for i, _, _ in recorded} == set(committed)  # one row each, all published
    seq_of = {i: (k, s) for i, k, s in recorded}
    assert all(seq_of[i] == (k, s) for k, s, _, i in sent)  # re-sent: same id, same seq
    effects = _apply_through_an_inbox(wal_url, sent)
    assert sorted(str(m) for m, _, _ in effects) == sorted(str(i) for i in committed)
    for key in KEYS:
        seqs = [s for _, k, s in effects if k == key]
        assert seqs == list(range(1, len(seqs) + 1)), key
    log = (tmp_path / "first.log").read_text()
    assert "lost the capture lease" in log, log
    log = (tmp_path / "second.log").read_text()
    assert "terminated its sessions" in log, log


def test_a_stuck_event_loop_loses_the_slot_to_a_standby_of_the_relay_role(
    wal_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"oi_relay_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(wal_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN REPLICATION')
    try:
        result = CliRunner().invoke(
            outbox_cli,
            ["migrate", "grants", "--apply", "--url", wal_url, "--relay", role, "--producer", role],
        )
        assert result.exit_code == 0, result.output
        url = make_conninfo(**{**conninfo_to_dict(wal_url), "user": role})
        with caplog.at_level(logging.WARNING, logger="relay"):
            asyncio.run(_stuck_loop_takeover(url))
        messages = [r.getMessage() for r in caplog.records]
        assert any("terminated its sessions" in m for m in messages), messages  # fenced
        assert any("lost the capture lease" in m for m in messages), messages
        assert not any("may not end" in m for m in messages), messages  # the role sufficed
    finally:
        with psycopg.connect(wal_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            admin.execute(f'DROP OWNED BY "{role}"')
            admin.execute(f'DROP ROLE "{role}"')


async def _stuck_loop_takeover(url: str) -> None:
    lease = 2.0
    log: list[tuple[str, Envelope]] = []
    stuck = Relay(config(url, lease_seconds=lease, publish_timeout=1.0), FakePublisher(log, "a"))
    standby = Relay(config(url, lease_seconds=lease, publish_timeout=1.0), FakePublisher(log, "b"))
    loop_of_stuck: list[asyncio.AbstractEventLoop] = []

    async def run_stuck() -> None:
        loop_of_stuck.append(asyncio.get_running_loop())
        await stuck.run()

    thread = threading.Thread(target=lambda: asyncio.run(run_stuck()))
    thread.start()
    task: asyncio.Task[None] | None = None
    try:
        await await_for(lambda: bool(stuck.capture and stuck.capture.capturing), 20, "capturing")
        task = asyncio.create_task(standby.run())
        ids = [_commit(url, "before")]
        await await_for(lambda: _published(url) == 1, 20, "the first message recorded")
        stuck_at = time.monotonic()
        # The holder's loop blocks (a CPU-bound handler, a blocking call): it cannot heartbeat.
        loop_of_stuck[0].call_soon_threadsafe(time.sleep, lease * 3)
        await await_for(
            lambda: bool(standby.capture and standby.capture.capturing), lease + 10, "takeover"
        )
        took = time.monotonic() - stuck_at
        ids.append(_commit(url, "during"))
        await await_for(lambda: len(log) == 2, 20, "a message after the takeover")
        assert log[1][0] == "b"
        # its loop runs again: it finds the lease lost and stands by; the standby keeps the slot
        awake = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop_of_stuck[0])
        await asyncio.wrap_future(awake)
        assert time.monotonic() - stuck_at >= lease * 3
        await await_for(lambda: not (stuck.capture and stuck.capture.capturing), 10, "stand by")
        assert standby.capture is not None
        assert standby.capture.capturing
        ids.append(_commit(url, "after"))
        await await_for(lambda: len(log) == 3, 20, "a message after the wake-up")
    finally:
        standby.stop()
        loop_of_stuck[0].call_soon_threadsafe(stuck.stop)
        if task is not None:
            await task
        await asyncio.to_thread(thread.join, 30)
    print(f"takeover from a stuck event loop: {took:.2f}s (lease {lease:g}s)")
    assert took <= lease + 5.0, took  # as above: a margin for a loaded machine
    assert [e.id for _, e in log] == ids
    assert [e.seq for _, e in log] == [1, 2, 3]
    assert [name for name, _ in log] == ["a", "b", "b"]


def _commit(url: str, n: str) -> uuid.UUID:
    with psycopg.connect(url) as conn:
        id_ = publish(conn, topic="t", key="k", payload={"n": n})
        conn.commit()
    return id_


def _published(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_messages WHERE status = 'published'")
        return int(row.fetchone()[0])  # type: ignore[index]
