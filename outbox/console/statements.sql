-- The console's own reads, loaded and checked by outbox/_sql.py. Everything the console changes
-- goes through the CLI's audited functions, not through statements of its own. These are
-- operator queries, not hot paths: each runs once per page view or history sample.

-- name: published_since
-- Messages published per topic in the last given seconds (the publish rate of the overview
-- chart). A range on published_at under status = 'published': the partial index retention
-- uses serves it, so a large published history is not scanned.
SELECT topic, count(*) FROM {messages}
WHERE status = 'published'
  AND published_at > clock_timestamp() - %(seconds)s * interval '1 second'
GROUP BY topic

-- name: consumers
-- Per inbox consumer: its last processed message, what it processed in the last minute, and
-- its dead and parked records (one scan of the inbox table).
SELECT consumer,
       max(processed_at) AS last_processed_at,
       extract(epoch FROM clock_timestamp() - max(processed_at))::float8 AS silent_s,
       count(*) FILTER (WHERE processed_at > clock_timestamp() - interval '1 minute')
           AS last_minute,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) FILTER (WHERE status = 'parked') AS parked
FROM {inbox}
GROUP BY consumer ORDER BY consumer

-- name: runs
-- The latest reconciliation runs (a row a run: a small table).
SELECT run_id, started_at, finished_at, window_start, window_end, messages, discrepancies,
       outcome, summary->'files'->>'report' AS report
FROM {runs}
ORDER BY started_at DESC
LIMIT %(limit)s

-- name: dead_listing
-- The dead letters the listing shows, and the ids a filtered change acts on: the relay's
-- dead-letter filter (the one `outbox dead list` uses) and the error text,
-- case-folded, in the query, so the LIMIT counts matches. No payload or headers: those are
-- read only for the one message a page shows. status = 'dead' lets the partial index on
-- (topic, key, seq) of unpublished rows serve it in its order, so a long published history is
-- not scanned.
SELECT id, topic, key, seq, attempts, created_at, last_error
FROM {messages}
WHERE {filter}
  AND (%(error)s::text = '' OR strpos(lower(coalesce(last_error, '')), lower(%(error)s)) > 0)
ORDER BY topic, key, seq LIMIT %(limit)s

-- name: run_report
-- Where one run's HTML report was written.
SELECT summary->'files'->>'report' AS report FROM {runs} WHERE run_id = %(run_id)s
