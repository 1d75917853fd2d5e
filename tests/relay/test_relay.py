"""The relay loop on a real PostgreSQL: several relays, retries, dead letters, outages."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from outbox import Message, publish_batch
from outbox.envelope import Envelope
from relay import PermanentPublishError, Relay, RetryablePublishError, TopicPolicy
from tests.relay.relay_helpers import (
    ClaimRounds,
    FakePublisher,
    await_for,
    config,
    per_key_in_order,
    running,
    statuses,
    write,
)

KEYS = [f"k{i}" for i in range(8)]


def _registered(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_relays").fetchone()
    return int(row[0]) if row else 0


def _published(url: str) -> int:
    return statuses(url).get("published", 0)


def test_relay_three_relays_publish_everything_once_in_key_order(url: str) -> None:
    keys = [f"s{i}" for i in range(60)]  # shared; more keys than 3 relays x 2 claims x 8
    log: list[tuple[str, Envelope]] = []
    pubs = [FakePublisher(log, name=f"r{i}") for i in range(3)]
    for p in pubs:
        p.delay = 0.02
    relays = [Relay(config(url, batch_size=8, per_key_batch=3, max_in_flight=2), p) for p in pubs]

    async def go() -> None:
        async with running(*relays):
            await await_for(lambda: _registered(url) == 3, what="three relays up")
            await asyncio.to_thread(write, url, [("orders", k) for _ in range(10) for k in keys])
            for _ in range(5):  # more commits while the relays run
                await asyncio.to_thread(write, url, [("orders", k) for k in keys] * 2)
            await await_for(lambda: _published(url) == 1200, what="all published")

    asyncio.run(go())
    assert len(log) == 1200
    assert len({e.id for _, e in log}) == 1200  # each once: no duplicates in normal operation
    assert per_key_in_order(log)
    by_relay = Counter(name for name, _ in log)
    assert len(by_relay) == 3, f"work did not spread: {by_relay}"


def test_relay_retries_then_dead_letters_keeping_key_order(url: str) -> None:
    write(url, [("t", "a")] * 3 + [("t", "b")] * 2 + [("t", "c")] * 2)
    tries: Counter[tuple[str, int]] = Counter()

    def fail(env: Envelope) -> BaseException | None:
        tries[(env.key, env.seq)] += 1
        if env.key == "a" and env.seq == 2 and tries[("a", 2)] < 3:
            return RetryablePublishError("nack")
        if env.key == "b" and env.seq == 1:
            return PermanentPublishError("too large")
        return None

    pub = FakePublisher()
    pub.fail = fail
    relay = Relay(config(url, topics={"t": TopicPolicy(on_dead="hold", max_attempts=5)}), pub)
    rounds = ClaimRounds(relay)

    async def go() -> None:
        async with running(relay):
            await await_for(lambda: _published(url) == 5, what="a1-3, c1-2 published")
            await rounds.more(3)  # b2 must stay held behind the dead b1

    asyncio.run(go())
    # a3 was already in flight when a2 failed (one batch): it is not marked, and is sent again
    # after a2, so the last copy of each message arrives in key order.
    wire = [e.seq for _, e in pub.log if e.key == "a"]
    assert wire[-2:] == [2, 3]
    assert wire[0] == 1
    assert tries[("a", 2)] == 3
    last_copy = {seq: i for i, seq in enumerate(wire)}
    assert last_copy[1] < last_copy[2] < last_copy[3]
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT key, seq, status, attempts, last_error FROM outbox_messages "
            "WHERE key = 'b' ORDER BY seq"
        ).fetchall()
    assert rows[0][:3] == ("b", 1, "dead")
    assert "too large" in rows[0][4]
    assert rows[1][:3] == ("b", 2, "pending")


def test_relay_max_attempts_dead_letters_and_skip_policy_moves_on(url: str) -> None:
    write(url, [("t", "a")] * 2)
    pub = FakePublisher()
    pub.fail = lambda e: RetryablePublishError("nope") if (e.key, e.seq) == ("a", 1) else None
    # a second, healthy key so the failures are per message, not a broker outage
    write(url, [("u", "z")])
    relay = Relay(config(url, topics={"t": TopicPolicy(on_dead="skip", max_attempts=2)}), pub)

    async def go() -> None:
        async with running(relay):
            await await_for(lambda: _published(url) == 2, what="a2 and z1 published")

    asyncio.run(go())
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status, attempts FROM outbox_messages WHERE key = 'a' AND seq = 1"
        ).fetchone()
    assert row == ("dead", 2)


def test_relay_broker_down_loses_nothing_and_recovers(url: str) -> None:
    write(url, [("t", k) for _ in range(5) for k in KEYS])
    pub = FakePublisher()
    pub.down = RetryablePublishError("connection refused")
    relay = Relay(config(url, topics={"t": TopicPolicy(max_attempts=2)}), pub)

    async def go() -> None:
        async with running(relay):
            await await_for(lambda: pub.calls >= 3, what="three rounds while the broker is down")
            assert _published(url) == 0
            with psycopg.connect(url) as conn:
                # as charged: a claim in flight counted its attempt and gives it back with
                # the row (an outage), so it is left out, in the same snapshot
                attempts = conn.execute(
                    "SELECT max(attempts - (lease_token IS NOT NULL)::int) FROM outbox_messages"
                ).fetchone()
            assert attempts == (0,)  # an outage never counts towards max_attempts
            pub.down = None
            await await_for(lambda: _published(url) == 40, what="recovery")

    asyncio.run(go())
    assert statuses(url) == {"published": 40}
    assert per_key_in_order(pub.log)


def test_relay_at_most_once_marks_before_sending_and_never_retries(url: str) -> None:
    write(url, [("amo", "a")] * 3)
    pub = FakePublisher()
    pub.fail = lambda e: RetryablePublishError("lost") if e.seq == 2 else None
    relay = Relay(config(url, topics={"amo": TopicPolicy(semantics="at-most-once")}), pub)
    rounds = ClaimRounds(relay)

    async def go() -> None:
        async with running(relay):
            await await_for(lambda: _published(url) == 3, what="all marked")
            await rounds.more(3)  # a retry of 2 would have been claimed by now

    asyncio.run(go())
    assert [e.seq for _, e in pub.log] == [1, 3]  # 2 was lost and never retried


def test_relay_wakes_on_notify_without_polling(url: str) -> None:
    pub = FakePublisher()
    # no commit watch: within 30 s only the doorbell's NOTIFY can wake it
    relay = Relay(config(url, poll_interval=30.0, watch=False), pub)
    rounds = ClaimRounds(relay)

    async def go() -> None:
        async with running(relay):
            # past the first poll, listening: now only a NOTIFY can wake it within 30 s
            await await_for(lambda: rounds.count >= 1 and relay.state.listening, what="idle")

            def commit() -> None:
                with psycopg.connect(url) as conn:
                    publish_batch(conn, [Message(topic="t", key="k", payload=1)], wakeup=True)
                    conn.commit()

            await asyncio.to_thread(commit)
            await await_for(lambda: len(pub.log) == 1, within=5.0, what="wake-up by NOTIFY")

    asyncio.run(go())


def test_relay_survives_lost_database_connections(url: str) -> None:
    pub = FakePublisher()
    relay = Relay(config(url), pub)

    def kill_others() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        return int(row[0]) if row else 0

    async def go() -> None:
        async with running(relay):
            write(url, [("t", "a")] * 3)
            await await_for(lambda: len(pub.log) == 3, what="first messages")
            assert await asyncio.to_thread(kill_others) >= 1
            write(url, [("t", "a")] * 3)
            await await_for(lambda: len(pub.log) == 6, what="published after reconnect")

    asyncio.run(go())
    assert per_key_in_order(pub.log)


def test_relay_stop_releases_leases_of_unfinished_batches(url: str) -> None:
    write(url, [("t", "a")] * 4)
    pub = FakePublisher()
    pub.delay = 10.0  # stuck in the broker call
    relay = Relay(config(url, lease_seconds=30, publish_timeout=20, shutdown_timeout=0.5), pub)

    async def go() -> None:
        async with running(relay):

            def leased() -> bool:
                with psycopg.connect(url) as conn:
                    row: Any = conn.execute(
                        "SELECT count(*) FROM outbox_messages WHERE lease_token IS NOT NULL"
                    ).fetchone()
                return bool(row[0] == 1)  # the key's head: its lease holds the key's run

            await await_for(leased, what="claimed")

    asyncio.run(go())
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*), max(attempts) FROM outbox_messages "
            "WHERE status = 'pending' AND lease_token IS NULL"
        ).fetchone()
    assert row == (4, 0)


def test_relay_marks_at_most_once_durably_and_the_rest_without_flush_wait(
    url: str, monkeypatch: Any
) -> None:
    import relay._dispatch as relay_module
    from relay._claim import mark_batch, relay_session

    write(url, [("amo", "a"), ("alo", "b")])
    calls: list[tuple[set[str], bool, str]] = []

    async def spy(
        conn: Any, stmts: Any, token: Any, outcomes: Any, *, durable: bool = False
    ) -> Any:
        cur = await conn.execute("SHOW synchronous_commit")
        setting = (await cur.fetchone())[0]
        calls.append(({o.action for o in outcomes}, durable, setting))
        return await mark_batch(conn, stmts, token, outcomes, durable=durable)

    monkeypatch.setattr(relay_module, "mark_batch", spy)
    pub = FakePublisher()
    relay = Relay(config(url, topics={"amo": TopicPolicy(semantics="at-most-once")}), pub)

    async def go() -> None:
        async with running(relay):
            await await_for(lambda: _published(url) == 2, what="both published")

    asyncio.run(go())
    assert ({"published"}, True, "off") in calls  # the at-most-once mark, before sending
    assert [durable for _, durable, _ in calls].count(True) == 1

    async def session_setting() -> str:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await relay_session(conn)
            cur = await conn.execute("SHOW synchronous_commit")
            row = await cur.fetchone()
            assert row is not None
            return str(row[0])

    assert asyncio.run(session_setting()) == "off"


def test_durable_mark_runs_with_synchronous_commit_on(url: str) -> None:
    from relay._claim import Outcome, claim_batch, mark_batch, relay_session
    from relay._statements import relay_statements

    write(url, [("t", "k")])

    async def go() -> list[str]:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await relay_session(conn)
            stmts = relay_statements(None)
            claim = await claim_batch(conn, stmts, config(url), ("", ""))
            assert claim is not None
            seen: list[str] = []
            execute = conn.execute

            async def recording(query: Any, params: Any = None) -> Any:
                cur = await execute("SHOW synchronous_commit")
                row = await cur.fetchone()
                assert row is not None
                seen.append(str(row[0]))
                return await execute(query, params)

            conn.execute = recording  # type: ignore[method-assign]
            ids = await mark_batch(
                conn,
                stmts,
                claim.token,
                [Outcome(claim.envelopes[0].id, "published")],
                durable=True,
            )
            assert len(ids) == 1
            return seen

    seen = asyncio.run(go())
    assert seen[-1] == "on"  # the mark itself ran with the flush wait
    assert statuses(url) == {"published": 1}


def test_relay_database_backoff_survives_thousands_of_failures() -> None:
    # Nothing listens on port 1: every query fails. After hours of that the failure count
    # is in the thousands, and 0.1 * 2**count overflowed a float, raising out of run().
    bad_url = "postgresql://postgres@127.0.0.1:1/none"
    relay = Relay(config(bad_url, listen=False, heartbeat_interval=60), FakePublisher())
    relay.db_backoff.failures = 5000

    async def go() -> None:
        task = asyncio.create_task(relay.run())  # its startup probe waits for the database
        await await_for(
            lambda: relay.db_backoff.failures > 5000 or task.done(), what="a failed probe"
        )
        relay.stop()
        await asyncio.wait_for(task, 15)  # re-raises what escaped run()
        # the claim's backoff too (stopped: its sleep returns at once)
        relay.db_backoff.failures = 5000
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(bad_url, open=False)
        await pool.open(wait=False)
        try:
            assert await relay.claim(pool) is None
        finally:
            await pool.close(timeout=1)
        assert relay.db_backoff.failures == 5001

    asyncio.run(go())


def test_relay_broker_pause_survives_thousands_of_outage_rounds(url: str) -> None:
    write(url, [("t", k) for k in KEYS])
    pub = FakePublisher()
    pub.down = RetryablePublishError("connection refused")
    relay = Relay(config(url), pub)
    relay.dispatcher.broker_backoff.failures = 5000

    async def go() -> None:
        async with running(relay):
            outage = relay.dispatcher.broker_backoff
            await await_for(lambda: outage.failures > 5000, what="an outage round")
            await await_for(lambda: not relay.in_flight, what="the round to finish")
            # paused for the longest pause (10 s), not a tight loop of claims
            assert relay.dispatcher.paused_until - time.monotonic() > 5

    asyncio.run(go())
    assert statuses(url) == {"pending": 8}
