"""Publishing from SQL alone: `outbox_publish(...)` (migration outbox_0009) has the semantics of
publish(): validation that writes nothing, UUIDv7 ids, the same idempotency ids as Python,
gapless per-key seqs shared with Python writers in commit order, a relay that delivers what it
wrote, and a trigger that publishes with the business row."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from outbox import publish
from outbox._capture import decode_record
from outbox._ids import id_from_idempotency_key
from relay import Relay
from relay.brokers.memory import MemoryPublisher
from tests.relay.relay_helpers import await_for, config, running
from tests.support.ledger import record


def _one(conn: psycopg.Connection[Any], statement: str, *params: Any) -> Any:
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    return row[0]


@settings(max_examples=60, deadline=None)
@given(topic=st.text(min_size=1, max_size=30), key=st.text(min_size=1, max_size=120))
def test_idempotency_ids_equal_pythons(shared_url: str, topic: str, key: str) -> None:
    # keys up to 360 UTF-8 bytes: one to several SHA-1 blocks
    topic, key = topic.replace("\x00", "?"), key.replace("\x00", "?")
    encodable = all(not 0xD800 <= ord(ch) <= 0xDFFF for ch in topic + key)
    if not encodable:  # lone surrogates are not text PostgreSQL can hold
        return
    with psycopg.connect(shared_url) as conn:
        derived = _one(conn, "SELECT outbox_idempotency_id(%s, %s)", topic, key)
    assert derived == id_from_idempotency_key(topic, key)


def test_sha1_matches_known_vectors(shared_url: str) -> None:
    import hashlib

    with psycopg.connect(shared_url) as conn:
        for data in (b"", b"abc", b"a" * 55, b"a" * 56, b"a" * 64, bytes(range(256)) * 3):
            assert _one(conn, "SELECT outbox_sha1(%s)", data) == hashlib.sha1(data).digest()


def test_uuid_v7_is_version_7_and_time_ordered(shared_url: str) -> None:
    with psycopg.connect(shared_url) as conn:
        ids = [_one(conn, "SELECT outbox_uuid_v7()") for _ in range(50)]
    assert {i.version for i in ids} == {7}
    assert {i.variant for i in ids} == {uuid.RFC_4122}
    millis = [i.int >> 80 for i in ids]
    assert millis == sorted(millis)
    assert len(set(ids)) == 50


def test_outbox_publish_writes_the_record_publish_writes(database_url: str) -> None:
    """Every field of the ledger's record as the relay decodes it, and a UUIDv7 id made at the
    call: time-ordered, version 7, RFC 4122 variant, its milliseconds the call's."""
    calls = [
        ("orders", "k1", '{"n": 1}', '{"x-type": "Created"}', None, None),
        ("orders", "k2", "[1, 2]", "{}", "PT2S", "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"),
        ("a/b.c-d_e", "é ü", '"text"', '{"x-a": "1", "x-b": "2"}', None, None),
    ] * 20
    before = dt.datetime.now(dt.UTC)
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        ids = []
        for topic, key, payload, headers, delay, trace in calls:
            row = conn.execute(
                "SELECT outbox_publish(%s, %s, %s::jsonb, headers => %s::jsonb, "
                "deliver_after => %s::interval, traceparent => %s) AS id",
                (topic, key, payload, headers, delay, trace),
            ).fetchone()
            assert row is not None
            ids.append(row["id"])
        conn.commit()
        rows = conn.execute("SELECT id, record FROM outbox_wal_pending").fetchall()
    after = dt.datetime.now(dt.UTC)
    assert {i.version for i in ids} == {7}
    assert {i.variant for i in ids} == {uuid.RFC_4122}
    millis = [i.int >> 80 for i in ids]
    assert millis == sorted(millis)
    assert before.timestamp() * 1000 - 1 <= millis[0] <= millis[-1] <= after.timestamp() * 1000
    assert len(set(ids)) == len(calls)
    decoded = {r["id"]: decode_record(bytes(r["record"])) for r in rows}
    assert set(decoded) == set(ids)
    for msg_id, (topic, key, payload, headers, delay, trace) in zip(ids, calls, strict=True):
        rec = decoded[msg_id]
        assert (rec.id, rec.topic, rec.key, rec.traceparent) == (msg_id, topic, key, trace)
        assert rec.content_type == "application/json"
        assert not rec.idempotent
        assert json.loads(rec.payload) == json.loads(payload)
        assert json.loads(rec.headers) == json.loads(headers)
        if delay is None:
            assert rec.available_at is None
        else:
            assert rec.available_at is not None
            assert before + dt.timedelta(seconds=2) <= rec.available_at
            assert rec.available_at <= after + dt.timedelta(seconds=2)


