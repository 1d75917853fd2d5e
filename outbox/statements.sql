-- The producer's SQL (outbox.publish), the re-drive's (`outbox redrive`), the doorbell's
-- (outbox/_wakeup.py) and the GRANTs of `outbox migrate grants`. Loaded and checked by
-- outbox/_sql.py, which says what the headers and placeholders mean. Statements run on the
-- caller's own connection, inside the caller's transaction, unless their comment says
-- otherwise. Read the comments before changing anything.

-- name: insert
-- outbox_messages_insert: write a batch of messages and give each its per-(topic, key) sequence
-- number, in one statement.
--
-- Why the sequence numbers are gapless and in commit order:
-- * `bumped` upserts one outbox_key_sequences row per (topic, key) and adds the number of new
--   messages. The upsert takes that row's lock and holds it until the caller's transaction
--   ends, so a second writer of the same key waits here; under READ COMMITTED its upsert then
--   re-reads the committed last_seq (or, if the first writer rolled back, the old one). Writers
--   of other keys lock other rows and never wait. Keys are locked in (topic, key) order so two
--   batches that share keys cannot deadlock.
-- * `fresh` drops ids that already exist (an idempotency key published again) *before* a
--   number is taken, so a no-op republish leaves no hole. Two transactions racing on the same
--   new idempotency key are serialized beforehand by outbox_idempotency_lock: the loser's
--   statement starts after the winner has ended, so its snapshot sees the winner's row.
-- * ON CONFLICT (id) DO NOTHING is the last line of defence; the caller checks that every
--   fresh row was inserted.
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

-- name: insert_one
-- name: insert_one_idempotent (guard = idempotency_guard)
-- outbox_messages_insert_one: the common case, one message, as lean as it can be. Same
-- locking argument as for `insert`: the upsert's row lock on (topic, key) is held to commit
-- and orders same-key writers. With an idempotency key (insert_one_idempotent) the counter is
-- only bumped if the id does not exist yet (the idempotency lock taken before this statement
-- makes that check race-free), and nothing is inserted if it does.
--
-- Both inserts also take a number from outbox_write_counter once their rows are written (the
-- transaction has its id by then): that is what a polling relay's commit watch sees
-- (relay/_watch.py). nextval never waits and is never rolled back; in RETURNING it runs per
-- row, after the row's insert.
--
-- Both inserts also return the capture mode (outbox_capture, one row in shared buffers): that
-- is how a writer learns, at no extra round trip, that the database switched to 'wal' mode.
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

-- fragment: idempotency_guard
-- What makes insert_one idempotent: no row in `bumped` when the id exists, so the counter
-- stays and nothing is inserted.
WHERE NOT EXISTS (SELECT 1 FROM {messages} AS e WHERE e.id = %(id)s)

-- name: idempotency_lock
-- outbox_idempotency_lock: only for batches with idempotency keys. A transaction-scoped
-- advisory lock per derived id (two-key form, class 3084 = 0x0C0C reserved for outbox-inbox),
-- taken in sorted order so two batches cannot deadlock. Released at commit or rollback.
--
-- Lock order: the batch's counter rows first (all its keys, in (topic, key) order, as the
-- insert takes them), then the advisory locks. Taken the other way round, a writer that
-- holds the advisory lock would wait for a key's counter row while the transaction holding
-- that row (it published on the key earlier) waits for the same advisory lock: a deadlock that
-- the caller cannot avoid by ordering its own work. The no-op upsert (last_seq unchanged; 0
-- for a new key, which the insert then bumps) waits for a concurrent writer of the key the way
-- the insert would, and holds the row until the transaction ends. The count makes the
-- upsert run to completion before the first advisory lock is requested.
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

-- name: wal_emit
-- outbox_wal_emit ('wal' capture mode, docs/explanation/capture.md): the messages as rows of
-- outbox_wal_pending, their id and their record (outbox/_capture.py), in input order. No
-- counter row, no lock, no index but the primary key: the relay decodes the inserts from its
-- slot after commit, in commit order, gives them their seqs, records them in outbox_messages
-- and deletes these rows in the same transaction. The row is what makes the message durable:
-- a slot that is dropped, invalidated or lost in a failover or restore costs latency only,
-- since the relay publishes what this table holds before it streams a fresh slot. Inserts
-- nothing (zero rows) unless the database is in 'wal' mode: the writer then writes the
-- messages to outbox_messages instead, in the same transaction. An id already pending (the
-- same idempotency key, not yet recorded by the relay) stays one row; an id the relay
-- already recorded is dropped by the relay (outbox_capture_known). Rolled back, nothing is.
INSERT INTO {pending} (id, record)
SELECT u.id, u.record
FROM {capture} AS c,
     unnest(%(ids)b::uuid[], %(records)b::bytea[]) WITH ORDINALITY AS u(id, record, ord)
WHERE c.mode = 'wal'
ORDER BY u.ord
ON CONFLICT DO NOTHING

-- name: wal_emit_one
-- outbox_wal_emit_one: the same for a batch of one (every publish()): no array to build, send
-- and unnest. The mode check is the same one-row scan.
INSERT INTO {pending} (id, record)
SELECT %(id)s, %(record)b::bytea FROM {capture} AS c WHERE c.mode = 'wal'
ON CONFLICT DO NOTHING

-- name: capture_mode
-- outbox_capture_mode: the capture mode, asked only when a pending insert inserted fewer rows
-- than it had messages: in 'wal' mode the others were already pending (an idempotency key
-- published again before the relay recorded it: a no-op, as in polling mode); otherwise the
-- database is not in 'wal' mode (any more) and the messages go to outbox_messages.
SELECT c.mode FROM {capture} AS c

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
