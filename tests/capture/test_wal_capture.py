"""WAL capture mode end to end, on a private cluster with wal_level = logical and the machine's
NATS JetStream: writers emit logical messages only; the relay numbers them in commit order,
publishes and records them; crashes replay with the same ids and seqs."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import ConfigurationError, Message, publish, publish_batch
from outbox._capture import decode_record
from relay import Relay
from relay._replication import ReplicationStream
from relay.admin import enable_capture, relay_status
from relay.brokers import publisher_for_url
from tests.relay.broker_helpers import nats_stream
from tests.relay.relay_helpers import FakePublisher, config, running
from tests.support.services import require_port

NATS = "nats://127.0.0.1:4222"


def _in_loop(test: Any) -> Any:
    """Run an async test function in a fresh event loop (the suite has no async plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def _rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT id, topic, key, seq, status FROM outbox_messages ORDER BY topic, key, seq"
        ).fetchall()


def _registered(url: str, pid: int) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_relays WHERE pid = %s", (pid,)).fetchone()
    return bool(row and row[0])


async def _until(predicate: Any, within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await asyncio.to_thread(predicate):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_publish_in_wal_mode_writes_one_pending_row_and_a_rollback_nothing(wal_url: str) -> None:
    with psycopg.connect(wal_url) as conn:
        publish(conn, topic="orders", key="o-1", payload={"n": 1})
        conn.rollback()
        kept = publish(conn, topic="orders", key="o-1", payload={"n": 2})
        conn.commit()
        rows = conn.execute("SELECT count(*) FROM outbox_messages").fetchone()
        counters = conn.execute("SELECT count(*) FROM outbox_key_sequences").fetchone()
        pending = conn.execute("SELECT id, record FROM outbox_wal_pending").fetchall()
    assert rows == (0,)  # no message row, no counter: the relay numbers and records them
    assert counters == (0,)
    assert [r[0] for r in pending] == [kept]  # the durable record, whatever the slot does
    assert decode_record(pending[0][1]).payload == b'{"n":2}'
    with psycopg.connect(wal_url) as conn:
        peeked = conn.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
            "(SELECT slot FROM outbox_capture), NULL, NULL, 'proto_version', '1', "
            "'publication_names', 'outbox_capture', 'messages', 'true') "
            "WHERE substring(data FROM 1 FOR 1) = 'I'"
        ).fetchone()
    assert peeked == (1,)  # the rolled-back message never reached the stream


@_in_loop
async def test_an_idempotency_key_published_twice_before_capture_is_one_message(
    wal_url: str,
) -> None:
    with psycopg.connect(wal_url) as conn:
        first = publish(conn, topic="t", key="k", payload={"n": 1}, idempotency_key="once")
        conn.commit()
        again = publish(conn, topic="t", key="k", payload={"n": 2}, idempotency_key="once")
        conn.commit()
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM outbox_wal_pending), "
            "(SELECT count(*) FROM outbox_messages)"
        ).fetchone()
    assert first == again
    assert counts == (1, 0)  # a no-op, as in polling mode: no row of the polling path
    publisher = FakePublisher()
    async with running(Relay(config(wal_url), publisher)):
        await _until(lambda: len(publisher.log) == 1, 20, "the message")
    assert [(e.id, e.seq, e.payload) for _, e in publisher.log] == [(first, 1, b'{"n":1}')]


@_in_loop
async def test_relay_numbers_in_commit_order_and_publishes_each_once(wal_url: str) -> None:
    require_port(4222, "NATS", "start nats-server -js on 127.0.0.1:4222")
    keys = [f"k{i}" for i in range(5)]
    writers, per_writer = 4, 60
    async with nats_stream() as (js, stream, subject):
        publisher = publisher_for_url(NATS, destinations={"orders": subject}, timeout=1.5)
        relay = Relay(config(wal_url, batch_size=50), publisher)
        async with running(relay):

            def write(w: int) -> None:
                with psycopg.connect(wal_url) as conn:
                    for n in range(per_writer):
                        publish(
                            conn, topic="orders", key=keys[(w + n) % len(keys)],
                            payload={"w": w, "n": n},
                        )
                        conn.commit()

            threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
            for t in threads:
                t.start()
            for t in threads:
                await asyncio.to_thread(t.join)
            total = writers * per_writer
            await _until(
                lambda: sum(1 for r in _rows(wal_url) if r[4] == "published") >= total,
                30, "every message published",
            )
        info = await js.stream_info(stream)
        seen: dict[str, list[int]] = defaultdict(list)
        ids = set()
        for n in range(1, info.state.messages + 1):
            msg = await js.get_msg(stream, n)
            seen[msg.headers["outbox-key"]].append(int(msg.headers["outbox-seq"]))
            ids.add(msg.headers["outbox-id"])
    rows = _rows(wal_url)
    assert len(rows) == writers * per_writer
    assert {r[4] for r in rows} == {"published"}
    assert len(ids) == len(rows)  # each message in the stream exactly once
    for key in keys:
        seqs = sorted(r[3] for r in rows if r[2] == key)
        assert seqs == list(range(1, len(seqs) + 1)), key  # gapless
    assert sum(len(v) for v in seen.values()) == len(rows)


