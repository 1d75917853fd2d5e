"""A key's lease is its head's: claims write the head only, the run behind it is the holder's,
and a mark applies only while the head still carries the claim's token."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg

from outbox.envelope import Envelope
from relay import Relay
from relay._claim import Claim, Outcome, claim_batch, mark_batch
from relay._statements import relay_statements
from relay.brokers.base import Publisher
from tests.relay.broker_helpers import nats_stream, need
from tests.relay.relay_helpers import await_for, config, db_clock_past, running, statuses, write

S = relay_statements(None)


async def _claim(url: str, **kw: Any) -> Claim | None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await claim_batch(conn, S, config(url, **kw))


async def _mark(url: str, claim: Claim, outcomes: Sequence[Outcome]) -> set[uuid.UUID]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await mark_batch(conn, S, claim.token, outcomes)


def _rows(url: str) -> list[tuple[int, str, int, bool]]:
    """(seq, status, attempts, leased) of every row, in seq order."""
    with psycopg.connect(url) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT seq, status, attempts, lease_token IS NOT NULL FROM outbox_messages "
            "ORDER BY key, seq"
        ).fetchall()


def test_a_retry_of_a_runs_middle_row_makes_it_the_keys_head(url: str) -> None:
    write(url, [("t", "a")] * 5)

    async def go() -> None:
        claim = await _claim(url)
        assert claim is not None
        assert [e.seq for e in claim.envelopes] == [1, 2, 3, 4, 5]
        assert claim.attempts == [1] * 5  # this claim's try of each row
        assert _rows(url) == [(1, "pending", 1, True)] + [
            (s, "pending", 0, False) for s in (2, 3, 4, 5)
        ]
        ids = [e.id for e in claim.envelopes]
        outcomes = [
            Outcome(ids[0], "published"),
            Outcome(ids[1], "published"),
            Outcome(ids[2], "retry", delay=0.5, error="boom"),
            Outcome(ids[3], "release"),
            Outcome(ids[4], "release"),
        ]
        assert await _mark(url, claim, outcomes) == set(ids)
        # each row written once: published (counted), retried (counted), released (untried)
        assert _rows(url) == [
            (1, "published", 1, False),
            (2, "published", 1, False),
            (3, "pending", 1, False),
            (4, "pending", 0, False),
            (5, "pending", 0, False),
        ]
        # Row 3 is the key's head now, postponed: nobody takes it or the rows behind it.
        assert await _claim(url, relay_id="other") is None
        await db_clock_past(url, "SELECT max(available_at) FROM outbox_messages")
        again = await _claim(url, relay_id="other")
        assert again is not None
        assert [e.seq for e in again.envelopes] == [3, 4, 5]
        assert again.attempts == [2, 1, 1]

    asyncio.run(go())


def test_a_lapsed_heads_first_holder_changes_nothing_of_the_run(url: str) -> None:
    """Relay A's lease lapses and B claims the key: whatever A marks (published, retry, dead,
    release) for the key's rows changes none of them; B's mark applies."""
    write(url, [("t", "a")] * 4)

    async def go() -> None:
        stale = await _claim(url, lease_seconds=0.3, publish_timeout=0.1, relay_id="A")
        assert stale is not None
        await db_clock_past(url, "SELECT max(lease_until) FROM outbox_messages")
        taken = await _claim(url, relay_id="B")
        assert taken is not None
        assert [e.seq for e in taken.envelopes] == [1, 2, 3, 4]
        before = _rows(url)
        ids = [e.id for e in stale.envelopes]
        for action in ("published", "retry", "dead", "release"):
            outcomes = [Outcome(i, action, delay=60.0, error="late") for i in ids]  # type: ignore[arg-type]
            assert await _mark(url, stale, outcomes) == set()
            assert _rows(url) == before
        # A mark naming only the run's rows (not the head) is refused too, for either claim.
        assert await _mark(url, taken, [Outcome(i, "published") for i in ids[1:]]) == set()
        assert await _mark(url, taken, [Outcome(i, "published") for i in ids]) == set(ids)
        assert statuses(url) == {"published": 4}

    asyncio.run(go())


class _Counted:
    """Wraps a real adapter; counts what the broker acknowledged through this relay.

    With a ``barrier``, the relay's first send waits until every relay sharing the barrier has
    begun a send of its own, that is until each holds a claim: one relay cannot drain the
    backlog before the other has claimed, however fast or idle the machine is."""

    def __init__(self, inner: Publisher, barrier: _Barrier | None = None) -> None:
        self.inner = inner
        self.features = inner.features
        self.acked: Counter[uuid.UUID] = Counter()
        self.barrier = barrier

    async def start(self) -> None:
        await self.inner.start()

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        if self.barrier is not None:
            await self.barrier.arrive(self)
        results = await self.inner.publish_batch(envelopes)
        self.acked.update(e.id for e, r in zip(envelopes, results, strict=True) if r is None)
        return list(results)

    async def close(self) -> None:
        await self.inner.close()


class _Barrier:
    """Opens once ``parties`` distinct publishers have each started a send."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived: set[int] = set()
        self.open = asyncio.Event()

    async def arrive(self, who: object) -> None:
        self.arrived.add(id(who))
        if len(self.arrived) >= self.parties:
            self.open.set()
        await self.open.wait()


