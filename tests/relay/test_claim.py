"""The claim: head-of-key leasing, contiguous runs, fencing, lease expiry, late commits."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import relay._claim as _claim_module
from outbox import Message, publish_batch
from relay import Relay
from relay._claim import Claim, Outcome, claim_batch, mark_batch, resume_point
from relay._statements import relay_statements
from tests.relay.relay_helpers import FakePublisher, config, db_clock_past, record, write

S = relay_statements(None)


async def _claim(url: str, **kw: Any) -> Claim | None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await claim_batch(conn, S, config(url, **kw))


async def _mark(url: str, claim: Claim, action: str = "published") -> set[uuid.UUID]:
    outcomes = [Outcome(e.id, action) for e in claim.envelopes]  # type: ignore[arg-type]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await mark_batch(conn, S, claim.token, outcomes)


def _seqs(claim: Claim | None) -> list[tuple[str, int]]:
    return [] if claim is None else [(e.key, e.seq) for e in claim.envelopes]


def test_claim_takes_contiguous_run_of_a_key_and_blocks_the_key(url: str) -> None:
    write(url, [("t", "a")] * 5 + [("t", "b")] * 2)

    async def go() -> None:
        first = await _claim(url, per_key_batch=3, relay_id="r1")
        assert _seqs(first) == [("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 1), ("b", 2)]
        # Another relay gets nothing: every remaining row (a5) sits behind a leased row.
        assert await _claim(url, relay_id="r2") is None
        assert first is not None
        assert len(await _mark(url, first)) == 6
        second = await _claim(url, relay_id="r2")
        assert _seqs(second) == [("a", 5)]

    asyncio.run(go())


def test_claim_batch_limit_keeps_whole_prefixes(url: str) -> None:
    write(url, [("t", k) for _ in range(4) for k in ("a", "b", "c")])

    async def go() -> None:
        claim = await _claim(url, batch_size=5)
        got = _seqs(claim)
        assert len(got) == 5
        for key in "abc":
            seqs = [s for k, s in got if k == key]
            assert seqs == list(range(1, len(seqs) + 1))

    asyncio.run(go())


def test_claim_fenced_relay_cannot_mark_after_takeover(url: str) -> None:
    write(url, [("t", "a")] * 3)

    async def go() -> None:
        stale = await _claim(url, lease_seconds=0.3, publish_timeout=0.1, relay_id="slow")
        assert stale is not None
        assert await _claim(url, relay_id="other") is None  # lease still valid
        await db_clock_past(url, "SELECT max(lease_until) FROM outbox_messages")
        taken = await _claim(url, relay_id="other")
        assert _seqs(taken) == _seqs(stale)
        assert await _mark(url, stale) == set()  # fenced: the token changed
        assert taken is not None
        assert len(await _mark(url, taken)) == 3

    asyncio.run(go())


def test_claim_expired_but_untaken_lease_may_still_be_marked(url: str) -> None:
    write(url, [("t", "a")])

    async def go() -> None:
        claim = await _claim(url, lease_seconds=0.2, publish_timeout=0.1)
        await db_clock_past(url, "SELECT max(lease_until) FROM outbox_messages")
        assert claim is not None
        assert len(await _mark(url, claim)) == 1  # nobody else published it: right to mark

    asyncio.run(go())


@pytest.mark.parametrize(("policy", "expected"), [("hold", []), ("skip", [("a", 2)])])
def test_claim_dead_head_holds_or_skips_its_key(url: str, policy: str, expected: list[Any]) -> None:
    from relay import TopicPolicy

    write(url, [("t", "a")] * 2)

    async def go() -> None:
        kw: dict[str, Any] = {"topics": {"t": TopicPolicy(on_dead=policy)}}  # type: ignore[arg-type]
        claim = await _claim(url, per_key_batch=1, batch_size=1, **kw)
        assert claim is not None
        await _mark(url, claim, "dead")
        assert _seqs(await _claim(url, **kw)) == expected

    asyncio.run(go())


def test_claim_retry_postpones_the_whole_key(url: str) -> None:
    write(url, [("t", "a")] * 2 + [("t", "b")])

    async def go() -> None:
        claim = await _claim(url, batch_size=1)
        assert claim is not None
        # a minute: no pause of a loaded machine lets the retry fall due before the next claim
        outcome = Outcome(claim.envelopes[0].id, "retry", delay=60.0, error="boom")
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await mark_batch(conn, S, claim.token, [outcome])
            assert _seqs(await _claim(url)) == [("b", 1)]  # a1 waits, so a2 waits too
            # the minute passes: the retry's due time moves into the past
            await conn.execute(
                "UPDATE outbox_messages SET available_at = now() - interval '1 second' "
                "WHERE key = 'a' AND seq = 1"
            )
        assert _seqs(await _claim(url)) == [("a", 1), ("a", 2)]

    asyncio.run(go())


def test_claim_late_commit_with_lower_id_is_not_skipped(url: str) -> None:
    """A transaction that started first (lower UUIDv7 id) and commits last is still relayed."""
    early = psycopg.connect(url)
    try:
        [early_id] = publish_batch(early, [Message(topic="t", key="x", payload=1)], wakeup=False)
        [late_id] = write(url, [("t", "y")])
        assert early_id < late_id

        async def go() -> None:
            first = await _claim(url)
            assert first is not None
            assert [e.id for e in first.envelopes] == [late_id]
            await _mark(url, first)
            early.commit()
            await asyncio.to_thread(record, url)
            second = await _claim(url)
            assert second is not None
            assert [e.id for e in second.envelopes] == [early_id]

        asyncio.run(go())
    finally:
        early.close()


def test_claim_locks_at_most_limit_heads_with_nested_loops(url: str) -> None:
    """F9: the MATERIALIZED CTE bounds the locked rows even when the planner re-scans."""
    write(url, [("t", f"k{i}") for i in range(30)])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET enable_hashjoin = off")
        conn.execute("SET enable_mergejoin = off")
        params = {
            "limit": 7,
            "after_topic": "",
            "after_key": "",
            "per_key": 5,
            "owner": "r",
            "token": uuid.uuid4(),
            "lease_seconds": 5,
            "paused": [],
            **config(url).dead_policy_params(),
        }
        rows = conn.execute(S.claim, params).fetchall()
        leased = conn.execute(
            "SELECT count(*) FROM outbox_messages WHERE lease_token IS NOT NULL"
        ).fetchone()
    assert len(rows) == 7
    assert leased == (7,)


def _claim_params(url: str, **kw: Any) -> dict[str, Any]:
    return {
        "after_topic": "",
        "after_key": "",
        "owner": "r",
        "token": uuid.uuid4(),
        "lease_seconds": 5,
        "paused": [],
        **config(url).dead_policy_params(),
        **kw,
    }


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_plan_nodes(child))
    return nodes


def _walked_keys(plan: dict[str, Any]) -> int:
    """Rows of the claim's walk over keys (the recursive CTE `keys`)."""
    [walk] = [n for n in _plan_nodes(plan) if n.get("Node Type") == "Recursive Union"]
    return int(walk["Actual Rows"])


