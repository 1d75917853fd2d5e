-- The SQL of outbox replay (relay/_replay.py), loaded and checked by outbox/_sql.py.
-- Read the comments before changing anything.

-- name: lock
-- One replay per (topic, consumer) at a time, for the session's life (two
-- would both advance the cursor, each past what the other has not sent). A session-level
-- advisory lock: released when the connection ends, however the process ends.
SELECT pg_try_advisory_lock(hashtext('outbox_replay:' || %(topic)s), hashtext(%(consumer)s))
       AS locked

-- name: cursor
-- The (topic, consumer)'s cursor, if a replay to it ever started.
SELECT destination, since, last_key, last_seq, replayed, actor, reason, started_at,
       updated_at, finished_at
FROM {cursors} WHERE topic = %(topic)s AND consumer = %(consumer)s

-- name: start
-- A fresh cursor (the caller deleted an old one it was told to restart).
INSERT INTO {cursors} (topic, consumer, destination, since, actor, reason, options)
VALUES (%(topic)s, %(consumer)s, %(destination)s, %(since)s, %(actor)s, %(reason)s,
        %(options)s)

-- name: resume
-- A re-run continues; it is reopened and says who ran it this time.
UPDATE {cursors} SET finished_at = NULL, actor = %(actor)s,
                     reason = coalesce(%(reason)s, reason), updated_at = clock_timestamp()
WHERE topic = %(topic)s AND consumer = %(consumer)s

-- name: reset
DELETE FROM {cursors} WHERE topic = %(topic)s AND consumer = %(consumer)s

-- name: count
-- How many rows are left to send (for the progress line), in the same
-- order and filter as rows. One scan of the topic's retained rows, once per run.
SELECT count(*) AS remaining FROM {messages}
WHERE topic = %(topic)s AND status = 'published'
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(key)s::text IS NULL OR (key, seq) > (%(key)s::text, %(seq)s::bigint))

-- name: rows
-- The topic's retained history after the cursor, in (key, seq) order:
-- every key's messages in their order, the keys one after the other. Only published rows:
-- a pending row reaches every consumer live, a dead one reached none. No index serves this
-- order for published rows (outbox_0005's partial index leaves them out, on purpose: the
-- write path pays for every index), so the rows are read through a server-side cursor in one
-- sort per chunk, the chunk's transaction short-lived (see relay/_replay.py), never one
-- statement per batch.
SELECT id, topic, key, seq, payload, content_type, headers, traceparent, created_at
FROM {messages}
WHERE topic = %(topic)s AND status = 'published'
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(key)s::text IS NULL OR (key, seq) > (%(key)s::text, %(seq)s::bigint))
ORDER BY key, seq

-- name: advance
-- The broker confirmed every message up to (key, seq): move the cursor
-- and audit them, in one transaction (one row per message, like a re-drive's).
WITH moved AS (
    UPDATE {cursors}
       SET last_key = %(key)s, last_seq = %(seq)s, replayed = replayed + %(count)s,
           updated_at = clock_timestamp()
     WHERE topic = %(topic)s AND consumer = %(consumer)s
)
INSERT INTO {audit} (actor, action, message_id, topic, key, seq, reason)
SELECT %(actor)s, 'replay', u.id, %(topic)s, u.key, u.seq, %(reason)s
FROM unnest(%(ids)s::uuid[], %(keys)s::text[], %(seqs)s::bigint[]) AS u(id, key, seq)

-- name: finish
UPDATE {cursors} SET finished_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE topic = %(topic)s AND consumer = %(consumer)s
RETURNING replayed