@_in_loop
async def test_wal_mode_keeps_delays_idempotency_and_sql_publish(wal_url: str) -> None:
    publisher = FakePublisher()
    relay = Relay(config(wal_url), publisher)
    with psycopg.connect(wal_url) as conn:
        first = publish(conn, topic="t", key="a", payload={"n": 1}, idempotency_key="once")
        again = publish(conn, topic="t", key="a", payload={"n": 1}, idempotency_key="once")
        conn.commit()
        later = publish(
            conn, topic="t", key="b", payload={}, deliver_after=dt.timedelta(seconds=1)
        )
        behind = publish(conn, topic="t", key="b", payload={"after": "later"})
        sql_id = conn.execute(
            "SELECT outbox_publish('t', 'c', '{\"from\": \"sql\"}', '{\"x-h\": \"v\"}')"
        ).fetchone()
        conn.commit()
    assert first == again
    async with running(relay):
        await _until(lambda: len(publisher.log) >= 4, 20, "four publications")
    sent = [e for _, e in publisher.log]
    by_id = {e.id: e for e in sent}
    assert [e.id for e in sent].count(first) == 1  # the republished idempotency key: once
    order_b = [e.id for e in sent if e.key == "b"]
    assert order_b == [later, behind]  # the undelayed one waited behind the delayed one
    assert by_id[later].seq == 1
    assert by_id[behind].seq == 2
    assert sql_id is not None
    assert by_id[sql_id[0]].headers == {"x-h": "v"}
    assert json.loads(by_id[sql_id[0]].payload) == {"from": "sql"}


def test_enable_on_a_server_without_logical_decoding_says_what_to_change(
    database_url: str,
) -> None:
    with psycopg.connect(database_url) as conn:
        level = conn.execute("SHOW wal_level").fetchone()
    if level == ("logical",):
        pytest.skip("this server already has wal_level = logical")
    with pytest.raises(ConfigurationError, match="wal_level = logical"):
        enable_capture(database_url, slot=f"s_{uuid.uuid4().hex[:8]}")


def _relay_process(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "relay", "--url", url, "--broker", NATS,
             "--batch-size", "20", "--poll-interval", "0.1"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )


@_in_loop
async def test_kill_9_mid_stream_replays_with_the_same_ids_and_seqs(
    wal_url: str, tmp_path: Path
) -> None:
    require_port(4222, "NATS", "start nats-server -js on 127.0.0.1:4222")
    total = 600
    async with nats_stream() as (js, stream, subject):
        with psycopg.connect(wal_url) as conn:
            for start in range(0, total, 20):
                publish_batch(
                    conn,
                    [Message(subject, f"k{i % 7}", {"i": i}) for i in range(start, start + 20)],
                )
                conn.commit()
        first = _relay_process(wal_url, tmp_path / "relay1.log")
        try:
            await _until(lambda: len(_rows(wal_url)) > 150, 60, "the first relay to record")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        second = _relay_process(wal_url, tmp_path / "relay2.log")
        try:
            # registered: it runs, with its signal handlers (a SIGTERM during start-up kills it)
            await _until(lambda: _registered(wal_url, second.pid), 60, "the second relay to start")
            await _until(
                lambda: sum(1 for r in _rows(wal_url) if r[4] == "published") == total,
                60, "the second relay to finish",
            )
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
        info = await js.stream_info(stream)
        seq_of: dict[str, set[int]] = defaultdict(set)
        for n in range(1, info.state.messages + 1):
            msg = await js.get_msg(stream, n)
            seq_of[msg.headers["outbox-id"]].add(int(msg.headers["outbox-seq"]))
    rows = _rows(wal_url)
    assert len(rows) == total
    for row in rows:  # whatever was sent twice was sent with the same seq
        assert seq_of[str(row[0])] == {row[3]}
    per_key: dict[str, list[int]] = defaultdict(list)
    for _id, _topic, key, seq, _status in rows:
        per_key[key].append(seq)
    for key, seqs in per_key.items():
        assert seqs == list(range(1, len(seqs) + 1)), key