def test_claim_reads_no_run_when_heads_fill_the_batch(url: str) -> None:
    """One row per key: as many heads as the limit, and no run is read (bench (c))."""
    write(url, [("t", f"k{i}") for i in range(8)])
    with psycopg.connect(url, autocommit=True) as conn:
        params = _claim_params(url, limit=5, per_key=100)
        row = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + S.claim, params).fetchone()
    assert row is not None
    runs = [n for n in _plan_nodes(row[0][0]["Plan"]) if n.get("Alias") == "y"]
    assert runs, "the plan has no scan of the runs"
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in runs) == 0
    assert _walked_keys(row[0][0]["Plan"]) == 5


def test_claim_takes_whole_runs_of_few_keys_on_a_deep_backlog(url: str) -> None:
    """Depth first: the walk stops at the keys that promise a full batch, and the claim leases
    only their heads (the runs behind them are the heads' holder's)."""
    write(url, [("t", f"k{i}") for _ in range(3) for i in range(5)])
    with psycopg.connect(url, autocommit=True) as conn:
        params = _claim_params(url, limit=6, per_key=100)
        row = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + S.claim, params).fetchone()
        leased = conn.execute(
            "SELECT key, seq FROM outbox_messages WHERE lease_token IS NOT NULL ORDER BY key"
        ).fetchall()
    assert row is not None
    assert _walked_keys(row[0][0]["Plan"]) == 2
    assert row[0][0]["Plan"]["Actual Rows"] == 6
    assert leased == [("k0", 1), ("k1", 1)]


