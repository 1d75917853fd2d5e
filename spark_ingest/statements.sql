-- The Spark job's SQL, loaded and checked by outbox/_sql.py (which says what the headers and
-- placeholders mean). Read the comments before changing anything.
--
-- The driver's own statements (psycopg) are rendered once per schema. The reads the executors
-- run over JDBC are templates the job completes per source (the qualified table, the version
-- bounds) and cuts into partitions with WHERE predicates of its own (spark_ingest/_sources.py).
-- The re-drive is the relay's business and lives with the outbox (outbox/statements.sql).

-- name: horizon
-- outbox_reconciliation_horizon: what a source looks like at job start, in ONE statement (one
-- snapshot: several statements could disagree): the snapshot's xmin, the server clock, and the
-- start of the oldest transaction still open (or prepared) in that database. Why that makes the
-- run consistent: spark_ingest/_sources.py. %(table)s is the quoted name of the table the job
-- reads there (to_regclass: does it exist?). Catalog and statistics views only; no table is read.
-- The oldest open transaction's start comes from outbox_oldest_xact_start() (outbox_0018), which
-- sees every role's sessions as its owner and returns that time only: the reconcile role needs
-- no pg_read_all_stats, which would show it every session's query text.
SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin,
       clock_timestamp() AS now,
       least(
           clock_timestamp(),
           {oldest_xact_fn}(),
           (SELECT min(p.prepared) FROM pg_prepared_xacts AS p
             WHERE p.database = current_database())
       ) AS safe_time,
       to_regclass(%(table)s) IS NOT NULL AS has_table

-- name: present_ids
-- outbox_reconciliation_present_ids: which phantom candidates (inbox rows with no outbox row in
-- the run's read) exist in the outbox after all: older than the read, or delivered to a consumer
-- not expected for the topic. Primary-key probes; the caller sends at most 10,000 ids at once.
SELECT id::text AS id FROM {messages} WHERE id = ANY(%(ids)s::uuid[])

-- name: record_run
-- outbox_reconciliation_record_run: the run's row in outbox_reconciliation_runs, written after
-- the run's files (if any) and before their directory gets its final name.
INSERT INTO {runs} (run_id, started_at, finished_at, window_start, window_end, horizon_xmin,
                    messages, discrepancies, outcome, summary)
VALUES (%(run_id)s, %(started_at)s, %(finished_at)s, %(window_start)s, %(window_end)s,
        %(horizon_xmin)s, %(messages)s, %(discrepancies)s, %(outcome)s, %(summary)s)

-- name: last_unjudged
-- outbox_reconciliation_last_unjudged: what the latest run that ended by ``start`` left open
-- (the oldest created_at it could not judge for good). The run history is small: a row a run.
SELECT (summary->>'unjudged_from')::timestamptz AS unjudged_from FROM {runs}
WHERE window_end <= %(start)s
ORDER BY window_end DESC, finished_at DESC
LIMIT 1

-- name: latest_runs
-- The latest reconciliation runs, newest first (the console's overview; a row a run: a small
-- table).
SELECT run_id, started_at, finished_at, window_start, window_end, messages, discrepancies,
       outcome, summary->'files'->>'report' AS report
FROM {runs}
ORDER BY started_at DESC
LIMIT %(limit)s

-- name: run_report
-- Where one run's HTML report was written (the console's link to it).
SELECT summary->'files'->>'report' AS report FROM {runs} WHERE run_id = %(run_id)s

-- The JDBC reads (spark_ingest/_sources.py, spark_ingest/_ingest.py). {table}: the source's
-- qualified table, filled per read; the executors add each partition's predicate.

-- name: read_outbox
-- The nightly reconciliation's read of the outbox (tx_id kept: the job applies the horizon).
SELECT id::text AS id, topic, key, seq, status, created_at, available_at, published_at,
       tx_id::text::bigint AS tx_id
FROM {table}

-- name: read_inbox
SELECT consumer, message_id::text AS message_id, topic, key, seq, received_at, processed_at,
       attempts, duplicates, status
FROM {table}

-- name: time_range
-- One JDBC partition's rows: {column} in [{lo}, {hi}), the bounds the job's own UTC timestamps
-- (UUIDs cannot be a Spark partition column, so reads split on time). One line: the
-- incremental ingest cuts it at its AND for the open first and last partitions.
{column} >= {lo}::timestamptz AND {column} < {hi}::timestamptz

-- name: outbox_range
-- A partition of the outbox read: {range} (a time_range of created_at), and what is implied
-- anyway, in terms the partial indexes answer (there is no index on created_at): a published
-- row was published after it was created ({floor}: the range's start less a margin for a
-- clock stepped back), and the rest are the few rows not yet published (or dead).
{range} AND (status <> 'published' OR published_at IS NULL OR published_at >= {floor}::timestamptz)

-- name: count_rows
-- min(rows matching the predicate, limit): one driver query, stopped at the limit, that sizes
-- the reads. created_at has no index, so the planner's estimate (EXPLAIN) cannot see a day
-- inserted since the last ANALYZE: the rows are counted, up to the most the partitions can use.
SELECT count(*) AS n FROM (SELECT 1 FROM {table} WHERE {predicate} LIMIT {limit}) AS s

-- name: ingest_outbox
-- The incremental ingest's read of the outbox: every row whose version is in [lo, hi).
SELECT id::text AS id, topic, key, seq, headers::text AS headers, payload, content_type,
       traceparent, created_at, available_at, status, attempts, last_error, published_at,
       tx_id::text::bigint AS tx_id, {version} AS version
FROM {table} WHERE {version} >= {lo} AND {version} < {hi}

-- name: ingest_inbox
SELECT consumer, message_id::text AS message_id, topic, key, seq, received_at,
       processed_at, attempts, status, last_error, {version} AS version
FROM {table} WHERE {version} >= {lo} AND {version} < {hi}

-- name: row_version
-- A row's version: the 64-bit id of the transaction that last wrote it. xmin is 32 bits;
-- widened by its signed distance to {horizon} (a 64-bit xid8, {h32} its low 32 bits), it is
-- exact for any row written less than 2^31 transactions before or after the horizon.
({horizon} - (mod(mod({h32} - xmin::text::bigint + 2147483648, 4294967296) + 4294967296,
                  4294967296) - 2147483648))
