"""'polling' mode's reader of the ledger (relay/_ledger.py), against a real PostgreSQL.

Writers put each message in the ledger (outbox_wal_pending) and nothing else; running relays
number the committed rows per (topic, key), record them, and their claim loops publish them.
These tests write with ``numbered=False``: only the relays number here.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
from psycopg.rows import dict_row

from outbox.envelope import Envelope
from relay import Relay
from tests.relay.relay_helpers import FakePublisher, await_for, config, running, write


def _ledger_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_wal_pending").fetchone()
    assert row is not None
    return int(row[0])


def _in_key_order_once(log: list[tuple[str, Envelope]]) -> None:
    seen: dict[tuple[str, str], list[int]] = {}
    for _, e in log:
        seen.setdefault((e.topic, e.key), []).append(e.seq)
    for key, seqs in seen.items():
        assert seqs == list(range(1, len(seqs) + 1)), (key, seqs)


def test_relays_number_the_ledger_once_in_key_order(url: str) -> None:
    """Three relays; writers commit while they run. Every message is numbered once (gapless
    per key, in the order its key's transactions committed) and published once, whichever
    relay numbered or sent it (which one does is the scheduler's, not asserted)."""
    keys = [f"k{i}" for i in range(40)]
    log: list[tuple[str, Envelope]] = []
    pubs = [FakePublisher(log, name=f"r{i}") for i in range(3)]
    for p in pubs:
        p.delay = 0.01  # a send takes a moment, as a broker's does: the claims overlap
    relays = [Relay(config(url, batch_size=16, per_key_batch=2), p) for p in pubs]

    async def go() -> None:
        async with running(*relays):
            for _ in range(10):
                await asyncio.to_thread(write, url, [("orders", k) for k in keys], numbered=False)
            await await_for(lambda: len(log) == 400, what="all 400 published")

    asyncio.run(go())
    assert len({e.id for _, e in log}) == 400
    _in_key_order_once(log)
    assert _ledger_rows(url) == 0


def test_a_numbering_transaction_that_stalls_is_ended_by_the_server(url: str) -> None:
    """A relay frozen in the middle of numbering holds the ledger's lock in an open
    transaction: no other relay numbers meanwhile. The server ends that transaction after
    lease_seconds idle in it (the lease of 'polling' mode), and a running relay numbers
    and publishes what the ledger holds; nothing is numbered twice."""
    write(url, [("orders", "a"), ("orders", "b")], numbered=False)
    frozen = psycopg.connect(url)
    # what a relay's reader does first; then it "freezes": the transaction stays open
    with frozen.cursor() as cur:
        cur.execute("SELECT set_config('idle_in_transaction_session_timeout', '1500', true)")
        cur.execute("SELECT pg_try_advisory_xact_lock(3084, hashtext(%s))", (_lock_name(url),))
        assert cur.fetchone() == (True,)
    log: list[tuple[str, Envelope]] = []
    relay = Relay(config(url, lease_seconds=1.5, publish_timeout=1.0), FakePublisher(log))
    started = time.monotonic()

    async def go() -> None:
        async with running(relay):
            await await_for(lambda: len(log) == 2, within=20, what="both published")

    asyncio.run(go())
    # not before the frozen transaction was ended by the server (1.5 s idle in it)
    assert time.monotonic() - started >= 1.4
    assert sorted(e.key for _, e in log) == ["a", "b"]
    assert [e.seq for _, e in log] == [1, 1]
    try:
        frozen.execute("SELECT 1")
        ended = False
    except psycopg.errors.IdleInTransactionSessionTimeout:
        ended = True  # the server terminated the frozen session
    finally:
        frozen.close()
    assert ended


def _lock_name(url: str) -> str:
    """The capture lock's name for a database in 'polling' mode without a slot."""
    from relay._slot import default_slot

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return default_slot(str(row[0]))


def test_a_backlog_of_several_rounds_is_numbered_in_write_order(url: str) -> None:
    """More rows than a round (ROUND_BATCHES batches) holds: read in rounds, numbered per key
    in the order they were written, each once, and the ledger is left empty."""
    from relay._capture import ROUND_BATCHES
    from relay._ledger import record_ledger
    from relay._statements import relay_statements

    batch = 3
    per_key = (ROUND_BATCHES * batch * 2 + 7) // 5  # a little over two rounds in all
    keys = [f"k{i}" for i in range(5)]
    written: list[tuple[str, str]] = []
    for _ in range(per_key):
        written += [("orders", k) for k in keys]
    ids = write(url, written, numbered=False)

    async def go() -> int:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            return await record_ledger(conn, relay_statements(None), config(url, batch_size=batch))

    assert asyncio.run(go()) == len(written)
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, key, seq FROM outbox_messages").fetchall()
    seq_of = {row[0]: (row[1], row[2]) for row in rows}
    assert len(seq_of) == len(written)
    expected: dict[str, int] = {}
    for msg_id, (_, key) in zip(ids, written, strict=True):
        expected[key] = expected.get(key, 0) + 1
        assert seq_of[msg_id] == (key, expected[key])
    assert _ledger_rows(url) == 0


def test_the_relay_that_numbers_a_batch_sends_it(url: str) -> None:
    """In 'polling' mode the numbering relay sends what it numbered, as the streaming relay
    does in 'wal' mode, instead of leaving it to a claim: a claim counts its attempt on each
    row it leases (outbox_claim_batch), a batch sent by its numbering relay counts none. Two
    relays: every message is published once, in key order, and none went through a claim."""
    keys = [f"k{i}" for i in range(20)]
    log: list[tuple[str, Envelope]] = []
    relays = [Relay(config(url, batch_size=50), FakePublisher(log, name=f"r{i}")) for i in (1, 2)]

    async def go() -> None:
        async with running(*relays):
            # one message per key: none waits behind another relay's batch for the claims
            await asyncio.to_thread(write, url, [("orders", k) for k in keys], numbered=False)
            await await_for(lambda: len(log) == 20, what="all 20 published")

    asyncio.run(go())
    _in_key_order_once(log)
    with psycopg.connect(url, row_factory=dict_row) as conn:
        claimed = conn.execute(
            "SELECT count(*) AS n FROM outbox_messages WHERE attempts <> 0"
        ).fetchone()
    assert claimed == {"n": 0}
