"""The producer's SQL, rendered once per schema. Read the comments before changing anything.

Statements use psycopg's ``%(name)s`` placeholders and run on the caller's own connection,
inside the caller's transaction. Identifiers are composed with ``psycopg.sql`` from validated
names, never formatted into the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from psycopg import sql

from outbox._capture import PREFIX
from outbox.schema import OUTBOX_CAPTURE, OUTBOX_MESSAGES, OUTBOX_SEQUENCES, check_identifier

__all__ = ["WAKEUP_CHANNEL", "ProducerStatements", "producer_statements"]

#: NOTIFY channel that wakes relays. Versioned so old and new relays coexist in a rolling deploy.
WAKEUP_CHANNEL = "outbox_wakeup_v1"

# outbox_messages_insert: write a batch of messages and give each its per-(topic, key) sequence
# number, in one statement.
#
# Why the sequence numbers are gapless and in commit order:
# * `bumped` upserts one outbox_key_sequences row per (topic, key) and adds the number of new
#   messages. The upsert takes that row's lock and holds it until the caller's transaction
#   ends, so a second writer of the same key waits here; under READ COMMITTED its upsert then
#   re-reads the committed last_seq (or, if the first writer rolled back, the old one). Writers
#   of other keys lock other rows and never wait. Keys are locked in (topic, key) order so two
#   batches that share keys cannot deadlock.
# * `fresh` drops ids that already exist (an idempotency key published again) *before* a
#   number is taken, so a no-op republish leaves no hole. Two transactions racing on the same
#   new idempotency key are serialized beforehand by outbox_idempotency_lock: the loser's
#   statement starts after the winner has ended, so its snapshot sees the winner's row.
# * ON CONFLICT (id) DO NOTHING is the last line of defence; the caller checks that every
#   fresh row was inserted.
_INSERT = """
WITH input AS (
    SELECT *
    FROM unnest(
        %(ids)s::uuid[], %(topics)s::text[], %(keys)s::text[], %(headers)s::jsonb[],
        %(payloads)s::bytea[], %(content_types)s::text[], %(traceparents)s::text[],
        %(available_ats)s::timestamptz[]
    ) WITH ORDINALITY
        AS t(id, topic, key, headers, payload, content_type, traceparent, available_at, ord)
),
fresh AS (
    SELECT i.* FROM input AS i
    WHERE NOT EXISTS (SELECT 1 FROM {messages} AS m WHERE m.id = i.id)
),
counts AS (
    SELECT topic, key, count(*) AS n FROM fresh GROUP BY topic, key
),
bumped AS (
    INSERT INTO {sequences} AS s (topic, key, last_seq)
    SELECT topic, key, n FROM counts ORDER BY topic, key
    ON CONFLICT (topic, key) DO UPDATE SET last_seq = s.last_seq + excluded.last_seq
    RETURNING s.topic, s.key, s.last_seq
),
inserted AS (
    INSERT INTO {messages} AS m
        (id, topic, key, seq, headers, payload, content_type, traceparent, available_at)
    SELECT f.id, f.topic, f.key,
           b.last_seq - c.n + row_number() OVER (PARTITION BY f.topic, f.key ORDER BY f.ord),
           f.headers, f.payload, f.content_type, f.traceparent,
           coalesce(f.available_at, clock_timestamp())
    FROM fresh AS f
    JOIN counts AS c USING (topic, key)
    JOIN bumped AS b USING (topic, key)
    ORDER BY f.ord
    ON CONFLICT (id) DO NOTHING
    RETURNING m.id, m.seq, m.tx_id
)
SELECT i.id, ins.seq, ins.tx_id::text, f.id IS NOT NULL AS fresh,
       (SELECT c.mode FROM {capture} AS c) AS mode
FROM input AS i
LEFT JOIN fresh AS f ON f.id = i.id
LEFT JOIN inserted AS ins ON ins.id = i.id
ORDER BY i.ord
"""

# Both inserts also return the capture mode (outbox_capture, one row in shared buffers): that
# is how a writer learns, at no extra round trip, that the database switched to 'wal' mode.

# outbox_messages_insert_one: the common case, one message, as lean as it can be (about half the
# server time of the batch statement). Same locking argument as above: the upsert's row lock
# on (topic, key) is held to commit and orders same-key writers. With an idempotency key the
# counter is only bumped if the id does not exist yet (the idempotency lock taken before this
# statement makes that check race-free), and nothing is inserted if it does.
_INSERT_ONE = """
WITH bumped AS (
    INSERT INTO {sequences} AS s (topic, key, last_seq)
    SELECT %(topic)s, %(key)s, 1
    {guard}
    ON CONFLICT (topic, key) DO UPDATE SET last_seq = s.last_seq + 1
    RETURNING s.last_seq
)
INSERT INTO {messages} AS m
    (id, topic, key, seq, headers, payload, content_type, traceparent, available_at)
