-- The producer's SQL (outbox.publish), the re-drive's (`outbox redrive`), the doorbell's
-- (outbox/_wakeup.py) and the GRANTs of `outbox migrate grants`. Loaded and checked by
-- outbox/_sql.py, which says what the headers and placeholders mean. Statements run on the
-- caller's own connection, inside the caller's transaction, unless their comment says
-- otherwise. Read the comments before changing anything.

-- name: ledger_insert_one
-- outbox_ledger_insert_one: every publish() of a message without an idempotency key, in both
-- capture modes (docs/explanation/capture.md): one plain row of outbox_wal_pending, its id
-- (a fresh UUIDv7, so no conflict is possible) and its record (outbox/_capture.py). Nothing
-- else: no counter row, no lock, no index but the primary key, no mode to read. The naive
-- outbox insert costs the same. The relay gives the message its per-(topic, key) seq once the
-- transaction has committed, in commit order, records it in outbox_messages and deletes this
-- row in the same transaction: 'wal' mode decodes the insert from its slot, 'polling' mode
-- reads the table. A rollback removes the row with the business rows.
INSERT INTO {pending} (id, record) VALUES (%(id)s, %(record)b::bytea)

-- name: ledger_insert_one_idempotent
-- outbox_ledger_insert_one_idempotent: the same with an idempotency key: its id is derived from
-- (topic, key), so a second publish of the key before the relay recorded the first is a
-- conflict and a no-op (the first write wins; a concurrent writer of the same id waits for the
-- first transaction to end, as any unique index makes it). Once the relay recorded it, the row
-- is written again and the relay drops it (outbox_capture_known): a no-op too.
INSERT INTO {pending} (id, record) VALUES (%(id)s, %(record)b::bytea)
ON CONFLICT DO NOTHING

-- name: ledger_insert
-- outbox_ledger_insert: a batch (publish_batch), one row per distinct message, in input order
-- (the relay numbers a transaction's messages of a key in the order they were written).
INSERT INTO {pending} (id, record)
SELECT u.id, u.record
FROM unnest(%(ids)b::uuid[], %(records)b::bytea[]) WITH ORDINALITY AS u(id, record, ord)
ORDER BY u.ord
ON CONFLICT DO NOTHING

-- name: current_xact
-- outbox_current_xact: the writing transaction's id, for the doorbell (publish(...,
-- wakeup=True) only): it rings once that transaction has committed.
SELECT pg_current_xact_id()::text

-- Re-drive: re-queueing lost messages (`outbox redrive`). Not the producer's: these need the
-- relay's privileges (UPDATE on outbox_messages, INSERT on outbox_dead_audit). The relay owns
-- re-queueing (relay/statements.sql, dead_retry), but the Spark job that finds lost messages
-- and runs `outbox redrive` may not import the relay (pyproject.toml [tool.importlinter]:
-- relay, inbox and spark_ingest are independent layers on outbox), so the statements both may
-- run live here, at the bottom.

-- name: preview
-- outbox_redrive_preview: each given id's status (an id without a row is missing); read-only,
-- for --dry-run and for the report of what was already pending or missing. A primary-key probe
-- per id.
SELECT id::text AS id, status FROM {messages} WHERE id = ANY(%(ids)b::uuid[])

