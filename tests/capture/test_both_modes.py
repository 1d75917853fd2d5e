"""The same delivery, order, failure and operations tests in both capture modes: 'polling' (on
the machine's PostgreSQL) and 'wal' (on the private wal_level = logical cluster).

What differs between the modes is how the relay learns of a committed message; what a user can
observe must not: every committed message published, in per-key order with gapless seqs,
retries and dead letters by the topic's policy, an outage never counted as an attempt, and the
operator's tools (status, dead letters, retention) reading the same rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections import Counter, defaultdict

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox import Message, publish_batch
from outbox._capture import encode_record
from outbox.envelope import Envelope
from relay import PermanentPublishError, Relay, RetryablePublishError, TopicPolicy
from relay.admin import DeadFilter, dead_list, dead_retry, delete_published, relay_status
from relay.brokers import publisher_for_url
from tests.relay.broker_helpers import nats_stream
from tests.relay.relay_helpers import (
    FakePublisher,
    await_for,
    config,
    per_key_in_order,
    running,
    statuses,
)
from tests.support.services import require_port


@pytest.fixture(params=["polling", "wal"])
def mode_url(request: pytest.FixtureRequest) -> str:
    """A fresh migrated database in the given capture mode."""
    url: str = request.getfixturevalue("database_url" if request.param == "polling" else "wal_url")
    assert relay_status(url).capture["mode"] == request.param
    return url


def write(url: str, pairs: list[tuple[str, str]]) -> None:
    """Commit one message per (topic, key), in order, in one transaction."""
    with psycopg.connect(url) as conn:
        publish_batch(conn, [Message(t, k, {"n": i}) for i, (t, k) in enumerate(pairs)])
        conn.commit()


def published(url: str) -> int:
    return statuses(url).get("published", 0)


def seqs_by_key(url: str) -> dict[str, list[int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT key, seq FROM outbox_messages ORDER BY key, seq").fetchall()
    out: dict[str, list[int]] = defaultdict(list)
    for key, seq in rows:
        out[key].append(seq)
    return out


def test_concurrent_writers_and_two_relays_publish_each_once_in_key_order(mode_url: str) -> None:
    keys = [f"k{i}" for i in range(12)]
    log: list[tuple[str, Envelope]] = []
    relays = [Relay(config(mode_url, batch_size=16), FakePublisher(log, f"r{i}")) for i in (1, 2)]

    def writer(w: int) -> None:
        for n in range(10):
            write(mode_url, [("orders", keys[(w + n + i) % len(keys)]) for i in range(5)])

    async def go() -> None:
        async with running(*relays):
            threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                await asyncio.to_thread(t.join)
            await await_for(lambda: published(mode_url) == 200, 30, "every message published")

    asyncio.run(go())
    assert len(log) == 200
    assert len({e.id for _, e in log}) == 200  # each once
    assert per_key_in_order(log)
    for key, seqs in seqs_by_key(mode_url).items():
        assert seqs == list(range(1, len(seqs) + 1)), key  # gapless, in commit order


def test_retries_then_dead_letters_by_policy_keeping_key_order(mode_url: str) -> None:
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
    policy = {"t": TopicPolicy(on_dead="hold", max_attempts=5)}
    relay = Relay(config(mode_url, topics=policy), pub)

    async def go() -> None:
        async with running(relay):
            write(mode_url, [("t", "a")] * 3 + [("t", "b")] * 2 + [("t", "c")] * 2)
            await await_for(lambda: published(mode_url) == 5, 20, "a1-3 and c1-2 published")
            await await_for(lambda: statuses(mode_url).get("dead") == 1, 20, "b1 dead")

    asyncio.run(go())
    assert tries[("a", 2)] == 3  # two failures, then the third try went through
    # a3 may have gone out in a2's batch before a2 succeeded; it is sent again after a2, so the
    # last copy of each message arrives in key order
    wire = [e.seq for _, e in pub.log if e.key == "a"]
    last_copy = {seq: i for i, seq in enumerate(wire)}
    assert last_copy[1] < last_copy[2] < last_copy[3]
    with psycopg.connect(mode_url) as conn:
        b = conn.execute(
            "SELECT seq, status, last_error FROM outbox_messages WHERE key = 'b' ORDER BY seq"
        ).fetchall()
    assert b[0][:2] == (1, "dead")
    assert "too large" in b[0][2]
    assert b[1][:2] == (2, "pending")  # held behind its dead predecessor, never marked


def test_a_permanent_refusal_is_dead_at_its_first_attempt(mode_url: str) -> None:
    """The relay that numbers a batch sends it in both modes; a refusal there is settled as a
    claim's would be: one attempt, dead at once when permanent, its error stored masked."""
    tries: Counter[str] = Counter()

    def fail(env: Envelope) -> BaseException | None:
        tries[env.key] += 1
        if env.key == "bad":
            return PermanentPublishError("refused by amqp://user:hunter2@broker")
        return None

    pub = FakePublisher()
    pub.fail = fail
    relay = Relay(config(mode_url, topics={"t": TopicPolicy(on_dead="skip")}), pub)

    async def go() -> None:
        async with running(relay):
            write(mode_url, [("t", "bad"), ("t", "good")])
            await await_for(lambda: statuses(mode_url).get("dead") == 1, 20, "bad dead")
            await await_for(lambda: published(mode_url) == 1, 20, "good published")

    asyncio.run(go())
    assert tries["bad"] == 1  # never sent again
    with psycopg.connect(mode_url, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT attempts, last_error FROM outbox_messages WHERE key = 'bad'"
        ).fetchone()
    assert row is not None
    assert row["attempts"] == 1
    assert "hunter2" not in row["last_error"]
    assert "PermanentPublishError" in row["last_error"]


