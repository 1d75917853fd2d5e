"""Every bad input raises a clear error before anything is written, and the caller's
transaction stays usable (nothing was sent, so nothing was aborted)."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from outbox import (
    ConfigurationError,
    InvalidMessageError,
    Message,
    PayloadTooLargeError,
    SchemaNotInstalledError,
    SerializationError,
    TransactionRequiredError,
    publish,
    publish_batch,
)
from outbox._capture import decode_record
from outbox._migrate import sqlalchemy_url

#: what a transaction has written: the messages of the ledger, where every writer puts them
#: (outbox_wal_pending), and of outbox_messages, where the relay records them once numbered
LEDGER = "SELECT record FROM outbox_wal_pending"
COUNT = "SELECT (SELECT count(*) FROM outbox_wal_pending) + (SELECT count(*) FROM outbox_messages)"


def written_keys(session: Session) -> list[str]:
    """The keys of the messages ``session``'s transaction holds, in the ledger (sorted); none
    may be in outbox_messages, which only the relay writes."""
    assert session.execute(text("SELECT count(*) FROM outbox_messages")).scalar() == 0
    records = session.execute(text(LEDGER)).scalars().all()
    return sorted(decode_record(bytes(r)).key for r in records)


BAD = [
    (dict(topic="", key="k", payload={}), InvalidMessageError, "topic must not be empty"),
    (dict(topic="t", key="  ", payload={}), InvalidMessageError, "key must not be empty"),
    (dict(topic="t", key=42, payload={}), InvalidMessageError, "key must be a str, got int"),
    (
        dict(topic="t", key="k", payload={"items": [{"price": decimal.Decimal("1.5")}]}),
        SerializationError,
        "payload['items'][0]['price'] is of type decimal.Decimal",
    ),
    (
        dict(topic="t", key="k", payload={"x": float("nan")}),
        SerializationError,
        "payload['x'] is nan",
    ),
    (dict(topic="t", key="k", payload={1: "a"}), SerializationError, "key 1 of type int"),
    (
        dict(topic="t", key="k", payload={}, headers={"n": 1}),
        SerializationError,
        "headers['n'] must map a str to a str",
    ),
    (
        dict(topic="t", key="k", payload={}, headers={"Outbox-Seq": "1"}),
        SerializationError,
        "reserved for the envelope",
    ),
    (
        dict(topic="t", key="k", payload="x" * 2000, max_payload_bytes=1000),
        PayloadTooLargeError,
        "2002 bytes serialized (with its headers), above the maximum of 1000",
    ),
    (
        dict(topic="t", key="k", payload={}, deliver_after=dt.timedelta(seconds=-1)),
        InvalidMessageError,
        "deliver_after must be a non-negative",
    ),
    (
        dict(topic="t", key="k", payload={}, available_at=dt.datetime(2030, 1, 1)),
        InvalidMessageError,
        "available_at must be a timezone-aware datetime",
    ),
    (
        dict(
            topic="t",
            key="k",
            payload={},
            available_at=dt.datetime.now(dt.UTC),
            deliver_after=dt.timedelta(1),
        ),
        InvalidMessageError,
        "not both",
    ),
    (
        dict(topic="t", key="k", payload={}, idempotency_key=""),
        InvalidMessageError,
        "idempotency_key must not be empty",
    ),
    (dict(topic="t", key="k" * 1025, payload={}), InvalidMessageError, "key is 1025 bytes"),
    (dict(topic="t" * 256, key="k", payload={}), InvalidMessageError, "topic is 256 bytes"),
    (dict(topic="t", key="k\ud800", payload={}), InvalidMessageError, "key is not valid Unicode"),
    (
        dict(topic="t", key="k", payload={"note": "a\udcff"}),
        SerializationError,
        "payload has a string with a lone surrogate",
    ),
    (
        dict(topic="t", key="k", payload={}, headers={"x-note": "\ud800"}),
        SerializationError,
        "headers['x-note'] is not valid Unicode",
    ),
    (
        dict(topic="t", key="k", payload={}, headers={"a b:c": "1"}),
        SerializationError,
        "header name 'a b:c' must be non-empty, without whitespace",
    ),
    (
        dict(topic="t", key="k", payload={}, headers={"x-v": "a\r\nInjected: 1"}),
        SerializationError,
        "contains a NUL, CR or LF",
    ),
    (
        dict(
            topic="t",
            key="k",
            payload="x" * 900,
            headers={"x-big": "y" * 200},
            max_payload_bytes=1000,
        ),
        PayloadTooLargeError,
        "(with its headers), above the maximum of 1000",
    ),
    (
        dict(topic="t", key="k", payload={}, deliver_after=dt.timedelta.max),
        InvalidMessageError,
        "beyond the year 9999",
    ),
    (
        dict(topic="t", key="k", payload={}, schema="Bad-Name"),
        ConfigurationError,
        "invalid schema name 'Bad-Name'",
    ),
]


@pytest.mark.parametrize(("kwargs", "error", "says"), BAD, ids=[b[2][:30] for b in BAD])
def test_bad_input_raises_clear_error_and_writes_nothing(
    session: Session, kwargs: dict[str, Any], error: type[Exception], says: str
) -> None:
    publish(session, topic="t", key="ok", payload={"before": True})
    with pytest.raises(error, match=None) as info:
        publish(session, **kwargs)
    assert says in str(info.value)
    # the transaction is intact and holds only the good message
    assert written_keys(session) == ["ok"]


def test_bad_message_in_batch_writes_none_of_the_batch(pg_conn: psycopg.Connection[Any]) -> None:
    batch = [Message("t", "k", 1), Message("t", "k", object())]
    with pytest.raises(SerializationError, match=r"payload is of type builtins\.object"):
        publish_batch(pg_conn, batch)
    assert pg_conn.execute(COUNT).fetchone() == (0,)


def test_psycopg_autocommit_is_refused_with_atomicity_explained(shared_url: str) -> None:
    with psycopg.connect(shared_url, autocommit=True) as conn:
        with pytest.raises(TransactionRequiredError, match="apart from your business rows"):
            publish(conn, topic="t", key="k", payload={})
        # inside an explicit transaction block the same connection is fine
        with conn.transaction(force_rollback=True):
            publish(conn, topic="t", key="k", payload={})
            assert conn.execute(COUNT).fetchone() == (1,)
        assert conn.execute(COUNT).fetchone() == (0,)


def test_sqlalchemy_autocommit_isolation_is_refused(shared_url: str) -> None:
    engine = create_engine(
        sqlalchemy_url(shared_url), poolclass=NullPool, isolation_level="AUTOCOMMIT"
    )
    with engine.connect() as conn:
        with pytest.raises(TransactionRequiredError, match="isolation_level='AUTOCOMMIT'"):
            publish(conn, topic="t", key="k", payload={})
        conn.rollback()
        with pytest.raises(TransactionRequiredError, match="AUTOCOMMIT"), conn.begin():
            publish(conn, topic="t", key="k", payload={})  # begin() opens no transaction here
        # what the error says to do works: the message and the rows commit or roll back together
        conn = conn.execution_options(isolation_level="READ COMMITTED")
        transaction = conn.begin()
        publish(conn, topic="t", key="k", payload={})
        transaction.rollback()
        assert conn.exec_driver_sql(COUNT).scalar() == 0
    engine.dispose()


def test_failed_transaction_is_refused(pg_conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        pg_conn.execute("SELECT 1/0")
    with pytest.raises(TransactionRequiredError, match="already failed"):
        publish(pg_conn, topic="t", key="k", payload={})


def test_missing_tables_say_how_to_install(empty_database_url: str) -> None:
    with (
        psycopg.connect(empty_database_url) as conn,
        pytest.raises(SchemaNotInstalledError, match="outbox migrate upgrade"),
    ):
        publish(conn, topic="t", key="k", payload={})


def test_unsupported_target_is_named() -> None:
    with pytest.raises(ConfigurationError, match=r"cannot write through a builtins\.str"):
        publish("postgresql://x", topic="t", key="k", payload={})


def test_sqlalchemy_engine_without_psycopg3_is_named() -> None:
    engine = create_engine("sqlite://")
    with (
        Session(engine) as session,
        pytest.raises(ConfigurationError, match="postgresql\\+psycopg://"),
    ):
        publish(session, topic="t", key="k", payload={})


def test_a_known_header_name_with_a_bad_value_is_refused_and_writes_nothing(
    session: Session,
) -> None:
    # The second publish finds the name among the names already checked (the headers' fast
    # path); a bad value with that name must still be refused, before anything is written.
    publish(session, topic="t", key="ok", payload={}, headers={"x-tenant": "acme"})
    publish(session, topic="t", key="ok", payload={}, headers={"x-tenant": "beta"})
    with pytest.raises(SerializationError, match=r"headers\['x-tenant'\] contains a NUL, CR or LF"):
        publish(session, topic="t", key="bad", payload={}, headers={"x-tenant": "a\r\nX: 1"})
    with pytest.raises(SerializationError, match="headers\\['x-tenant'\\] must map a str to a str"):
        publish(session, topic="t", key="bad", payload={}, headers={"x-tenant": 7})  # type: ignore[dict-item]
    assert written_keys(session) == ["ok", "ok"]
