"""A replication slot decodes one database, and slot names are global to the server: no
message may be emitted in 'wal' mode unless a slot of its own database decodes it.

On a private cluster with wal_level = logical and several databases: two databases enabled
with the defaults each capture through a slot of their own; a slot of another database is
refused; and in every state where the mode row names a slot that decodes nothing of the
database (another database's, as the first `enable` of this feature left it or a clone made
with CREATE DATABASE ... TEMPLATE; dropped; invalidated) writers write rows, which a real
relay publishes, while `outbox status`, the relay's log and its metrics say what is wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import ConfigurationError, Message, publish, publish_batch
from outbox._migrate import upgrade
from relay import Relay, RelayMetrics
from relay._slot import default_slot
from relay.admin import disable_capture, enable_capture, relay_status
from relay.brokers import publisher_for_url
from tests.relay.broker_helpers import nats_stream
from tests.relay.relay_helpers import FakePublisher, config, running
from tests.support.harness import PgServer, logical_server
from tests.support.ledger import record
from tests.support.services import require_port

NATS = "nats://127.0.0.1:4222"
OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _in_loop(test: Any) -> Any:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def _drop_slots_of(server: PgServer, database: str) -> None:
    """Every slot of ``database`` (a database with a logical slot cannot be dropped)."""
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        for _ in range(100):
            rows = conn.execute(
                "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
                (database,),
            ).fetchall()
            if not rows:
                return
            for slot, pid in rows:
                if pid is not None:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                gone = (psycopg.errors.ObjectInUse, psycopg.errors.UndefinedObject)
                with contextlib.suppress(*gone):
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute("SELECT pg_sleep(0.05)")  # a terminated walsender is exiting
        raise AssertionError(f"the slots of {database} could not be dropped")


@contextlib.contextmanager
def _databases(server: PgServer, count: int) -> Iterator[list[tuple[str, str]]]:
    """``count`` fresh migrated databases: (name, url) each; dropped with their slots."""
    made: list[tuple[str, str]] = []
    try:
        for _ in range(count):
            name = f"outbox_s_{uuid.uuid4().hex[:10]}"
            made.append((name, server.create_database(name)))
            upgrade(made[-1][1])
        yield made
    finally:
        for name, _url in made:
            _drop_slots_of(server, name)
            server.drop_database(name)


def _pending(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_wal_pending").fetchone()
    return int(row[0]) if row else 0


def _rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_messages").fetchone()
    return int(row[0]) if row else 0


def _publish(url: str, n: int, tag: str, *, sql_function: int = 0) -> list[uuid.UUID]:
    """``n`` messages by publish(), then ``sql_function`` by outbox_publish(), one commit each,
    on one connection; their ids."""
    ids: list[uuid.UUID] = []
    with psycopg.connect(url) as conn:
        for i in range(n):
            ids.append(publish(conn, topic="orders", key=f"{tag}-{i % 3}", payload={"i": i}))
            conn.commit()
        for i in range(sql_function):
            row = conn.execute(
                "SELECT outbox_publish('orders', %s, %s::jsonb)", (f"{tag}-sql", f'{{"j": {i}}}')
            ).fetchone()
            assert row is not None
            ids.append(row[0])
            conn.commit()
    return ids


async def _until(predicate: Any, within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await asyncio.to_thread(predicate):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _gauge(metrics: RelayMetrics, name: str, labels: dict[str, str]) -> float | None:
    value = metrics.registry.get_sample_value(name, labels)
    return None if value is None else float(value)


def _in_order(log: list[tuple[str, Any]]) -> bool:
    seqs: dict[str, list[int]] = {}
    for _, env in log:
        seqs.setdefault(env.key, []).append(env.seq)
    return all(s == list(range(1, len(s) + 1)) for s in seqs.values())


def _console_overview(url: str) -> str:
    """The console's overview page of ``url``'s database, served for real (uvicorn)."""
    import httpx

    from tests.console.console_helpers import serve

    with serve(url) as base:
        answer = httpx.get(base + "/")
    assert answer.status_code == 200, answer.text
    return answer.text


def _outbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([OUTBOX, *args], capture_output=True, text=True, timeout=60, check=False)


# ---- two databases of one server ---------------------------------------------------------


def test_default_slot_names_are_valid_and_distinct_per_database() -> None:
    assert default_slot("orders") == "outbox_orders"
    names = {default_slot(d) for d in ("App", "app", "a-b", "a_b", "x" * 63, "x" * 64, "é")}
    assert len(names) == 7  # never two databases on one slot name
    for name in names:
        assert len(name) <= 63
        assert name.replace("_", "").isalnum()
        assert name == name.lower()
        assert name.isascii()


@_in_loop
async def test_two_databases_enabled_with_the_defaults_each_publish_every_message(
    logical_pg: PgServer,
) -> None:
    require_port(4222, "NATS", "start nats-server -js on 127.0.0.1:4222")
    with _databases(logical_pg, 2) as [(db1, url1), (db2, url2)]:
        first, second = enable_capture(url1), enable_capture(url2)
        assert (first["slot"], second["slot"]) == (default_slot(db1), default_slot(db2))
        assert (first["slot_state"], second["slot_state"]) == ("ok", "ok")
        assert (first["slot_database"], second["slot_database"]) == (db1, db2)
        assert first["problem"] is None
        assert second["problem"] is None
        assert enable_capture(url1)["slot"] == first["slot"]  # enabling again keeps it
        ids1 = _publish(url1, 40, "a", sql_function=5)
        ids2 = _publish(url2, 40, "b", sql_function=5)
        assert (_rows(url1), _rows(url2)) == (0, 0)  # all in the WAL: for the slots to decode
        async with (
            nats_stream() as (js, stream1, subject1),
            nats_stream() as (_, stream2, subject2),
        ):
            relays = [
                Relay(config(url, batch_size=20),
                      publisher_for_url(NATS, destinations={"orders": subject}, timeout=1.5))
                for url, subject in ((url1, subject1), (url2, subject2))
            ]  # fmt: skip

            def published(url: str) -> int:
                with psycopg.connect(url) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM outbox_messages WHERE status = 'published'"
                    ).fetchone()
                return int(row[0]) if row else 0

            async with running(*relays):
                await _until(lambda: published(url1) == 45, 30, "database 1's messages")
                await _until(lambda: published(url2) == 45, 30, "database 2's messages")
                assert all(r.capture is not None and r.capture.capturing for r in relays)
            for stream, ids in ((stream1, ids1), (stream2, ids2)):
                info = await js.stream_info(stream)
                assert info.state.messages == 45
                got = [
                    uuid.UUID((await js.get_msg(stream, n)).headers["outbox-id"])
                    for n in range(1, 46)
                ]
                assert sorted(got) == sorted(ids)  # each once, none of the other database's


def test_a_slot_of_another_database_is_refused_and_its_writers_stay_in_polling(
    logical_pg: PgServer,
) -> None:
    with _databases(logical_pg, 2) as [(db1, url1), (db2, url2)]:
        slot = enable_capture(url1)["slot"]
        with pytest.raises(ConfigurationError) as refused:
            enable_capture(url2, slot=slot)
        text = str(refused.value)
        assert f"belongs to database {db1!r}" in text
        assert "--slot NAME" in text
        assert default_slot(db2) in text
        done = _outbox("capture", "enable", "--url", url2, "--slot", slot)
        assert done.returncode == 2
        assert "Traceback" not in done.stderr
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("error: ")
        assert db1 in line
        assert "--slot NAME" in line
        assert relay_status(url2).capture["mode"] == "polling"
        _publish(url2, 3, "b", sql_function=1)
        # in the ledger, as in every mode; in 'polling' mode the relay's ledger reader numbers
        # and records them for the claim loops (record() runs it once, no relay here)
        assert (_pending(url2), _rows(url2)) == (4, 0)
        assert record(url2) == 4
        assert (_pending(url2), _rows(url2)) == (0, 4)
        with psycopg.connect(logical_pg.admin_url, autocommit=True) as conn:
            physical = f"outbox_phys_{uuid.uuid4().hex[:8]}"
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (physical,))
            try:
                with pytest.raises(ConfigurationError, match="is a physical replication slot"):
                    enable_capture(url2, slot=physical)
            finally:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (physical,))
        with pytest.raises(ConfigurationError, match="replication slot name"):
            enable_capture(url2, slot="Bad-Name")


@_in_loop
async def test_a_mode_row_naming_another_databases_slot_loses_nothing(
    logical_pg: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The state the issue found (a second database switched to 'wal' on the first one's
    slot), as an older `enable` or a restore leaves it: writers write their pending rows, the
    relay publishes them from the table and never streams the other database's slot, and
    every surface says which database the slot belongs to; `enable` then gives the database
    its own slot."""
    pytest.importorskip("prometheus_client")
    with _databases(logical_pg, 2) as [(db1, url1), (db2, url2)]:
        slot = enable_capture(url1)["slot"]
        with psycopg.connect(url2) as conn:
            conn.execute(
                "UPDATE outbox_capture SET mode = 'wal', slot = %s, publication = 'outbox_capture'",
                (slot,),
            )
            conn.execute("CREATE PUBLICATION outbox_capture")
            conn.commit()
        ids = _publish(url2, 10, "b", sql_function=2)
        with psycopg.connect(url2) as conn:  # a batch takes the same check
            ids += publish_batch(
                conn, [Message("orders", "b-batch", {"n": n}) for n in range(2)]
            )
            conn.commit()
        assert _pending(url2) == 14  # every message is a row, whatever the slot decodes

        state = relay_status(url2).capture
        assert (state["slot_state"], state["slot_database"], state["database"]) == (
            "foreign", db1, db2,
        )
        assert f"belongs to database {db1!r}, not to {db2!r}" in state["problem"]
        assert "lag_bytes" not in state  # another database's lag says nothing of this one
        line = _outbox("capture", "status", "--url", url2).stdout
        assert line.startswith(f"capture: wal, slot {slot} FOREIGN: ")
        assert db1 in line
        assert f"slot {slot} FOREIGN" in _outbox("status", "--url", url2).stdout
        page = _console_overview(url2)
        assert 'id="capture-problem"' in page
        assert f"of database {db1}" in page
        assert "belongs to database" in page

        publisher, metrics = FakePublisher(), RelayMetrics.prometheus()
        relay = Relay(config(url2, heartbeat_interval=0.1), publisher, metrics=metrics)
        caplog.set_level(logging.ERROR, logger="relay")
        async with running(relay):
            await _until(lambda: len(publisher.log) == 14, 30, "the rows published")
            await _until(
                lambda: _gauge(metrics, "outbox_capture_slot_ok", {"slot": slot}) == 0,
                20,
                "the slot flagged",
            )
            assert _gauge(
                metrics,
                "outbox_capture_slot_state",
                {"slot": slot, "database": db1, "state": "foreign"},
            ) == 1
            assert relay.capture is not None
            assert not relay.capture.capturing
        assert sorted(e.id for _, e in publisher.log) == sorted(ids)
        assert _in_order(publisher.log)
        errors = [r.getMessage() for r in caplog.records if "belongs to database" in r.getMessage()]
        assert len(errors) == 1  # logged at once, not once per second

        fixed = enable_capture(url2)  # the database's own slot, by default
        assert (fixed["slot"], fixed["slot_state"], fixed["problem"]) == (
            default_slot(db2), "ok", None,
        )
        after = _publish(url2, 2, "c")
        assert _pending(url2) == 2  # decoded through its own slot from here on
        publisher2 = FakePublisher()  # the same metrics: the old slot's alert must stop
        relay2 = Relay(config(url2, heartbeat_interval=0.1), publisher2, metrics=metrics)
        async with running(relay2):
            await _until(lambda: len(publisher2.log) == 2, 30, "the captured messages")
            await _until(
                lambda: _gauge(metrics, "outbox_capture_slot_ok", {"slot": fixed["slot"]}) == 1,
                20,
                "the new slot ok",
            )
        assert _gauge(metrics, "outbox_capture_slot_ok", {"slot": slot}) is None
        assert sorted(e.id for _, e in publisher2.log) == sorted(after)


