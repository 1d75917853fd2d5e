"""'wal' mode loses nothing when its slot goes: every committed message has a row
(``outbox_wal_pending``) until the relay records it, and a relay that finds its slot missing or
invalidated makes a fresh one and publishes what the table holds first, each key in order
with a gapless seq. On the private logical cluster of tests/capture (conftest.py)."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import Any

import orjson
import psycopg

from outbox import publish
from relay import Relay
from relay._admin import relay_status
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
