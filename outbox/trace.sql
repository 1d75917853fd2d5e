-- The SQL of outbox trace (outbox/_journey.py), loaded and checked by outbox/_sql.py. Every
-- statement is a read; the trace runs in read-only transactions.

-- name: message_by_id
-- One message's outbox row, by primary key. The payload is not read, only
-- its size: a trace shows where a message is, not what it says.
SELECT id, topic, key, seq, status, attempts, last_error, created_at, available_at,
       published_at, lease_owner, lease_until, content_type, headers,
       octet_length(payload) AS payload_bytes
FROM {messages} WHERE id = %(id)s

-- name: ledger_by_id
-- A message committed but not numbered yet: its ledger row (outbox_wal_pending), by primary
-- key. Its record says the topic and key; the relay gives it its seq.
SELECT id, record, written_at FROM {pending} WHERE id = %(id)s

-- name: message_by_seq
-- The rows of one (topic, key, seq). Numbers are unique by construction,
-- so there is at most one, but the caller still says "ambiguous" if a restore ever made two.
-- No index covers (topic, key, seq) for published rows (the partial index of outbox_0005 leaves
-- them out): the scan is bounded by the key's rows through that index or, for a published row,
-- by the table; a trace is an operator's one-off question, never a hot path.
SELECT id, topic, key, seq, status, attempts, last_error, created_at, available_at,
       published_at, lease_owner, lease_until, content_type, headers,
       octet_length(payload) AS payload_bytes
FROM {messages} WHERE topic = %(topic)s AND key = %(key)s AND seq = %(seq)s
LIMIT 2

-- name: neighbours
-- The key's previous and next message (seq - 1 and seq + 1) and their
-- states; a neighbour deleted by retention (or never written) is simply missing.
SELECT id, seq, status, attempts, last_error, published_at
FROM {messages}
WHERE topic = %(topic)s AND key = %(key)s AND seq IN (%(seq)s - 1, %(seq)s + 1)
ORDER BY seq

-- name: key_blocker
-- The oldest unpublished message of the key before this one (what a
-- pending message waits for: the relay publishes a key's messages in seq order). Through the
-- partial index of unpublished rows (outbox_0005).
SELECT id, seq, status, attempts, last_error
FROM {messages}
WHERE topic = %(topic)s AND key = %(key)s AND seq < %(seq)s AND status <> 'published'
ORDER BY seq
LIMIT 1

-- name: origin
-- The outbox database's origin (outbox_identity, outbox_0020): the relay puts it on every
-- message it publishes (unless its own `origin` setting overrides it). One row.
SELECT origin FROM {identity}

-- name: relays
-- The registered relays and where they publish (their broker, secrets
-- masked when they registered), newest heartbeat first.
SELECT relay_id, hostname, heartbeat_at, config->>'broker' AS broker,
       clock_timestamp() - heartbeat_at AS silent_for
FROM {relays}
ORDER BY heartbeat_at DESC

-- name: last_run
-- The latest reconciliation run whose window holds the message's
-- commit time (the run that judged it), else NULL; and the latest run of all.
SELECT run_id, started_at, finished_at, window_start, window_end, outcome, discrepancies,
       summary->'files' AS files,
       (window_start <= %(created_at)s AND %(created_at)s < window_end) AS covers
FROM {runs}
ORDER BY (window_start <= %(created_at)s AND %(created_at)s < window_end) DESC,
         finished_at DESC
LIMIT 1

-- name: inbox_records
-- Inbox_trace_records: every consumer's record of the message in this inbox database.
SELECT consumer, message_id, topic, key, seq, status, attempts, duplicates, last_error,
       received_at, processed_at
FROM {inbox} WHERE message_id = %(id)s
ORDER BY consumer

-- name: inbox_records_by_seq
-- Inbox_trace_records_by_seq: the same, by (topic, key, seq), for a message whose outbox row
-- retention deleted. No index: a scan, bounded by the operator's patience (see message_by_seq).
SELECT consumer, message_id, topic, key, seq, status, attempts, duplicates, last_error,
       received_at, processed_at
FROM {inbox} WHERE topic = %(topic)s AND key = %(key)s AND seq = %(seq)s
ORDER BY consumer

-- name: inbox_consumers
-- Inbox_trace_consumers: the consumers of this database that take the topic: those with a
-- record of it among their latest 10,000 (the caller adds those with a position on the key).
-- The distinct consumers come from a skip scan of the primary key (consumer, message_id): one
-- index probe per consumer, however many records each has; the look for the topic is bounded
-- the same way, so a consumer of other topics only, with millions of records, costs 10,000.
WITH RECURSIVE c(consumer) AS (
    (SELECT consumer FROM {inbox} ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT i.consumer FROM {inbox} AS i WHERE i.consumer > c.consumer
            ORDER BY i.consumer LIMIT 1)
    FROM c WHERE c.consumer IS NOT NULL
)
SELECT c.consumer FROM c
WHERE c.consumer IS NOT NULL
  AND EXISTS (SELECT 1 FROM (SELECT i.topic FROM {inbox} AS i WHERE i.consumer = c.consumer
                             ORDER BY i.message_id DESC LIMIT 10000) AS latest
              WHERE latest.topic = %(topic)s)
ORDER BY c.consumer

-- name: inbox_position
-- Inbox_trace_position: where each consumer stands on the key (the last seq applied, the seq
-- that arrived too early and since when, the seq of a dead message holding it).
-- A position is per origin (outbox_0020): the message's origin when the outbox database is
-- known ('' for a database without one), else every origin's, the one furthest on first.
SELECT DISTINCT ON (consumer) consumer, last_seq, waiting_seq, blocked_since, held_seq,
       updated_at, origin
FROM {positions} WHERE topic = %(topic)s AND key = %(key)s
  AND (%(origin)s::text IS NULL OR origin = %(origin)s::text)
ORDER BY consumer, last_seq DESC

-- name: inbox_held
-- Inbox_trace_held: the message's row among the held ones (dead, or parked behind a dead one),
-- and the dead message that holds its key.
SELECT h.consumer, h.role, h.held_at, h.decision, d.message_id AS dead_id, d.seq AS dead_seq
FROM {held} AS h
LEFT JOIN {held} AS d
  ON d.consumer = h.consumer AND d.topic = h.topic AND d.key = h.key AND d.role = 'dead'
WHERE h.message_id = %(id)s
ORDER BY h.consumer