def test_two_relays_drain_a_deep_backlog_of_few_keys_to_nats_once_in_key_order(url: str) -> None:
    """Depth-first claims over 4 keys of 150 rows: the two relays share the keys, every
    message reaches JetStream once (counted at the relays, not hidden by the broker's dedup)
    and each key's stream order is its seq order.

    The sharing is arranged, not hoped for: a relay's first send waits at a barrier until the
    other relay has claimed too. One claim in flight per relay, of 50 rows at most 20 per key,
    holds at most 3 of the 4 keys' heads, so the other always finds a free key (with two in
    flight, a relay waiting at the barrier could hold every key and the other none). Without
    the barrier one relay may drain all 600 rows before the other's first claim, on a quiet
    machine."""
    need(4222, "nats-server")
    from relay.brokers import publisher_for_url

    async def go() -> tuple[list[_Counted], list[Envelope]]:
        async with nats_stream() as (js, stream, subject):
            write(url, [(subject, f"k{i}") for _ in range(150) for i in range(4)])
            barrier = _Barrier(2)
            pubs = [
                _Counted(publisher_for_url("nats://127.0.0.1:4222", timeout=10.0), barrier)
                for _ in range(2)
            ]
            relays = [
                # The wait at the barrier counts against the send's budget: budgets and the
                # lease are long enough that neither it nor a loaded machine fails a send.
                Relay(
                    config(
                        url,
                        batch_size=50,
                        per_key_batch=20,
                        max_in_flight=1,
                        publish_timeout=20.0,
                        lease_seconds=30.0,
                    ),
                    p,
                )
                for p in pubs
            ]
            async with running(*relays):
                await await_for(lambda: barrier.open.is_set(), what="both relays claimed")
                await await_for(lambda: statuses(url) == {"published": 600}, what="drained")
            info = await js.stream_info(stream)
            stored = []
            for n in range(1, info.state.messages + 1):
                msg = await js.get_msg(stream, n)
                stored.append(Envelope.from_headers(msg.headers or {}, msg.data or b""))
            return pubs, stored

    pubs, stored = asyncio.run(go())
    acked = pubs[0].acked + pubs[1].acked
    assert len(acked) == 600
    assert set(acked.values()) == {1}  # each message published once
    assert all(p.acked for p in pubs), "a relay published nothing"
    assert len(stored) == 600
    for key in ("k0", "k1", "k2", "k3"):
        assert [e.seq for e in stored if e.key == key] == list(range(1, 151))