@_in_loop
async def test_a_standby_relay_takes_over_the_slot(wal_url: str) -> None:
    log: list[Any] = []
    one, two = Relay(config(wal_url), FakePublisher(log, "one")), Relay(
        config(wal_url), FakePublisher(log, "two")
    )
    task_one = asyncio.create_task(one.run())
    await _until(lambda: bool(one.capture and one.capture.capturing), 20, "relay one capturing")
    async with running(two):
        await asyncio.sleep(0)  # two starts while one holds the slot
        with psycopg.connect(wal_url) as conn:
            publish(conn, topic="t", key="k", payload={})
            conn.commit()
        assert not (two.capture and two.capture.capturing)
        one.stop()
        await task_one
        await _until(lambda: bool(two.capture and two.capture.capturing), 20, "two capturing")
        with psycopg.connect(wal_url) as conn:
            for n in range(3):
                publish(conn, topic="t", key="k", payload={"n": n})
                conn.commit()
        await _until(lambda: len(_rows(wal_url)) == 4, 20, "four rows")
    status = relay_status(wal_url).capture
    assert status["mode"] == "wal"
    assert status["slot_exists"] is True
    assert [r[3] for r in _rows(wal_url)] == [1, 2, 3, 4]


@_in_loop
async def test_a_malformed_record_under_our_prefix_never_stops_the_stream(wal_url: str) -> None:
    publisher = FakePublisher()
    relay = Relay(config(wal_url), publisher)
    with psycopg.connect(wal_url) as conn:
        conn.execute("SELECT pg_logical_emit_message(true, 'outbox.v1', '\\x0102'::bytea)")
        good = publish(conn, topic="t", key="k", payload={"n": 1})
        conn.commit()
    async with running(relay):
        await _until(lambda: len(publisher.log) >= 1, 20, "the good message")
    assert [e.id for _, e in publisher.log] == [good]
    assert [r[0] for r in _rows(wal_url)] == [good]


@_in_loop
async def test_a_late_commit_takes_the_next_seq_and_stalls_no_one(wal_url: str) -> None:
    """A transaction that emitted first and commits last is numbered after the transactions
    that committed meanwhile (commit order), and they are published while it is still open."""
    publisher = FakePublisher()
    relay = Relay(config(wal_url), publisher)
    late = psycopg.connect(wal_url)
    try:
        late_id = publish(late, topic="t", key="k", payload={"late": True})  # not committed
        async with running(relay):
            with psycopg.connect(wal_url) as conn:
                early = [publish(conn, topic="t", key="k", payload={"n": n}) for n in range(3)]
                conn.commit()
            await _until(lambda: len(publisher.log) == 3, 20, "the committed messages")
            late.commit()
            await _until(lambda: len(publisher.log) == 4, 20, "the late message")
    finally:
        late.close()
    assert [(e.id, e.seq) for _, e in publisher.log] == [
        *((i, n + 1) for n, i in enumerate(early)),
        (late_id, 4),
    ]