def test_claim_gives_each_key_at_most_its_per_key_share(url: str) -> None:
    """A hot key gives a claim its head and per_key_batch rows behind it at most; the rest of
    the batch goes to the keys after it, and the next claim starts after the last key."""
    write(url, [("t", "hot")] * 10 + [("t", f"k{i}") for i in range(4)])

    async def go() -> None:
        claim = await _claim(url, batch_size=8, per_key_batch=3)
        assert sorted(_seqs(claim)) == [("hot", s) for s in range(1, 5)] + [
            (f"k{i}", 1) for i in range(4)
        ]
        assert claim is not None
        await _mark(url, claim)
        # Alone now, the hot key's run fills the batch.
        assert _seqs(await _claim(url, batch_size=10, per_key_batch=100)) == [
            ("hot", s) for s in range(5, 11)
        ]

    asyncio.run(go())


def test_claim_checks_earlier_rows_per_head_not_by_scanning_the_table(url: str) -> None:
    """A hot key: finding its head is index probes; as an anti join it scanned every row."""
    with psycopg.connect(url) as conn:
        publish_batch(conn, [Message("t", "hot", {"i": i}) for i in range(20000)], wakeup=False)
        conn.commit()
    record(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE outbox_messages")
        params = _claim_params(url, limit=500, per_key=100)
        row = conn.execute(b"EXPLAIN (FORMAT JSON) " + S.claim, params).fetchone()
    assert row is not None
    nodes = _plan_nodes(row[0][0]["Plan"])
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes


def test_claim_plan_holds_when_statistics_say_nothing_is_pending(url: str) -> None:
    """A long published history, analyzed, then a fresh backlog: heads stay key-driven probes.

    With `m.status = 'pending'` the planner trusted "no pending rows" and read every pending
    row once per head through a partial index, or drove the join from them (seconds a claim).
    """
    with psycopg.connect(url) as conn:
        old = [Message("orders", f"k{i % 200}", {"i": i}) for i in range(6000)]
        publish_batch(conn, old, wakeup=False)
        conn.commit()
    record(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE outbox_messages SET status = 'published', published_at = now()")
        conn.execute("ANALYZE outbox_messages")
    with psycopg.connect(url) as conn:
        fresh = [Message("probe", f"k{i % 200}", {"i": i}) for i in range(2000)]
        publish_batch(conn, fresh, wakeup=False)
        conn.commit()
    record(url)
    with psycopg.connect(url) as conn:
        params = _claim_params(url, limit=100, per_key=100)
        row = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + S.claim, params).fetchone()
        conn.rollback()
    assert row is not None
    nodes = _plan_nodes(row[0][0]["Plan"])
    assert not [n for n in nodes if n.get("Index Name") == "outbox_messages_available_at_idx"]
    # one probe per key visited at most: never a loop over every pending row per head
    assert max(n["Actual Loops"] for n in nodes) <= 400


def _never_analyzed_backlog(url: str, published: int, pending: int, keys: int) -> None:
    """A published history and a backlog over ``keys`` keys, in a table never analyzed."""
    with psycopg.connect(url) as conn:
        old = [Message("t", f"k{i % keys}", {"i": i}) for i in range(published)]
        publish_batch(conn, old, wakeup=False)
        conn.commit()
        record(url)
        conn.execute("UPDATE outbox_messages SET status = 'published', published_at = now()")
        conn.commit()
        fresh = [Message("t", f"k{i % keys}", {"i": i}) for i in range(pending)]
        publish_batch(conn, fresh, wakeup=False)
        conn.commit()
        record(url)
        row = conn.execute(
            "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables"
            " WHERE relname = 'outbox_messages'"
        ).fetchone()
    assert row == (None, None), "the table must have no statistics for this test"


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
def test_claim_plan_probes_heads_by_key_without_statistics(url: str, plan_cache_mode: str) -> None:
    """Never analyzed (autovacuum off), prepared as the relay's driver prepares it: no scan of
    the table. As a join, the head rows were a sequential scan, and in the generic plan that
    scan drove the key probes (pending rows x keys loops: 22 s per claim in bench (d))."""
    _never_analyzed_backlog(url, published=5000, pending=300, keys=100)
    with psycopg.connect(url) as conn:
        conn.execute(f"SET plan_cache_mode = {plan_cache_mode}")
        params = _claim_params(url, limit=500, per_key=100)
        explain = b"EXPLAIN (ANALYZE, FORMAT JSON) " + S.claim
        row = conn.cursor().execute(explain, params, prepare=True).fetchone()
        conn.rollback()
    assert row is not None
    nodes = _plan_nodes(row[0][0]["Plan"])
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], "the claim scans the table"
    heads = [
        n
        for n in nodes
        if n.get("Relation Name") == "outbox_messages"
        and n.get("Index Name") == "outbox_messages_pkey"
    ]
    assert heads, "the head rows are not primary-key probes"
    # one probe per key (100) and per row behind a head (200) at most
    assert max(n["Actual Loops"] for n in nodes) <= 300
    assert row[0][0]["Plan"]["Actual Rows"] == 300