def test_an_outage_loses_nothing_and_counts_no_attempt(mode_url: str) -> None:
    pub = FakePublisher()
    pub.down = RetryablePublishError("connection refused")
    relay = Relay(config(mode_url, topics={"t": TopicPolicy(max_attempts=2)}), pub)

    def attempts() -> int:
        """Attempts charged. A claim counts its attempt when it leases a row, and giving the
        row back (an outage) takes it back: a claim in flight is left out, in one snapshot."""
        with psycopg.connect(mode_url) as conn:
            row = conn.execute(
                "SELECT coalesce(max(attempts - (lease_token IS NOT NULL)::int), 0) "
                "FROM outbox_messages"
            ).fetchone()
        return int(row[0]) if row else -1

    async def go() -> None:
        async with running(relay):
            write(mode_url, [("t", f"k{i % 4}") for i in range(20)])
            outage = relay.dispatcher.broker_backoff
            # the relay met the outage (rows recorded in 'wal' mode, claims paused in both)
            await await_for(lambda: outage.failures >= 2, 20, "two outage rounds")
            assert published(mode_url) == 0
            assert attempts() == 0  # an outage is the broker's, never a message's attempt
            pub.down = None
            await await_for(lambda: published(mode_url) == 20, 30, "recovery")

    asyncio.run(go())
    assert statuses(mode_url) == {"published": 20}
    assert per_key_in_order(pub.log)


def test_operators_see_and_fix_the_same_rows(mode_url: str) -> None:
    pub = FakePublisher()
    pub.fail = lambda env: PermanentPublishError("schema") if env.key == "bad" else None
    relay = Relay(config(mode_url, topics={"t": TopicPolicy(on_dead="skip")}), pub)

    async def go() -> None:
        async with running(relay):
            write(mode_url, [("t", "bad"), ("t", "good"), ("t", "good")])
            await await_for(lambda: statuses(mode_url).get("dead") == 1, 20, "bad dead")
            await await_for(lambda: published(mode_url) == 2, 20, "good published")
            dead = dead_list(mode_url, DeadFilter(topic="t"))
            assert [(m.key, m.seq) for m in dead] == [("bad", 1)]
            pub.fail = lambda env: None  # the consumer's schema was fixed
            assert dead_retry(mode_url, DeadFilter(key="bad"), actor="ops") == [dead[0].id]
            await await_for(lambda: published(mode_url) == 3, 20, "the retried message")

    asyncio.run(go())
    status = relay_status(mode_url)
    assert not [t for t in status.topics if t["pending"] or t["dead"]]
    assert delete_published(mode_url, older_than=0) == 3  # retention reads the same rows
    assert statuses(mode_url) == {}


