"""The producer's SQL (and the re-drive's), rendered once per schema. Read the comments before
changing anything.

Statements use psycopg's ``%(name)s`` placeholders and run on the caller's own connection,
inside the caller's transaction. Identifiers are composed with ``psycopg.sql`` from validated
names, never formatted into the text: the convention of ``outbox/_sql.py``, which every
package's registry follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from outbox._capture import PREFIX
from outbox._sql import Names, qualified, registry, table_name
from outbox.schema import (
    OUTBOX_CAPTURE,
    OUTBOX_DEAD_AUDIT,
    OUTBOX_MESSAGES,
    OUTBOX_SEQUENCES,
    OUTBOX_WRITE_COUNTER,
)

__all__ = [
    "WAKEUP_CHANNEL",
    "ProducerStatements",
    "RedriveStatements",
    "producer_statements",
    "redrive_statements",
]

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
        %(ids)b::uuid[], %(topics)b::text[], %(keys)b::text[], %(headers)s::jsonb[],
        %(payloads)b::bytea[], %(content_types)b::text[], %(traceparents)b::text[],
        %(available_ats)b::timestamptz[]
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
    RETURNING m.id, m.seq, m.tx_id, nextval({counter})
)
SELECT i.id, ins.seq, ins.tx_id::text, f.id IS NOT NULL AS fresh,
       (SELECT c.mode FROM {capture} AS c) AS mode, 0::bigint
FROM input AS i
LEFT JOIN fresh AS f ON f.id = i.id
LEFT JOIN inserted AS ins ON ins.id = i.id
ORDER BY i.ord
"""

# Both inserts also take a number from outbox_write_counter once their rows are written (the
# transaction has its id by then): that is what a polling relay's commit watch sees
# (relay/_watch.py). nextval never waits and is never rolled back; in RETURNING it runs per
# row, after the row's insert.
#
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
RETURNING m.id, m.seq, m.tx_id::text, true, (SELECT c.mode FROM {capture} AS c),
          nextval({counter})
"""
# The clause that makes outbox_messages_insert_one idempotent (insert_one_idempotent): no row
# in `bumped` when the id exists, so the counter stays and nothing is inserted.
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
    SELECT t, k, 0 FROM unnest(%(row_topics)b::text[], %(row_keys)b::text[]) AS u(t, k)
    ORDER BY t, k
    ON CONFLICT (topic, key) DO UPDATE SET last_seq = s.last_seq
    RETURNING 1
)
SELECT pg_advisory_xact_lock(3084, k) FROM unnest(%(lock_keys)b::int4[]) AS k
WHERE (SELECT count(*) FROM held) >= 0
ORDER BY k
"""

# outbox_wal_emit ('wal' capture mode, docs/capture.md): the messages as transactional logical
# messages, in input order (volatile functions in the target list are evaluated after the
# sort). Nothing is written to any table and nothing is locked: the relay decodes them after
# commit, in commit order, and gives them their seqs. Emits nothing (zero rows) unless the
# database is in 'wal' mode (and, in the _checked variant, its slot can decode them: the slot
# check below): the writer then writes them as rows instead, in the same transaction. Rolled
# back, they are never decoded.
_WAL_EMIT = """
SELECT pg_logical_emit_message(true, {prefix}, u.record)
FROM {capture} AS c, unnest(%(records)b::bytea[]) WITH ORDINALITY AS u(record, ord)
WHERE c.mode = 'wal' {slot_check}
ORDER BY u.ord
"""

# outbox_wal_emit_one: the same for a batch of one (every publish()): no array to build, send
# and unnest, no sort. The mode check is the same one-row scan.
_WAL_EMIT_ONE = """
SELECT pg_logical_emit_message(true, {prefix}, %(record)b::bytea)
FROM {capture} AS c WHERE c.mode = 'wal' {slot_check}
"""

# The slot check (the emits' _checked variants): a message goes to the WAL only while the slot
# the mode row names is a pgoutput slot of THIS database that still has its WAL. Slot names
# are global to the server and a logical slot decodes one database only, so without it a
# database whose row names another database's slot (a second database enabled with the same
# slot name, a clone made with CREATE DATABASE ... TEMPLATE, a restore) or a slot that was
# dropped or invalidated would emit into WAL that nothing decodes: the messages would be
# lost, in no table. Refused, they are written as rows, which the polling loop publishes.
# It costs a statement tens of microseconds (pg_get_replication_slots() builds its whole
# result, and the view joins pg_database), up to a tenth of a CPU-bound transaction
# (bench/capture_slot_check.py), so a connection runs it on its first emit and then at most
# every SLOT_CHECK_SECONDS
# (outbox/_capture.py); the emits in between check the mode only. A slot dropped after the
# check and before the commit still loses the message: the drop is not transactional
# (docs/capture.md says what is lost and how to find it).
_SLOT_CHECK = """AND EXISTS (
    SELECT 1 FROM pg_catalog.pg_replication_slots AS s
    WHERE s.slot_name = c.slot AND s.database = current_database()
      AND s.plugin = 'pgoutput' AND s.wal_status IS DISTINCT FROM 'lost')"""