def test_claim_resumes_after_a_full_batch_else_from_the_first_key(url: str) -> None:
    write(url, [("t", f"k{i}") for i in range(6)])

    async def go() -> None:
        cfg = config(url, batch_size=4)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            full = await claim_batch(conn, S, cfg)
            assert _seqs(full) == [(f"k{i}", 1) for i in range(4)]
            assert resume_point(full, cfg) == ("t", "k3")  # k4, k5 have not had their turn
            rest = await claim_batch(conn, S, cfg, resume_point(full, cfg))
            assert _seqs(rest) == [("k4", 1), ("k5", 1)]
            assert resume_point(rest, cfg) == ("", "")  # every key visited: start over
            assert resume_point(None, cfg) == ("", "")

    asyncio.run(go())


def test_relay_claim_after_a_batch_that_was_not_full_is_one_statement(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a steady trickle every batch is small: the next claim must not start after its last
    key, find nothing there and wrap around (two statements per claim, bench (d))."""
    write(url, [("t", f"k{i}") for i in range(6)])
    starts: list[tuple[str, str]] = []
    real = _claim_module._claim_from

    async def counting(conn: Any, stmts: Any, cfg: Any, after: tuple[str, str], paused: Any) -> Any:
        starts.append(after)
        return await real(conn, stmts, cfg, after, paused)

    monkeypatch.setattr(_claim_module, "_claim_from", counting)

    async def go() -> None:
        relay = Relay(config(url, batch_size=4), FakePublisher())
        async with AsyncConnectionPool(url, kwargs={"autocommit": True}, open=False) as pool:
            first = await relay.claim(pool)
            second = await relay.claim(pool)
            assert first is not None
            assert second is not None
            assert len(second.envelopes) == 2
            write(url, [("t", "k0")])  # k0's next message, behind k0's leased head
            await _mark(url, first)
            starts.clear()
            third = await relay.claim(pool)
        assert _seqs(third) == [("k0", 2)]
        assert starts == [("", "")]

    asyncio.run(go())


def _keys_visited(plan: Any) -> int:
    """Rows produced by the claim's walk over keys (the `keys` CTE), from EXPLAIN ANALYZE."""
    if isinstance(plan, dict):
        if plan.get("Node Type") == "CTE Scan" and plan.get("CTE Name") == "keys":
            return int(plan["Actual Rows"]) * int(plan.get("Actual Loops", 1))
        return max((_keys_visited(v) for v in plan.values()), default=0)
    if isinstance(plan, list):
        return max((_keys_visited(v) for v in plan), default=0)
    return 0


def test_a_paused_topic_is_skipped_without_walking_its_keys(url: str) -> None:
    """A topic whose destination refuses messages is paused: the claim takes none of its rows
    and jumps past all its keys in one probe, so a large paused backlog costs nothing."""
    write(url, [("a-paused", f"k{i:04d}") for i in range(400)] + [("b", "k1"), ("b", "k2")])
    write(url, [("0-first", "k1")])
    with psycopg.connect(url, autocommit=True) as conn:
        params = {
            "limit": 50,
            "after_topic": "",
            "after_key": "",
            "per_key": 5,
            "owner": "r",
            "token": uuid.uuid4(),
            "lease_seconds": 5,
            "paused": ["a-paused"],
            **config(url).dead_policy_params(),
        }
        explain = b"EXPLAIN (ANALYZE, FORMAT JSON) " + S.claim
        [(plan,)] = conn.execute(explain, params).fetchall()
        conn.execute("UPDATE outbox_messages SET lease_token = NULL, lease_until = NULL")
        rows = conn.execute(S.claim, {**params, "token": uuid.uuid4()}).fetchall()
        without = conn.execute(
            S.claim, {**params, "token": uuid.uuid4(), "paused": [], "limit": 500}
        ).fetchall()
    assert sorted((r[1], r[2]) for r in rows) == [("0-first", "k1"), ("b", "k1"), ("b", "k2")]
    assert _keys_visited(plan) <= 6  # 0-first, a-paused's first key, b's two, the ends
    assert len(without) == 400  # not paused: its heads are claimed as usual