# ---- the paths by which a slot stops decoding a database ---------------------------------


@_in_loop
async def test_a_slot_dropped_in_wal_mode_is_made_again_and_loses_nothing(
    logical_pg: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("prometheus_client")
    with _databases(logical_pg, 1) as [(_db, url)]:
        slot = enable_capture(url)["slot"]
        writer = psycopg.connect(url)
        try:
            before = publish(writer, topic="orders", key="k", payload={"before": "the drop"})
            writer.commit()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            kept = [publish(writer, topic="orders", key="k", payload={"n": n}) for n in range(3)]
            writer.commit()
        finally:
            writer.close()
        kept += _publish(url, 2, "k", sql_function=1)
        assert (_rows(url), _pending(url)) == (0, 7)  # each one durable, slot or not

        state = relay_status(url).capture
        assert (state["mode"], state["slot_state"]) == ("wal", "missing")
        assert "does not exist" in state["problem"]
        assert "no message is lost" in state["problem"]
        publisher, metrics = FakePublisher(), RelayMetrics.prometheus()
        relay = Relay(config(url, heartbeat_interval=0.1), publisher, metrics=metrics)
        caplog.set_level(logging.WARNING, logger="relay")
        async with running(relay):
            await _until(lambda: len(publisher.log) == 7, 30, "every message published")
            await _until(
                lambda: _gauge(metrics, "outbox_capture_slot_ok", {"slot": slot}) == 1,
                20, "the fresh slot ok",
            )  # fmt: skip
            assert _gauge(
                metrics, "outbox_capture_slot_recoveries_total", {"slot": slot}
            ) == 1
        assert [e.id for _, e in publisher.log] == [before, *kept]  # in commit order
        assert _in_order(publisher.log)
        assert any("created a fresh slot" in r.getMessage() for r in caplog.records)
        assert relay_status(url).capture["slot_state"] == "ok"
        assert _pending(url) == 0


@_in_loop
async def test_a_clone_made_with_create_database_template_writes_rows_until_enabled(
    logical_pg: PgServer,
) -> None:
    """The clone's capture row names the original's slot, which decodes only the original:
    the clone's relay publishes its pending rows from the table (those it was cloned with
    too: a clone is a copy of the database) and the original keeps capturing, each message
    once per database."""
    with _databases(logical_pg, 1) as [(db, url)]:
        enable_capture(url)
        before = _publish(url, 2, "o")
        clone = f"{db}_clone"
        clone_url = logical_pg.create_database(clone, template=db)
        try:
            assert relay_status(clone_url).capture["slot_state"] == "foreign"
            cloned = _publish(clone_url, 5, "c", sql_function=1)
            original = _publish(url, 3, "o")
            assert (_pending(url), _pending(clone_url)) == (5, 8)
            log1, log2 = FakePublisher(), FakePublisher()
            relays = [Relay(config(url), log1), Relay(config(clone_url), log2)]
            async with running(*relays):
                await _until(lambda: len(log1.log) == 5, 30, "the original's messages")
                await _until(lambda: len(log2.log) == 8, 30, "the clone's messages")
                assert relays[1].capture is not None
                assert not relays[1].capture.capturing
            assert sorted(e.id for _, e in log1.log) == sorted(before + original)
            assert sorted(e.id for _, e in log2.log) == sorted(before + cloned)
            assert _in_order(log1.log)
            assert _in_order(log2.log)
            assert enable_capture(clone_url)["slot"] == default_slot(clone)
        finally:
            _drop_slots_of(logical_pg, clone)
            logical_pg.drop_database(clone)


@pytest.fixture
def tiny_wal_keep() -> Iterator[PgServer]:
    """A cluster of this test's own (never OUTBOX_TEST_LOGICAL_URL's shared one: it is
    reconfigured) that invalidates a slot past 1 MB of WAL."""
    with tempfile.TemporaryDirectory(prefix="outbox-invalidate-") as workdir:
        try:
            server = logical_server(workdir, durable=True)
        except (OSError, RuntimeError) as exc:
            pytest.skip(f"no private PostgreSQL cluster: {exc}")
        if server is None:
            pytest.skip("no PostgreSQL server binaries for a private cluster")
        try:
            with psycopg.connect(server.admin_url, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
                conn.execute("ALTER SYSTEM SET wal_keep_size = 0")
                conn.execute("SELECT pg_reload_conf()")
            yield server
        finally:
            server.stop()


def _invalidate(url: str, slot: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS filler (x text)")
        for _ in range(3):
            conn.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 100)")
            conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
        row = conn.execute(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    assert row == ("lost",), row


@_in_loop
async def test_an_invalidated_slot_is_flagged_then_made_again_and_loses_nothing(
    tiny_wal_keep: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("prometheus_client")
    with _databases(tiny_wal_keep, 1) as [(db, url)]:
        slot = enable_capture(url)["slot"]
        first = _publish(url, 2, "k")  # in the table, and in the slot that is about to go
        _invalidate(url, slot)
        kept = first + _publish(url, 3, "k", sql_function=1)
        assert _pending(url) == 6

        state = relay_status(url).capture
        assert state["slot_state"] == "invalidated"
        assert "no message is lost" in state["problem"]
        assert state["confirmed_lsn"] in state["problem"]
        with pytest.raises(ConfigurationError, match="pg_drop_replication_slot"):
            enable_capture(url)
        publisher, metrics = FakePublisher(), RelayMetrics.prometheus()
        relay = Relay(config(url, heartbeat_interval=0.1), publisher, metrics=metrics)
        caplog.set_level(logging.WARNING, logger="relay")
        async with running(relay):
            await _until(lambda: len(publisher.log) == 6, 30, "every message published")
            await _until(
                lambda: _gauge(metrics, "outbox_capture_slot_ok", {"slot": slot}) == 1,
                20, "the fresh slot ok",
            )  # fmt: skip
            assert _gauge(metrics, "outbox_capture_slot_state",
                          {"slot": slot, "database": db, "state": "ok"}) == 1  # fmt: skip
        assert [e.id for _, e in publisher.log] == kept  # one key, in commit order
        assert _in_order(publisher.log)
        assert any("is invalidated" in r.getMessage() for r in caplog.records)
        assert any("created a fresh slot" in r.getMessage() for r in caplog.records)


def test_switching_slots_while_the_databases_slot_holds_messages_is_refused(
    logical_pg: PgServer,
) -> None:
    with _databases(logical_pg, 1) as [(_db, url)]:
        slot = enable_capture(url)["slot"]
        with pytest.raises(ConfigurationError, match=f"captures through replication slot '{slot}'"):
            enable_capture(url, slot="outbox_other_t")
        disable_capture(url)
        with pytest.raises(ConfigurationError, match="drop it"):
            enable_capture(url, slot="outbox_other_t")  # still draining: it may hold messages
        assert relay_status(url).capture["slot"] == slot


def test_a_second_schema_of_one_database_is_refused_wal_mode(logical_pg: PgServer) -> None:
    """A slot decodes every logical message of its database: two outbox schemas of one
    database in 'wal' mode would each record the other's messages."""
    with _databases(logical_pg, 1) as [(_db, url)]:
        upgrade(url, schema="messaging")
        enable_capture(url)
        with pytest.raises(ConfigurationError, match="schema 'public' of this database"):
            enable_capture(url, schema="messaging")
        assert relay_status(url, schema="messaging").capture["mode"] == "polling"
        slot = disable_capture(url)["slot"]
        with pytest.raises(ConfigurationError, match=f"still has its replication slot '{slot}'"):
            enable_capture(url, schema="messaging")  # public's relays drain it in rounds
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        assert enable_capture(url, schema="messaging")["slot_state"] == "ok"
