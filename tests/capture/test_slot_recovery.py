"""'wal' mode loses nothing when its slot goes: every committed message has a row
(``outbox_wal_pending``) until the relay records it, and a relay that finds its slot missing or
invalidated makes a fresh one and publishes what the table holds first, each key in order
with a gapless seq. On the private logical cluster of tests/capture (conftest.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from typing import Any

import orjson
import psycopg
import pytest

from outbox import ConfigurationError, publish
from relay import Relay
from relay._admin import enable_capture, relay_status
from relay._statements import relay_statements
from tests.capture.test_wal_capture import _in_loop, _rows, _until
from tests.relay.relay_helpers import FakePublisher, config, running


def _slot(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT slot FROM outbox_capture").fetchone()
    assert row is not None
    return str(row[0])


def _drop_slot(url: str, slot: str) -> None:
    """Drop the slot as an operator (or a failover, a restore) would: its walsender first."""
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(100):
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (slot,),
            )
            try:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                return
            except psycopg.errors.ObjectInUse:  # the walsender is exiting, or a new one came
                conn.execute("SELECT pg_sleep(0.05)")
    raise AssertionError(f"could not drop slot {slot}")


def _write(
    url: str, key: str, count: int, written: list[tuple[str, int]], start: int = 0
) -> None:
    """``count`` messages on ``key``, one transaction each, in order (one writer per key),
    numbered from ``start`` in their payload."""
    with psycopg.connect(url) as conn:
        for n in range(start, start + count):
            publish(conn, topic="t", key=key, payload={"n": n})
            conn.commit()
            written.append((key, n))


def _check(url: str, log: list[Any], written: list[tuple[str, int]]) -> None:
    """Every committed message published, each key gapless 1..n in its writer's order, and the
    first publication of each (key, seq) in order with each seq one message only."""
    rows = _rows(url)
    per_key: dict[str, list[int]] = defaultdict(list)
    for _id, _topic, key, seq, status in rows:
        assert status == "published"
        per_key[key].append(seq)
    expected: dict[str, int] = defaultdict(int)
    for key, _n in written:
        expected[key] += 1
    assert {k: len(v) for k, v in per_key.items()} == dict(expected)  # 0 lost
    for key, seqs in per_key.items():
        assert seqs == list(range(1, len(seqs) + 1)), key  # gapless
    by_seq: dict[tuple[str, int], set[Any]] = defaultdict(set)
    order: dict[str, list[int]] = defaultdict(list)
    for _name, env in log:
        by_seq[(env.key, env.seq)].add(env.id)
        if env.seq > len(order[env.key]):
            order[env.key].append(int(orjson.loads(env.payload)["n"]))
    assert all(len(ids) == 1 for ids in by_seq.values())  # no seq for two messages
    for key, ns in order.items():
        assert ns == sorted(ns) == list(range(len(ns))), key  # each key in commit order


@_in_loop
async def test_a_slot_dropped_while_relays_are_down_loses_nothing(wal_url: str) -> None:
    written: list[tuple[str, int]] = []
    threads = [
        threading.Thread(target=_write, args=(wal_url, f"k{i}", 20, written)) for i in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        await asyncio.to_thread(t.join)
    _drop_slot(wal_url, _slot(wal_url))
    publisher = FakePublisher()
    async with running(Relay(config(wal_url), publisher)):
        await _until(lambda: len(_rows(wal_url)) >= 60, 30, "every message recorded")
        await _until(
            lambda: all(r[4] == "published" for r in _rows(wal_url)), 30, "every one published"
        )
        await _until(
            lambda: relay_status(wal_url).capture.get("slot_state") == "ok", 30, "a fresh slot"
        )
        # and capture goes on from the fresh slot
        await asyncio.to_thread(_write, wal_url, "k0", 5, written, 20)
        await _until(lambda: len(_rows(wal_url)) >= 65, 30, "the later messages")
        await _until(
            lambda: all(r[4] == "published" for r in _rows(wal_url)), 30, "every one published"
        )
    _check(wal_url, publisher.log, written)


def _invalidate(url: str, slot: str) -> None:
    """Push the slot past max_slot_wal_keep_size (1 MB for the moment) and checkpoint: the
    server invalidates it (wal_status 'lost')."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            for _ in range(60):
                row = conn.execute(
                    "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
                if row is not None and row[0] == "lost":
                    return
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS filler (x int)")
                conn.execute("INSERT INTO filler SELECT generate_series(1, 1000)")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
            raise AssertionError(f"slot {slot} was not invalidated")
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")


@_in_loop
async def test_a_slot_invalidated_while_relays_are_down_loses_nothing(wal_url: str) -> None:
    written: list[tuple[str, int]] = []
    for i in range(3):
        _write(wal_url, f"k{i}", 10, written)
    _invalidate(wal_url, _slot(wal_url))
    publisher = FakePublisher()
    async with running(Relay(config(wal_url), publisher)):
        await _until(lambda: len(_rows(wal_url)) >= 30, 30, "every message recorded")
        await _until(
            lambda: all(r[4] == "published" for r in _rows(wal_url)), 30, "every one published"
        )
        await _until(
            lambda: relay_status(wal_url).capture.get("slot_state") == "ok", 30, "a fresh slot"
        )
        await asyncio.to_thread(_write, wal_url, "k1", 5, written, 10)
        await _until(lambda: len(_rows(wal_url)) >= 35, 30, "the later messages")
        await _until(
            lambda: all(r[4] == "published" for r in _rows(wal_url)), 30, "every one published"
        )
    _check(wal_url, publisher.log, written)


@_in_loop
async def test_a_slot_dropped_while_streaming_loses_nothing(wal_url: str) -> None:
    written: list[tuple[str, int]] = []
    publisher = FakePublisher()
    relay = Relay(config(wal_url), publisher)
    async with running(relay):
        await _until(lambda: bool(relay.capture and relay.capture.capturing), 20, "capturing")
        threads = [
            threading.Thread(target=_write, args=(wal_url, f"k{i}", 150, written))
            for i in range(3)
        ]
        for t in threads:
            t.start()
        await _until(lambda: len(written) > 100, 30, "writers under way")
        _drop_slot(wal_url, _slot(wal_url))
        for t in threads:
            await asyncio.to_thread(t.join)
        await _until(lambda: len(_rows(wal_url)) >= 450, 60, "every message recorded")
        await _until(
            lambda: all(r[4] == "published" for r in _rows(wal_url)), 30, "every one published"
        )
    _check(wal_url, publisher.log, written)


class _HangingPublisher(FakePublisher):
    """Takes the messages (logs them: the broker has them), then hangs before confirming: the
    window in which a relay can die after the broker got a batch."""

    def __init__(self, log: list[Any]) -> None:
        super().__init__(log, "hanging")
        self.release = asyncio.Event()

    async def publish_batch(self, envelopes: Any) -> list[BaseException | None]:
        out = await super().publish_batch(envelopes)
        await self.release.wait()
        return out


@_in_loop
async def test_no_seq_is_ever_given_to_another_message(wal_url: str) -> None:
    """A batch the broker got, whose relay died before recording it, then a lost slot: the
    seq the broker saw stays that message's (the issue's 'later message dropped as stale':
    the inbox would have taken the next message under that seq for a repeat)."""
    log: list[Any] = []
    hanging = _HangingPublisher(log)
    first = Relay(config(wal_url, lease_seconds=2.0, publish_timeout=1.5), hanging)
    with psycopg.connect(wal_url) as conn:
        a = publish(conn, topic="t", key="k", payload={"n": 0})
        conn.commit()
    async with running(first):
        await _until(lambda: len(log) == 1, 20, "the broker to get the first message")
        with psycopg.connect(wal_url, autocommit=True) as conn:  # the relay dies here
            conn.execute(
                "SELECT pg_terminate_backend(p) FROM outbox_capture_lease, "
                "unnest(ARRAY[lock_pid, stream_pid]) AS p WHERE p IS NOT NULL"
            )
        hanging.release.set()
        first.stop()
    _drop_slot(wal_url, _slot(wal_url))
    with psycopg.connect(wal_url) as conn:
        b = publish(conn, topic="t", key="k", payload={"n": 1})
        conn.commit()
    second = Relay(
        config(wal_url, lease_seconds=2.0, publish_timeout=1.5), FakePublisher(log, "second")
    )
    async with running(second):
        # b goes out behind a (one key, in order): once b is published, so is a
        await _until(
            lambda: any(r[0] == b and r[4] == "published" for r in _rows(wal_url)), 30, "b"
        )
    seqs: dict[int, set[Any]] = defaultdict(set)
    for _name, env in log:
        seqs[env.seq].add(env.id)
    assert seqs == {1: {a}, 2: {b}}  # a kept its seq; b took the next one
    assert [(r[0], r[3]) for r in _rows(wal_url)] == [(a, 1), (b, 2)]


def _creating(url: str, slot: str, errors: list[BaseException]) -> threading.Thread:
    """Create ``slot`` in a thread (it waits for the open writer transaction to end)."""

    def run() -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _creator_pid(url: str) -> int | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT pg_create_logical%%' "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else None


def test_a_relay_never_ends_a_session_that_is_creating_its_slot(wal_url: str) -> None:
    """While a slot is being created it is active on an ordinary backend (waiting for the
    open transactions to end): the new holder's walsender sweep ends walsenders only."""
    slot = _slot(wal_url)
    _drop_slot(wal_url, slot)
    writer = psycopg.connect(wal_url)
    errors: list[BaseException] = []
    try:
        writer.execute("SELECT pg_current_xact_id()")  # an open transaction with an xid
        creating = _creating(wal_url, slot, errors)
        asyncio.run(_until(lambda: _creator_pid(wal_url) is not None, 20, "the creation"))
        with psycopg.connect(wal_url, autocommit=True) as conn:
            ended = conn.execute(relay_statements(None).capture_slot_free, {"slot": slot})
            assert [r[0] for r in ended.fetchall()] == []
    finally:
        writer.rollback()
        writer.close()
    creating.join(30)
    assert errors == []
    assert relay_status(wal_url).capture["slot_state"] == "ok"


def test_enable_says_that_its_slot_creation_was_ended(wal_url: str) -> None:
    slot = _slot(wal_url)
    _drop_slot(wal_url, slot)
    writer = psycopg.connect(wal_url)
    raised: list[BaseException] = []

    def enable() -> None:
        try:
            enable_capture(wal_url, slot=slot)
        except BaseException as exc:
            raised.append(exc)

    try:
        writer.execute("SELECT pg_current_xact_id()")
        thread = threading.Thread(target=enable)
        thread.start()
        asyncio.run(_until(lambda: _creator_pid(wal_url) is not None, 20, "the creation"))
        with psycopg.connect(wal_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (_creator_pid(wal_url),))
        thread.join(30)
    finally:
        writer.rollback()
        writer.close()
    assert len(raised) == 1
    assert isinstance(raised[0], ConfigurationError)
    text = str(raised[0])
    assert f"creating replication slot '{slot}' failed" in text
    assert "the server ended this session" in text
    assert "cannot reach the database" not in text
    assert "the capture mode is unchanged" in text


def _epoch(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT max(epoch) FROM outbox_capture_lease").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


@_in_loop
async def test_a_stuck_capture_loop_ends_its_own_lease(
    wal_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The capture loop waits forever (a batch's statement blocked on a lock that another
    session holds): the heartbeat, which still runs, must not keep the lease alive for it.
    The watchdog ends the lease's sessions, the stuck round fails out, and capture resumes
    once the lock is gone."""
    publisher = FakePublisher()
    relay = Relay(config(wal_url, lease_seconds=2.0, publish_timeout=1.5), publisher)
    caplog.set_level(logging.WARNING, logger="relay")
    async with running(relay):
        with psycopg.connect(wal_url) as conn:
            publish(conn, topic="t", key="k", payload={"n": 0})
            conn.commit()
        await _until(lambda: len(publisher.log) == 1, 20, "the first message")
        epoch = _epoch(wal_url)
        blocker = psycopg.connect(wal_url)
        try:
            blocker.execute(
                "SELECT * FROM outbox_key_sequences WHERE topic = 't' AND key = 'k' FOR UPDATE"
            )
            with psycopg.connect(wal_url) as conn:
                publish(conn, topic="t", key="k", payload={"n": 1})
                conn.commit()
            await _until(
                lambda: any("made no progress" in r.getMessage() for r in caplog.records),
                15, "the watchdog",
            )
        finally:
            blocker.rollback()
            blocker.close()
        await _until(lambda: len(publisher.log) == 2, 20, "the second message")
        assert _epoch(wal_url) > epoch  # the stuck round's lease ended; a new one took over
    assert [e.seq for _, e in publisher.log] == [1, 2]
