"""Per-(topic, key) sequence numbers: gapless, and increasing in commit order.

"In commit order" is checked the way a relay would observe it: a reader that snapshots the
table over and over must always see, for every key, exactly 1..n, never n+1 before n.
If a later sequence number could commit before an earlier one, some snapshot would show a hole.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from outbox import Message, publish, publish_batch

WRITERS = 10
TXNS_PER_WRITER = 40
KEYS = ["a", "b", "c"]


def _writer(url: str, seed: int, committed: list[Any], lock: threading.Lock) -> None:
    rnd = random.Random(seed)
    with psycopg.connect(url) as conn:
        for n in range(TXNS_PER_WRITER):
            key = rnd.choice(KEYS)
            if rnd.random() < 0.3:  # a batch of 1-3 messages, sometimes on two keys
                msgs = [
                    Message("orders", rnd.choice(KEYS), {"w": seed, "n": n, "i": i})
                    for i in range(rnd.randint(1, 3))
                ]
                ids = publish_batch(conn, msgs)
            else:
                ids = [publish(conn, topic="orders", key=key, payload={"w": seed, "n": n})]
            if rnd.random() < 0.05:
                time.sleep(0.002)  # hold the key lock a little: late commits
            if rnd.random() < 0.25:
                conn.rollback()
            else:
                conn.commit()
                with lock:
                    committed.extend(ids)


def _check_snapshot(conn: psycopg.Connection[Any]) -> int:
    seqs: dict[str, list[int]] = defaultdict(list)
    for key, seq in conn.execute(
        "SELECT key, seq FROM outbox_messages WHERE topic = 'orders' ORDER BY key, seq"
    ):
        seqs[key].append(seq)
    for key, got in seqs.items():
        assert got == list(range(1, len(got) + 1)), f"key {key}: visible seqs {got}"
    return sum(len(v) for v in seqs.values())


def test_concurrent_writers_leave_gapless_commit_ordered_sequences(database_url: str) -> None:
    committed: list[Any] = []
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_writer, args=(database_url, s, committed, lock))
        for s in range(WRITERS)
    ]
    snapshots = 0
    with psycopg.connect(database_url, autocommit=True) as reader:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            _check_snapshot(reader)
            snapshots += 1
        for t in threads:
            t.join()
        total = _check_snapshot(reader)
        ids = {r[0] for r in reader.execute("SELECT id FROM outbox_messages")}
        counters = dict(
            reader.execute(
                "SELECT key, last_seq FROM outbox_key_sequences WHERE topic = 'orders'"
            ).fetchall()
        )
        per_key = dict(
            reader.execute("SELECT key, max(seq) FROM outbox_messages GROUP BY key").fetchall()
        )
    assert snapshots > 10  # the reader really raced the writers
    assert ids == set(committed)  # exactly the committed messages, nothing rolled back
    assert total == len(committed)
    assert counters == per_key  # rollbacks returned their numbers


def test_same_key_writers_block_only_each_other(database_url: str) -> None:
    """A writer holding key 'a' open delays the next 'a' writer but not a 'b' writer."""
    with psycopg.connect(database_url) as holder, psycopg.connect(database_url) as other:
        publish(holder, topic="t", key="a", payload=1)
        other.execute("SET lock_timeout = '300ms'")
        publish(other, topic="t", key="b", payload=1)  # different key: no wait
        other.commit()
        with pytest.raises(psycopg.errors.LockNotAvailable):
            publish(other, topic="t", key="a", payload=2)
        other.rollback()
        holder.commit()
        publish(other, topic="t", key="a", payload=2)
        other.commit()
        got = other.execute("SELECT key, seq FROM outbox_messages ORDER BY key, seq").fetchall()
    assert got == [("a", 1), ("a", 2), ("b", 1)]


def test_concurrent_same_idempotency_key_writes_one_row_and_no_gap(database_url: str) -> None:
    """Two transactions racing on a new idempotency key: one row, the loser gets its id."""
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def race(commit_first: bool) -> None:
        with psycopg.connect(database_url) as conn:
            barrier.wait()
            results.append(publish(conn, topic="t", key="k", payload=1, idempotency_key="once"))
            if commit_first:
                conn.commit()
            else:
                time.sleep(0.05)  # a late commit: the other transaction waits on it meanwhile
                conn.commit()

    threads = [threading.Thread(target=race, args=(i == 0,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with psycopg.connect(database_url) as conn:
        publish(conn, topic="t", key="k", payload=2)
        conn.commit()
        got = conn.execute("SELECT id, seq FROM outbox_messages ORDER BY seq").fetchall()
    assert results[0] == results[1]
    assert [s for _, s in got] == [1, 2]
    assert got[0][0] == results[0]


def _await_lock_wait(conn: psycopg.Connection[Any], pid: int) -> None:
    """Return once backend ``pid`` waits for a lock (the condition, not a guessed sleep)."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row == ("Lock",):
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited for a lock")


def test_idempotent_publish_on_a_key_another_writer_holds_cannot_deadlock(
    database_url: str,
) -> None:
    """A holds key k (an earlier publish) and then publishes idempotency key X on k; B already
    waits to publish X on k. Each waits only for the other's whole transaction, never in a
    cycle: B's no-op follows A's commit. (Advisory lock first, counter row second, deadlocked.)"""
    outcome: dict[str, Any] = {}
    with (
        psycopg.connect(database_url, autocommit=True) as watcher,
        psycopg.connect(database_url) as a,
        psycopg.connect(database_url) as b,
    ):
        publish(a, topic="t", key="k", payload="created", wakeup=False)

        def writer_b() -> None:
            try:
                outcome["B"] = publish(
                    b, topic="t", key="k", payload="paid", idempotency_key="X", wakeup=False
                )
                b.commit()
            except psycopg.Error as exc:
                outcome["B"] = exc
                b.rollback()

        thread = threading.Thread(target=writer_b)
        thread.start()
        _await_lock_wait(watcher, b.info.backend_pid)
        a_id = publish(a, topic="t", key="k", payload="paid", idempotency_key="X", wakeup=False)
        a.commit()
        thread.join(10)
        got = a.execute("SELECT id, seq, payload FROM outbox_messages ORDER BY seq").fetchall()
    assert outcome["B"] == a_id  # a no-op republish: the same id, nothing written
    assert [(s, bytes(p)) for _, s, p in got] == [(1, b'"created"'), (2, b'"paid"')]
    assert got[1][0] == a_id
