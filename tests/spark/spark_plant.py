"""Planting outbox and inbox rows for the reconciliation tests."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

import psycopg

from spark_ingest import Source


def source(name: str, url: str) -> Source:
    return Source(name, url)


#: The variable the cluster tests pass the database password in: the driver's alone, never the
#: workers' (the driver reads it and hands it to the JDBC reads it sends to the executors).
RECON_PASSWORD_ENV = "OUTBOX_TEST_RECON_PW"

#: An xid below any live horizon: planted rows stand for transactions long committed, so a
#: concurrent test's open transaction elsewhere in the cluster cannot defer them.
OLD_XID = 3


@dataclass
class Msg:
    id: str
    topic: str
    key: str
    seq: int
    status: str
    created_at: dt.datetime
    published_at: dt.datetime | None
    #: A scheduled message (deliver_after / available_at); None: due when created.
    available_at: dt.datetime | None = None


def new_id() -> str:
    return str(uuid.uuid4())


def insert_outbox(url: str, *msgs: Msg, tx_id: int | None = OLD_XID) -> None:
    with psycopg.connect(url) as conn:
        for m in msgs:
            conn.execute(
                "INSERT INTO outbox_messages (id, topic, key, seq, payload, created_at, "
                "available_at, status, published_at, tx_id) VALUES (%s, %s, %s, %s, '\\x7b7d', "
                "%s, %s, %s, %s, coalesce(%s::text::xid8, pg_current_xact_id()))",
                (
                    m.id,
                    m.topic,
                    m.key,
                    m.seq,
                    m.created_at,
                    m.available_at or m.created_at,
                    m.status,
                    m.published_at,
                    None if tx_id is None else str(tx_id),
                ),
            )


def insert_inbox(
    url: str,
    consumer: str,
    msg_id: str,
    topic: str,
    key: str,
    seq: int,
    processed_at: dt.datetime,
    *,
    status: str = "processed",
    attempts: int = 1,
    duplicates: int = 0,
) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO inbox_messages (consumer, message_id, topic, key, seq, received_at, "
            "processed_at, attempts, duplicates, status) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                consumer,
                msg_id,
                topic,
                key,
                seq,
                processed_at,
                processed_at,
                attempts,
                duplicates,
                status,
            ),
        )