@_in_loop
async def test_a_transaction_of_100k_messages_is_captured_whole(wal_url: str) -> None:
    total, keys = 100_000, 50
    with psycopg.connect(wal_url) as conn:
        publish_batch(conn, [Message("t", f"k{i % keys}", {"i": i}) for i in range(total)])
        conn.commit()
    publisher = FakePublisher()
    relay = Relay(config(wal_url, publish_timeout=60, lease_seconds=120), publisher)
    async with running(relay):
        await _until(lambda: len(publisher.log) >= total, 240, "100k messages")

        def recorded() -> int:
            with psycopg.connect(wal_url) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM outbox_messages WHERE status = 'published'"
                ).fetchone()
            return int(row[0]) if row else 0

        await _until(lambda: recorded() == total, 60, "100k rows recorded")
    assert len(publisher.log) == total  # each once
    seqs: dict[str, list[int]] = defaultdict(list)
    for _, env in publisher.log:
        seqs[env.key].append(env.seq)
    assert len(seqs) == keys
    for key, got in seqs.items():  # in the transaction's order, gapless
        assert got == list(range(1, total // keys + 1)), key


@_in_loop
async def test_metrics_show_the_slot_streamed_and_its_lag(wal_url: str) -> None:
    pytest.importorskip("prometheus_client")
    from relay import RelayMetrics

    metrics = RelayMetrics.prometheus()
    relay = Relay(config(wal_url, heartbeat_interval=0.1), FakePublisher(), metrics=metrics)
    slot = relay_status(wal_url).capture["slot"]

    def gauge(name: str) -> float | None:
        value = metrics.registry.get_sample_value(name, {"slot": slot})
        return None if value is None else float(value)

    async with running(relay):
        await _until(lambda: bool(relay.capture and relay.capture.capturing), 20, "capturing")
        await _until(lambda: gauge("outbox_capture_slot_active") == 1, 20, "slot active")
        with psycopg.connect(wal_url) as conn:
            publish(conn, topic="t", key="k", payload={"n": 1})
            conn.commit()
        await _until(lambda: len(_rows(wal_url)) == 1, 20, "the message recorded")
        retained = gauge("outbox_capture_slot_retained_bytes")
        assert retained is not None
        assert retained > 0  # the slot keeps the WAL from its restart point on
        assert gauge("outbox_capture_slot_lag_bytes") is not None
    # nobody streams the slot now: a fresh relay's first heartbeat says so
    idle = RelayMetrics.prometheus()
    watcher = Relay(config(wal_url, heartbeat_interval=0.1), FakePublisher(), metrics=idle)
    with psycopg.connect(wal_url) as conn:
        conn.execute("UPDATE outbox_capture SET mode = 'polling'")  # it must not capture
        conn.commit()
    async with running(watcher):
        await _until(
            lambda: idle.registry.get_sample_value("outbox_capture_slot_active", {"slot": slot})
            == 0,
            20,
            "slot inactive",
        )


@_in_loop
async def test_a_batch_is_on_disk_before_the_slot_is_told_it_is_done(
    wal_url: str, logical_pg: Any
) -> None:
    """The relay confirms a batch to the slot after committing its rows (and deleting their
    pending rows); the server may save that position to disk at once, so that commit must be
    flushed first, or a server crash would lose the rows and skip the batch. With the WAL
    writer held back for 10 s, a commit that did not wait for its flush is visible long before
    it is on disk: the pending row's page, changed by that commit only (the row's delete),
    would be ahead of the flushed WAL. (The later mark 'published' needs no flush: lost, it
    leaves the row pending, sent again.)"""
    with psycopg.connect(logical_pg.admin_url, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        admin.execute("SELECT pg_reload_conf()")
    try:
        with psycopg.connect(wal_url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        with psycopg.connect(wal_url) as conn:
            msg_id = publish(conn, topic="t", key="k", payload={"n": 1})
            conn.commit()
            where = conn.execute(
                "SELECT ((ctid::text::point)[0])::int FROM outbox_wal_pending WHERE id = %s",
                (msg_id,),
            ).fetchone()
        assert where is not None
        relay = Relay(config(wal_url), FakePublisher())
        async with running(relay):
            seen: list[tuple[bool, str, str]] = []

            def recorded() -> bool:
                with psycopg.connect(wal_url, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT pg_current_wal_flush_lsn() >= h.lsn, h.lsn::text, "
                        "pg_current_wal_flush_lsn()::text FROM outbox_messages AS m, "
                        "page_header(get_raw_page('outbox_wal_pending', %s)) AS h "
                        "WHERE m.id = %s",
                        (where[0], msg_id),
                    ).fetchone()
                if row is not None:
                    seen.append(row)
                return row is not None

            await _until(recorded, 20, "the message recorded")
    finally:
        with psycopg.connect(logical_pg.admin_url, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET wal_writer_delay")
            admin.execute("SELECT pg_reload_conf()")
    on_disk, page_lsn, flushed = seen[0]
    assert on_disk, f"the row was visible at {page_lsn} while the WAL was flushed to {flushed}"


@_in_loop
async def test_the_stream_reads_ahead_no_further_than_its_buffer(wal_url: str) -> None:
    """While the relay works on a batch, a task receives the next transactions, but stops at
    ``buffer`` records (TCP then holds the server back); what it holds is taken whole and in
    commit order."""
    with psycopg.connect(wal_url) as conn:
        row = conn.execute("SELECT slot, publication FROM outbox_capture").fetchone()
        assert row is not None
        ids = []
        for n in range(30):
            ids.append(publish(conn, topic="t", key=f"k{n % 3}", payload={"n": n}))
            conn.commit()
    stream = ReplicationStream(wal_url, row[0], row[1], buffer=5)
    await stream.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while stream.buffered < 5:  # the reader task fills the buffer on its own
            assert loop.time() < deadline, "the reader did not fill its buffer"
            await asyncio.sleep(0.01)
        first = await stream.transactions(100, 1.0)
        assert len(first) == 5  # all 30 were committed: it stopped at the bound
        taken = list(first)
        while len(taken) < 30:
            more = await stream.transactions(100, 5.0)
            assert more, "the reader did not go on after its buffer was taken"
            assert len(more) <= 5
            taken.extend(more)
    finally:
        stream.close()
    assert [decode_record(tx.records[0]).id for tx in taken] == ids


def _postmaster_start(url: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    return row[0] if row else None


@_in_loop
async def test_postgres_crash_mid_stream_loses_nothing_and_renumbers_nothing() -> None:
    """The server crashes (immediate shutdown, fsync on) while writers commit and the relay
    streams; after crash recovery every committed message is published, each with one seq,
    gapless per key, and the writers' rolled-back or unacknowledged commits never show up
    unless the server had committed them."""
    require_port(4222, "NATS", "start nats-server -js on 127.0.0.1:4222")
    from outbox._migrate import upgrade
    from tests.support.harness import logical_server

    workdir = tempfile.mkdtemp(prefix="outbox-crash-")  # under /tmp: postgres must reach it
    server = logical_server(workdir, durable=True)
    assert server is not None
    assert server.crash_restart is not None
    try:
        url = server.admin_url
        upgrade(url)
        enable_capture(url)
        committed: set[uuid.UUID] = set()
        unsure: set[uuid.UUID] = set()  # the commit's answer was lost in the crash
        stop = threading.Event()

        def write() -> None:
            n = 0
            while not stop.is_set():
                try:
                    with psycopg.connect(url, connect_timeout=2) as conn:
                        while not stop.is_set():
                            ids = publish_batch(
                                conn, [Message("t", f"k{(n + i) % 5}", {"n": n}) for i in range(3)]
                            )
                            n += 1
                            try:
                                conn.commit()
                            except psycopg.OperationalError:
                                unsure.update(ids)
                                raise
                            committed.update(ids)
                except psycopg.OperationalError:
                    stop.wait(0.1)  # the server is down: try again shortly

        async with nats_stream() as (js, stream, subject):
            publisher = publisher_for_url(NATS, destinations={"t": subject}, timeout=1.5)
            relay = Relay(config(url, batch_size=50), publisher)
            async with running(relay):
                writer = threading.Thread(target=write)
                writer.start()
                try:
                    await _until(lambda: len(_rows(url)) > 100, 30, "messages recorded")
                    started = _postmaster_start(url)
                    before = len(committed)
                    await asyncio.to_thread(server.crash_restart)
                    assert _postmaster_start(url) != started  # a new postmaster, recovered
                    await _until(
                        lambda: len(committed) > before + 300, 60, "writers after the crash"
                    )
                finally:
                    stop.set()
                    await asyncio.to_thread(writer.join)

                def settled() -> bool:
                    rows = _rows(url)
                    return committed <= {r[0] for r in rows} and all(
                        r[4] == "published" for r in rows
                    )

                await _until(settled, 60, "every committed message published")
            info = await js.stream_info(stream)
            seq_of: dict[str, set[int]] = defaultdict(set)
            for n in range(1, info.state.messages + 1):
                msg = await js.get_msg(stream, n)
                seq_of[msg.headers["outbox-id"]].add(int(msg.headers["outbox-seq"]))
        rows = _rows(url)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    recorded = {r[0] for r in rows}
    assert committed <= recorded
    assert recorded <= committed | unsure  # nothing that the server did not commit
    for row in rows:  # sent once or more, always with its one seq
        assert seq_of[str(row[0])] == {row[3]}
    per_key: dict[str, list[int]] = defaultdict(list)
    for _id, _topic, key, seq, _status in rows:
        per_key[key].append(seq)
    for key, seqs in per_key.items():
        assert seqs == list(range(1, len(seqs) + 1)), key


@_in_loop
async def test_switching_back_to_polling_publishes_what_was_emitted_before(wal_url: str) -> None:
    """A transaction that emitted in 'wal' mode and commits after `capture disable` is still
    published (its ledger row is read in 'polling' mode); so is a message written after the
    switch, in key order; the slot is not streamed in 'polling' mode: it can be dropped, and the
    relay does not make it again."""
    from relay.admin import disable_capture

    publisher = FakePublisher()
    relay = Relay(config(wal_url), publisher)
    open_tx = psycopg.connect(wal_url)
    try:
        async with running(relay):
            await _until(lambda: bool(relay.capture and relay.capture.capturing), 20, "capturing")
            emitted = publish(open_tx, topic="t", key="k", payload={"before": True})
            await asyncio.to_thread(disable_capture, wal_url)
            open_tx.commit()  # committed in 'polling' mode, emitted before the switch
            with psycopg.connect(wal_url) as conn:
                row_id = publish(conn, topic="t", key="k", payload={"after": True})
                conn.commit()
            await _until(lambda: len(publisher.log) == 2, 20, "both messages")
            assert [e.id for _, e in publisher.log] == [emitted, row_id]  # commit order
            assert [e.seq for _, e in publisher.log] == [1, 2]  # one key, gapless
            slot = relay_status(wal_url).capture["slot"]

            def dropped() -> bool:
                with psycopg.connect(wal_url, autocommit=True) as conn:
                    try:
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    except psycopg.errors.ObjectInUse:
                        return False  # the stream of 'wal' mode has not seen the switch yet
                return True

            await _until(dropped, 20, "the slot dropped: not streamed in 'polling' mode")
            with psycopg.connect(wal_url) as conn:  # polling mode goes on as usual
                later = publish(conn, topic="t", key="k", payload={"later": True})
                conn.commit()
            await _until(lambda: len(publisher.log) == 3, 20, "the polled message")
            assert publisher.log[2][1].id == later
            assert publisher.log[2][1].seq == 3
            with psycopg.connect(wal_url) as conn:
                slots = conn.execute(
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
            assert slots == (0,)  # the relay did not make it again
    finally:
        open_tx.close()


def test_publish_async_on_asyncpg_in_wal_mode_writes_pending_rows_only(wal_url: str) -> None:
    """asyncpg writers (SQLAlchemy's postgresql+asyncpg) take the same WAL path as psycopg's."""
    pytest.importorskip("asyncpg")
    from sqlalchemy.engine import make_url
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.pool import NullPool

    from outbox import publish_async, publish_batch_async

    async def main() -> None:
        url = make_url(wal_url).set(drivername="postgresql+asyncpg")
        engine = create_async_engine(url, poolclass=NullPool)
        async with AsyncSession(engine) as session:
            await publish_async(session, topic="orders", key="o-1", payload={"n": 0})
            await session.rollback()
        async with AsyncSession(engine) as session, session.begin():
            await publish_async(session, topic="orders", key="o-1", payload={"n": 1})
            await publish_batch_async(session, [Message("orders", "o-1", {"n": n}) for n in (2, 3)])
        await engine.dispose()

    asyncio.run(main())
    with psycopg.connect(wal_url) as conn:
        rows = conn.execute("SELECT count(*) FROM outbox_messages").fetchone()
        peeked = conn.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
            "(SELECT slot FROM outbox_capture), NULL, NULL, 'proto_version', '1', "
            "'publication_names', 'outbox_capture', 'messages', 'true') "
            "WHERE substring(data FROM 1 FOR 1) = 'I'"
        ).fetchone()
    assert rows == (0,)  # no row: the relay numbers and records them
    assert peeked == (3,)  # the rolled-back message never reached the stream