def test_sql_and_python_writers_share_one_gapless_sequence(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        first = _one(conn, "SELECT outbox_publish('orders', 'A', '{\"n\": 1}')")
        publish(conn, topic="orders", key="A", payload={"n": 2})
        third = _one(
            conn,
            "SELECT outbox_publish('orders', 'A', '[3]', headers => '{\"x-tenant\": \"acme\"}', "
            "deliver_after => interval '1 hour')",
        )
        conn.commit()
        assert record(database_url) == 3  # numbered by the relay's ledger reader
        rows = conn.execute(
            "SELECT id, seq, payload, headers, content_type, available_at > now() + interval "
            "'50 minutes' FROM outbox_messages ORDER BY seq"
        ).fetchall()
    assert [r[1] for r in rows] == [1, 2, 3]
    assert (rows[0][0], rows[2][0]) == (first, third)
    assert first.version == 7
    assert (bytes(rows[0][2]), rows[0][4], rows[0][5]) == (b'{"n": 1}', "application/json", False)
    assert (rows[2][3], rows[2][5]) == ({"x-tenant": "acme"}, True)


def test_idempotency_key_is_a_no_op_across_sql_and_python(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        py_id = publish(conn, topic="pay", key="K", payload=1, idempotency_key="charge-9")
        conn.commit()
        record(database_url)  # recorded: its copy below is dropped by the relay
        again = _one(conn, "SELECT outbox_publish('pay', 'K', '1', idempotency_key => 'charge-9')")
        fresh = _one(conn, "SELECT outbox_publish('pay', 'K', '2', idempotency_key => 'charge-10')")
        repeat = _one(
            conn, "SELECT outbox_publish('pay', 'K', '2', idempotency_key => 'charge-10')"
        )
        conn.commit()
        # charge-10 twice before the relay numbered it: one ledger row
        assert _one(conn, "SELECT count(*) FROM outbox_wal_pending") == 2
        assert record(database_url) == 1
        seqs = conn.execute("SELECT id, seq FROM outbox_messages ORDER BY seq").fetchall()
        py_again = publish(conn, topic="pay", key="K", payload=2, idempotency_key="charge-10")
    assert again == py_id
    assert repeat == fresh == id_from_idempotency_key("pay", "charge-10") == py_again
    assert seqs == [(py_id, 1), (fresh, 2)]


def test_rollback_leaves_nothing(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT outbox_publish('orders', 'A', '1')")
        conn.rollback()
        assert _one(conn, "SELECT count(*) FROM outbox_wal_pending") == 0
        assert _one(conn, "SELECT count(*) FROM outbox_messages") == 0
        assert _one(conn, "SELECT count(*) FROM outbox_key_sequences") == 0


BAD = [
    ("outbox_publish(' ', 'k', '1')", "topic must not be empty or blank"),
    ("outbox_publish(repeat('t', 256), 'k', '1')", "topic is 256 bytes in UTF-8"),
    ("outbox_publish('t', repeat('é', 513), '1')", "key is 1026 bytes in UTF-8"),
    ("outbox_publish('t', NULL, '1')", "key must not be empty or blank"),
    ("outbox_publish('t', 'k', NULL)", "payload must not be NULL"),
    ("outbox_publish('t', 'k', '1', headers => '[1]')", "headers must be a JSON object"),
    ("outbox_publish('t', 'k', '1', headers => '{\"n\": 1}')", "headers[n] must be text"),
    ("outbox_publish('t', 'k', '1', headers => '{\"Outbox-Seq\": \"1\"}')", "reserved"),
    ("outbox_publish('t', 'k', '1', headers => '{\"a b\": \"1\"}')", "must be non-empty"),
    ("outbox_publish('t', 'k', '1', headers => '{\"h\": \"a\\nb\"}')", "CR or LF"),
    ("outbox_publish('t', 'k', '1', deliver_after => '-1 second')", "must not be negative"),
    (
        "outbox_publish('t', 'k', to_jsonb(repeat('x', 2000)), max_payload_bytes => 1000)",
        "2002 bytes serialized (with its headers), above the maximum of 1000",
    ),
    ("outbox_publish('t', 'k', '1', idempotency_key => '')", "idempotency_key must not be"),
]


@pytest.mark.parametrize(("call", "says"), BAD)
def test_bad_input_names_the_problem_and_writes_nothing(
    database_url: str, call: str, says: str
) -> None:
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=None) as info:
            conn.execute(f"SELECT {call}")
        assert says in str(info.value)
        conn.rollback()
        assert _one(conn, "SELECT count(*) FROM outbox_wal_pending") == 0
        assert _one(conn, "SELECT count(*) FROM outbox_messages") == 0


def test_concurrent_sql_writers_get_seqs_in_commit_order(database_url: str) -> None:
    """Two writers of one key: neither waits for the other (a writer inserts one ledger row and
    locks nothing of its key), and the seqs follow the commits: the second writer, committed
    first, is numbered first."""
    first = psycopg.connect(database_url)
    second = psycopg.connect(database_url)
    try:
        a = _one(first, "SELECT outbox_publish('orders', 'A', '1')")
        second.execute("SET lock_timeout = '300ms'")  # a wait would fail it
        b = _one(second, "SELECT outbox_publish('orders', 'A', '2')")
        second.commit()
        assert record(database_url) == 1  # the open transaction's message is not numbered
        first.commit()
        assert record(database_url) == 1
        with psycopg.connect(database_url) as conn:
            seqs = dict(conn.execute("SELECT id, seq FROM outbox_messages").fetchall())
        assert (seqs[b], seqs[a]) == (1, 2)
    finally:
        first.close()
        second.close()


def test_a_trigger_publishes_with_the_business_row_and_the_relay_delivers(
    database_url: str,
) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY, total numeric NOT NULL)")
        conn.execute(
            """
            CREATE FUNCTION order_placed() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM outbox_publish('orders', NEW.id,
                    jsonb_build_object('event', 'OrderPlaced', 'total', NEW.total));
                RETURN NEW;
            END $$;
            CREATE TRIGGER order_placed AFTER INSERT ON orders
                FOR EACH ROW EXECUTE FUNCTION order_placed();
            """
        )
        conn.commit()
        conn.execute("INSERT INTO orders VALUES ('o-1', 12.5), ('o-2', 3)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES ('o-3', 1)")
        conn.rollback()  # rolled back with its message

    publisher = MemoryPublisher()

    async def deliver() -> None:
        async with running(Relay(config(database_url), publisher)):
            await await_for(lambda: len(publisher.messages.get("orders", [])) == 2, within=20)

    asyncio.run(deliver())
    sent = sorted(publisher.messages["orders"], key=lambda e: e.key)
    assert [(e.key, e.seq, e.content_type) for e in sent] == [
        ("o-1", 1, "application/json"),
        ("o-2", 1, "application/json"),
    ]
    assert sent[0].payload == b'{"event": "OrderPlaced", "total": 12.5}'