SELECT %(id)s, %(topic)s, %(key)s, b.last_seq, %(headers)s::jsonb, %(payload)s,
       %(content_type)s, %(traceparent)s, coalesce(%(available_at)s::timestamptz, clock_timestamp())
FROM bumped AS b
RETURNING m.id, m.seq, m.tx_id::text, true, (SELECT c.mode FROM {capture} AS c)
"""
_GUARD = "WHERE NOT EXISTS (SELECT 1 FROM {messages} AS e WHERE e.id = %(id)s)"

# outbox_idempotency_lock: only for batches with idempotency keys. A transaction-scoped
# advisory lock per derived id (two-key form, class 3084 = 0x0C0C reserved for outbox-inbox),
# taken in sorted order so two batches cannot deadlock. Released at commit or rollback.
#
# Lock order: the batch's counter rows first (all its keys, in (topic, key) order, as the
# insert takes them), then the advisory locks. Taken the other way round, a writer that
# holds the advisory lock would wait for a key's counter row while the transaction holding
# that row (it published on the key earlier) waits for the same advisory lock: a deadlock that
# the caller cannot avoid by ordering its own work. The no-op upsert (last_seq unchanged; 0
# for a new key, which the insert then bumps) waits for a concurrent writer of the key the way
# the insert would, and holds the row until the transaction ends. The count makes the
# upsert run to completion before the first advisory lock is requested.
_IDEMPOTENCY_LOCK = """
WITH held AS (
    INSERT INTO {sequences} AS s (topic, key, last_seq)
    SELECT t, k, 0 FROM unnest(%(row_topics)s::text[], %(row_keys)s::text[]) AS u(t, k)
    ORDER BY t, k
    ON CONFLICT (topic, key) DO UPDATE SET last_seq = s.last_seq
    RETURNING 1
)
SELECT pg_advisory_xact_lock(3084, k) FROM unnest(%(lock_keys)s::int4[]) AS k
WHERE (SELECT count(*) FROM held) >= 0
ORDER BY k
"""

# outbox_wal_emit ('wal' capture mode, docs/capture.md): the messages as transactional logical
# messages, in input order (volatile functions in the target list are evaluated after the
# sort). Nothing is written to any table and nothing is locked: the relay decodes them after
# commit, in commit order, and gives them their seqs. Emits nothing (zero rows) unless the
# database is in 'wal' mode: the writer then writes them as rows instead, in the same
# transaction. Rolled back, they are never decoded.
_WAL_EMIT = """
SELECT pg_logical_emit_message(true, {prefix}, u.record)
FROM {capture} AS c, unnest(%(records)s::bytea[]) WITH ORDINALITY AS u(record, ord)
WHERE c.mode = 'wal'
ORDER BY u.ord
"""

# outbox_tables_present: one catalog lookup, to turn "relation does not exist" into advice.
_TABLES_PRESENT = """
SELECT to_regclass(%(messages)s) IS NOT NULL AND to_regclass(%(sequences)s) IS NOT NULL
"""


@dataclass(frozen=True)
class ProducerStatements:
    insert: bytes
    insert_one: bytes
    insert_one_idempotent: bytes
    idempotency_lock: bytes
    wal_emit: bytes
    tables_present: bytes
    messages_name: str
    sequences_name: str


def _qualified(schema: str | None, table: str) -> sql.Identifier:
    return sql.Identifier(schema, table) if schema else sql.Identifier(table)


@lru_cache(maxsize=32)
def producer_statements(schema: str | None) -> ProducerStatements:
    """The producer statements for tables in ``schema`` (``None``: the search_path)."""
    if schema is not None:
        check_identifier(schema)
    messages = _qualified(schema, OUTBOX_MESSAGES)
    sequences = _qualified(schema, OUTBOX_SEQUENCES)
    capture = _qualified(schema, OUTBOX_CAPTURE)
    tables = {"messages": messages, "sequences": sequences, "capture": capture}
    insert = sql.SQL(_INSERT).format(**tables)
    guard = sql.SQL(_GUARD).format(messages=messages)
    one = sql.SQL(_INSERT_ONE).format(**tables, guard=sql.SQL(""))
    one_idem = sql.SQL(_INSERT_ONE).format(**tables, guard=guard)
    return ProducerStatements(
        insert=insert.as_string(None).encode(),
        insert_one=one.as_string(None).encode(),
        insert_one_idempotent=one_idem.as_string(None).encode(),
        idempotency_lock=sql.SQL(_IDEMPOTENCY_LOCK)
        .format(sequences=sequences)
        .as_string(None)
        .encode(),
        wal_emit=sql.SQL(_WAL_EMIT)
        .format(capture=capture, prefix=sql.Literal(PREFIX))
        .as_string(None)
        .encode(),
        tables_present=_TABLES_PRESENT.encode(),
        messages_name=messages.as_string(None),
        sequences_name=sequences.as_string(None),
    )