@dataclass(frozen=True)
class ProducerStatements:
    insert: bytes
    insert_one: bytes
    insert_one_idempotent: bytes
    idempotency_lock: bytes
    wal_emit: bytes
    wal_emit_one: bytes
    wal_emit_checked: bytes
    wal_emit_one_checked: bytes


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "sequences": qualified(schema, OUTBOX_SEQUENCES),
        "capture": qualified(schema, OUTBOX_CAPTURE),
        "counter": table_name(schema, OUTBOX_WRITE_COUNTER),
        "prefix": sql.Literal(PREFIX),
    }


#: The producer statements for tables in ``schema`` (``None``: the search_path).
producer_statements = registry(
    ProducerStatements,
    {
        "insert": _INSERT,
        "insert_one": (_INSERT_ONE, {"guard": ""}),
        "insert_one_idempotent": (_INSERT_ONE, {"guard": _GUARD}),
        "idempotency_lock": _IDEMPOTENCY_LOCK,
        "wal_emit": (_WAL_EMIT, {"slot_check": ""}),
        "wal_emit_one": (_WAL_EMIT_ONE, {"slot_check": ""}),
        "wal_emit_checked": (_WAL_EMIT, {"slot_check": _SLOT_CHECK}),
        "wal_emit_one_checked": (_WAL_EMIT_ONE, {"slot_check": _SLOT_CHECK}),
    },
    _names,
)


# --- Re-drive: re-queueing lost messages (`outbox redrive`) ----------------------------------
# Not the producer's: these need the relay's privileges (UPDATE on outbox_messages, INSERT on
# outbox_dead_audit). The relay owns re-queueing (relay/_queries.py, outbox_dead_retry), but
# the Spark job that finds lost messages and runs `outbox redrive` may not import the relay
# (pyproject.toml [tool.importlinter]: relay, inbox and spark_ingest are independent layers on
# outbox), so the statements both may run live here, at the bottom.

# outbox_redrive_preview: each given id's status (an id without a row is missing); read-only,
# for --dry-run and for the report of what was already pending or missing. A primary-key probe
# per id.
_REDRIVE_PREVIEW = """
SELECT id::text, status FROM {messages} WHERE id = ANY(%(ids)b::uuid[])
"""

# outbox_redrive: set the given ids back to pending, available now, with one audit row each
# (action 'redrive', who, why), in one statement: the change and its audit commit together,
# as for outbox_dead_retry.
#
# * Rows are re-queued only if they exist and are not already pending, so running it twice, or
#   concurrently with the relay, is harmless: a pending row (leased or not) is the relay's and
#   is left alone; published and dead rows are never leased. Two re-drives of one id: the
#   second waits for the first's row lock, then PostgreSQL re-checks `status <> 'pending'` on
#   the newest version and skips the row, so each re-queue is audited once.
# * `id = ANY(array)`: the primary key's index finds the rows, one probe per id.
# * attempts and last_error are kept as the record of what happened before (last_error is
#   copied into the audit row too); published_at is cleared because the row is no longer
#   published (the relay sets it again).
# * Returns the ids that changed, each with the writing transaction's id, which the caller
#   hands to the doorbell (outbox/_wakeup.py) to wake relays once it has committed; the
#   number taken from outbox_write_counter wakes a watching relay (relay/_watch.py) as well.
_REDRIVE = """
WITH requeued AS (
    UPDATE {messages}
       SET status = 'pending', available_at = clock_timestamp(), published_at = NULL
     WHERE id = ANY(%(ids)b::uuid[]) AND status <> 'pending'
    RETURNING id, topic, key, seq, last_error
)
INSERT INTO {audit} (actor, action, message_id, topic, key, seq, last_error, reason)
SELECT %(actor)s, 'redrive', id, topic, key, seq, last_error, %(reason)s FROM requeued
RETURNING message_id::text, pg_current_xact_id()::text, nextval({counter})
"""


@dataclass(frozen=True)
class RedriveStatements:
    preview: bytes
    redrive: bytes


#: The re-drive statements for tables in ``schema`` (``None``: the search_path).
redrive_statements = registry(
    RedriveStatements,
    {"preview": _REDRIVE_PREVIEW, "redrive": _REDRIVE},
    lambda schema: {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "audit": qualified(schema, OUTBOX_DEAD_AUDIT),
        "counter": table_name(schema, OUTBOX_WRITE_COUNTER),
    },
)
