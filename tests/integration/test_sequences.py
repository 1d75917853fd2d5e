"""Per-(topic, key) sequence numbers: gapless, and increasing in commit order.

Writers put messages in the ledger (outbox_wal_pending); the relay's ledger reader numbers
them after commit (relay/_ledger.py, run here by tests.support.ledger.record, over and over
while the writers write, as a relay does). Checked the way a relay would observe it: a reader
that snapshots outbox_messages over and over must always see, for every key, exactly 1..n,
never n+1 before n; and a transaction that committed before another began has the lower seqs.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg

from outbox import Message, publish, publish_batch
from relay import RelayConfig
from relay._ledger import record_ledger
from relay._statements import relay_statements
from tests.support.ledger import record

WRITERS = 10
TXNS_PER_WRITER = 40
KEYS = ["a", "b", "c"]


def _writer(
    url: str,
    seed: int,
    committed: list[Any],
    lock: threading.Lock,
    spans: list[tuple[float, float, list[Any]]],
) -> None:
    rnd = random.Random(seed)
    with psycopg.connect(url) as conn:
        for n in range(TXNS_PER_WRITER):
            begun = time.monotonic()
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
                time.sleep(0.002)  # stay open a little: late commits
            if rnd.random() < 0.25:
                conn.rollback()
            else:
                conn.commit()
                with lock:
                    committed.extend(ids)
                    spans.append((begun, time.monotonic(), ids))


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
    spans: list[tuple[float, float, list[Any]]] = []
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_writer, args=(database_url, s, committed, lock, spans))
        for s in range(WRITERS)
    ]
    numbered = [0, 0]  # messages, reads

    async def number() -> None:  # the relay's ledger reader, racing the writers
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            stmts, config = relay_statements(None), RelayConfig(database_url)
            while any(t.is_alive() for t in threads):
                numbered[0] += await record_ledger(conn, stmts, config)
                numbered[1] += 1

    def numberer() -> None:
        asyncio.run(number())

    snapshots = 0
    with psycopg.connect(database_url, autocommit=True) as reader:
        for t in threads:
            t.start()
        relay = threading.Thread(target=numberer)
        relay.start()
        while any(t.is_alive() for t in threads):
            _check_snapshot(reader)
            snapshots += 1
        for t in threads:
            t.join()
        relay.join()
        racing = numbered[0]
        numbered[0] += record(database_url)
        total = _check_snapshot(reader)
        seq_of = dict(reader.execute("SELECT id, seq FROM outbox_messages").fetchall())
        key_of = dict(reader.execute("SELECT id, key FROM outbox_messages").fetchall())
        left = reader.execute("SELECT count(*) FROM outbox_wal_pending").fetchone()
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
    assert numbered[1] > 1  # and so did the numbering,
    assert racing > 0  # which numbered messages while the writers wrote
    assert left == (0,)
    assert ids == set(committed)  # exactly the committed messages, nothing rolled back
    assert total == len(committed) == numbered[0]
    assert counters == per_key  # rolled-back messages never took a number
    # in commit order: a transaction that committed before another began has, on each key both
    # wrote, the lower seqs; within a transaction, a key's seqs follow the order written
    for _, _, ids_ in spans:
        for k in KEYS:
            in_key = [seq_of[i] for i in dict.fromkeys(ids_) if key_of[i] == k]
            assert in_key == sorted(in_key), f"key {k}: a batch numbered out of order"
    for _, done_a, ids_a in spans:
        for begun_b, _, ids_b in spans:
            if done_a >= begun_b:
                continue
            for k in KEYS:
                a = [seq_of[i] for i in ids_a if key_of[i] == k]
                b = [seq_of[i] for i in ids_b if key_of[i] == k]
                assert not a or not b or max(a) < min(b), f"key {k}: {a} committed before {b}"


def test_same_key_writers_never_block_each_other_and_number_in_commit_order(
    database_url: str,
) -> None:
    """A writer holding key 'a' open delays no other writer, not even of 'a' (a writer takes no
    lock of its key: it inserts one ledger row); the seqs follow the commits, not the writes:
    the 'a' that committed first is numbered first."""
    with psycopg.connect(database_url) as holder, psycopg.connect(database_url) as other:
        held = publish(holder, topic="t", key="a", payload=1)
        other.execute("SET lock_timeout = '300ms'")
        publish(other, topic="t", key="b", payload=1)  # different key: no wait
        other.commit()
        first = publish(other, topic="t", key="a", payload=2)  # same key: no wait either
        other.commit()
        assert record(database_url) == 2  # the open transaction's message is not numbered
        holder.commit()
        assert record(database_url) == 1
        got = other.execute("SELECT id, key, seq FROM outbox_messages ORDER BY key, seq").fetchall()
    assert [r[1:] for r in got] == [("a", 1), ("a", 2), ("b", 1)]
    assert [r[0] for r in got[:2]] == [first, held]


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
        assert conn.execute("SELECT count(*) FROM outbox_wal_pending").fetchone() == (1,)
        publish(conn, topic="t", key="k", payload=2)
        conn.commit()
        record(database_url)
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
    """A holds key k (an earlier publish) and publishes idempotency key X on k; B then waits to
    publish X on k. A writer takes no lock of its key, so the one wait left is B's on X's
    ledger row, for A's whole transaction, never in a cycle: B's no-op follows A's commit.
    (Before the ledger: advisory lock first, counter row second, deadlocked.)"""
    outcome: dict[str, Any] = {}
    with (
        psycopg.connect(database_url, autocommit=True) as watcher,
        psycopg.connect(database_url) as a,
        psycopg.connect(database_url) as b,
    ):
        publish(a, topic="t", key="k", payload="created", wakeup=False)
        a_id = publish(a, topic="t", key="k", payload="paid", idempotency_key="X", wakeup=False)

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
        a.commit()
        thread.join(10)
        assert not thread.is_alive()
        record(database_url)
        got = a.execute("SELECT id, seq, payload FROM outbox_messages ORDER BY seq").fetchall()
    assert outcome["B"] == a_id  # a no-op republish: the same id, nothing written
    assert [(s, bytes(p)) for _, s, p in got] == [(1, b'"created"'), (2, b'"paid"')]
    assert got[1][0] == a_id