-- name: redrive
-- outbox_redrive: set the given ids back to pending, available now, with one audit row each
-- (action 'redrive', who, why), in one statement: the change and its audit commit together,
-- as for outbox_dead_retry.
--
-- * Rows are re-queued only if they exist and are not already pending, so running it twice, or
--   concurrently with the relay, is harmless: a pending row (leased or not) is the relay's and
--   is left alone; published and dead rows are never leased. Two re-drives of one id: the
--   second waits for the first's row lock, then PostgreSQL re-checks `status <> 'pending'` on
--   the newest version and skips the row, so each re-queue is audited once.
-- * `id = ANY(array)`: the primary key's index finds the rows, one probe per id.
-- * attempts and last_error are kept as the record of what happened before (last_error is
--   copied into the audit row too); published_at is cleared because the row is no longer
--   published (the relay sets it again).
-- * Returns the ids that changed, each with the writing transaction's id, which the caller
--   hands to the doorbell (outbox/_wakeup.py) to wake relays once it has committed; the
--   number taken from outbox_write_counter wakes a watching relay (relay/_watch.py) as well.
WITH requeued AS (
    UPDATE {messages}
       SET status = 'pending', available_at = clock_timestamp(), published_at = NULL
     WHERE id = ANY(%(ids)b::uuid[]) AND status <> 'pending'
    RETURNING id, topic, key, seq, last_error
)
INSERT INTO {audit} (actor, action, message_id, topic, key, seq, last_error, reason)
SELECT %(actor)s, 'redrive', id, topic, key, seq, last_error, %(reason)s FROM requeued
RETURNING message_id::text AS message_id, pg_current_xact_id()::text AS xact,
          nextval({counter}) AS watch

-- name: doorbell_session
-- The doorbell's own autocommit session (outbox/_wakeup.py): the NOTIFY's commit record needs
-- no WAL flush (see that module's docstring).
SET synchronous_commit = off

-- name: doorbell_settle (by position: xids, channel, committed)
-- outbox_doorbell_settle: statuses of the watched xids; pg_notify runs only if one committed
-- (or a commit hook already said so: %(committed)s). One round trip, in its own transaction.
WITH s AS (SELECT x::text AS x, pg_xact_status(x) AS st FROM unnest(%(xids)s::xid8[]) AS x),
n AS (
    SELECT pg_notify(%(channel)s, '') AS sent
    WHERE %(committed)s OR EXISTS (SELECT 1 FROM s WHERE st = 'committed')
)
SELECT coalesce(array_agg(x) FILTER (WHERE st IS DISTINCT FROM 'in progress'), '{{}}') AS done,
       EXISTS (SELECT 1 FROM n) AS notified
FROM s

-- name: begin
-- Has SQLAlchemy's asyncpg adapter send its BEGIN now: it begins a transaction only with its
-- own first statement (outbox/_connections.py).
SELECT 1

-- GRANTs of `outbox migrate grants` (outbox/_grants.py): templates the caller fills per
-- role, table and privilege list; the privileges are fixed texts of outbox/_grants.py.

-- name: grant_schema
GRANT USAGE ON SCHEMA {schema} TO {role}

-- name: grant_table
GRANT {privileges} ON TABLE {table} TO {role}

-- name: grant_columns
GRANT {privileges} ({columns}) ON TABLE {table} TO {role}

-- name: grant_sequence
GRANT {privileges} ON SEQUENCE {sequence} TO {role}

-- name: grant_function
-- EXECUTE on an operator function (outbox_0018: the console's requeue and purge), which runs
-- as the tables' owner; EXECUTE is revoked from PUBLIC when it is created.
GRANT EXECUTE ON FUNCTION {function} TO {role}

-- name: grant_role
-- Membership in a predefined role (pg_read_all_stats): needs a superuser, or a role holding
-- it WITH ADMIN OPTION.
GRANT {member_of} TO {role}

-- `outbox migrate` (outbox/_migrate.py): the standalone runner's own version table.

-- name: version_rows
-- How many rows the runner's version table holds (read after a downgrade: none at base).
SELECT count(*) FROM {version}

-- name: drop_version_table
-- After `downgrade base`: Alembic leaves its version table behind, empty; nothing of ours
-- should stay. Runs in the downgrade's transaction, only when version_rows said 0.
DROP TABLE {version}

-- name: version_schemas
-- The schemas holding the runner's version table, i.e. where `upgrade --schema` put the
-- tables (`migrate current` names them when it finds none where it looked). Read-only.
SELECT table_schema FROM information_schema.tables WHERE table_name = %(table)s ORDER BY 1