def test_relay_to_nats_jetstream_in_commit_order(mode_url: str) -> None:
    require_port(4222, "NATS", "start nats-server -js on 127.0.0.1:4222")

    async def go() -> dict[str, list[int]]:
        async with nats_stream() as (js, stream, subject):
            publisher = publisher_for_url(
                "nats://127.0.0.1:4222", destinations={"t": subject}, timeout=1.5
            )
            async with running(Relay(config(mode_url), publisher)):
                for n in range(5):
                    write(mode_url, [("t", f"k{(n + i) % 3}") for i in range(20)])
                await await_for(lambda: published(mode_url) == 100, 30, "published")
            info = await js.stream_info(stream)
            seen: dict[str, list[int]] = defaultdict(list)
            for n in range(1, info.state.messages + 1):
                msg = await js.get_msg(stream, n)
                seen[msg.headers["outbox-key"]].append(int(msg.headers["outbox-seq"]))
            return seen

    seen = asyncio.run(go())
    assert seen == seqs_by_key(mode_url)  # each once, in seq order, as numbered in the table


def _steer_from_the_ledger(url: str, topic: str, keys: list[str]) -> None:
    """Rows of ``topic`` inserted straight into the ledger, as a role that may insert there
    could: publish() and outbox_publish() refuse such a topic, the relay reads what is there."""
    with psycopg.connect(url) as conn:
        for key in keys:
            msg_id = uuid.uuid4()
            record = encode_record(
                msg_id, topic, key, "application/json", None, "{}", b"{}", None, False
            )
            conn.execute(
                "INSERT INTO outbox_wal_pending (id, record) VALUES (%s, %s)", (msg_id, record)
            )


def test_a_topic_written_straight_into_the_ledger_cannot_steer_the_broker(
    mode_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay that numbers a batch sends it, so a row of the ledger whose topic is the
    JetStream admin API reaches the send path without a claim: it is refused before anything
    is sent, its topic pauses there (its later rows wait, untried), other topics flow."""
    require_port(4222, "NATS", "start nats-server -js on 127.0.0.1:4222")
    victim = f"VICTIM_{uuid.uuid4().hex[:10]}"
    steering = f"$JS.API.STREAM.DELETE.{victim}"
    tries: Counter[str] = Counter()

    async def go() -> tuple[int, int]:
        async with nats_stream() as (js, _stream, subject):
            await js.add_stream(name=victim, subjects=[f"{victim.lower()}.>"])
            await js.publish(f"{victim.lower()}.x", b"kept")
            publisher = publisher_for_url(
                "nats://127.0.0.1:4222", destinations={"t": subject}, timeout=1.5
            )
            sending = publisher.publish_batch

            async def counted(envelopes: list[Envelope]) -> list[BaseException | None]:
                tries.update(e.topic for e in envelopes)
                return await sending(envelopes)

            monkeypatch.setattr(publisher, "publish_batch", counted)
            # a pause of 15 s or more: the claim loop's probe cannot come within the test
            relay = Relay(config(mode_url, backoff_base=30.0, backoff_max=30.0), publisher)
            try:
                async with running(relay):
                    snapshot = relay.dispatcher.destinations.snapshot
                    _steer_from_the_ledger(mode_url, steering, ["h0"])
                    await await_for(lambda: steering in snapshot(), 20, "the topic's pause")
                    _steer_from_the_ledger(mode_url, steering, [f"h{i}" for i in range(1, 6)])
                    write(mode_url, [("t", "good")])
                    await await_for(lambda: published(mode_url) == 1, 20, "the good message")
                    await await_for(lambda: statuses(mode_url).get("pending") == 6, 20, "rows")
                    pause = snapshot()[steering]
                    # read before the pause (15 s or more) can end and the claim loop probe
                    sends = tries[steering]
                info = await js.stream_info(victim)  # NotFoundError had it been deleted
                assert "not a name" in pause["reason"]
                return int(info.state.messages), sends
            finally:
                with contextlib.suppress(Exception):  # cleanup; the assertions are the test
                    await js.delete_stream(victim)

    kept, sends = asyncio.run(go())
    assert kept == 1  # the victim stream is intact, with its message
    assert sends == 1  # refused once; the paused topic's later rows were not tried
    with psycopg.connect(mode_url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT status, attempts FROM outbox_messages WHERE topic = %s", (steering,)
        ).fetchall()
    assert rows == [{"status": "pending", "attempts": 0}] * 6  # untried, uncharged
