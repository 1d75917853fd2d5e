-- Every SQL statement of the relay, loaded and checked by outbox/_sql.py (which says what the
-- headers and placeholders mean). Read the comments first.
--
-- The polling relay never holds a transaction open across network I/O: each statement below
-- runs alone (in autocommit mode, or as the only statement of its transaction: one statement =
-- one transaction = one snapshot), and the broker is called between the claim and the mark.
-- The one exception is WAL capture mode (the capture_* statements): a decoded batch is
-- numbered, sent and recorded in one transaction (relay/_capture.py).
--
-- The ordering argument, in short (docs/explanation/relay.md has the long form):
--
-- * A row is *claimable* only if it is the **head of its key**: no earlier row of the same
--   (topic, key) is pending (leased or not), nor dead under the 'hold' policy.
-- * A claim **locks the head row** (FOR UPDATE SKIP LOCKED), leases it and, in the same
--   statement, takes the contiguous run of claimable rows that follow it. The head row's lock,
--   then its lease, is the key's: two relays can never claim rows of one key at the same time,
--   because both would need the same head row, and the second one skips it (locked) or drops
--   it (leased). The run's rows carry no lease of their own: none of them is a head while the
--   head is pending, so no claim can take one.
-- * Any change to a key's unpublished rows is made by the holder of the head's lease, and
--   every change either moves the head forward (published/dead), postpones it (retry), or
--   restores it (release). A relay whose snapshot is stale re-checks the head under the lock
--   (PostgreSQL re-evaluates the WHERE clause on the newest row version) and drops it.
-- * Leases carry a fresh random lease_token per claim; every mark locks the heads that still
--   carry it and changes only their keys' rows, so a relay whose lease lapsed and was
--   re-claimed by another relay marks nothing (fencing).

-- fragment: holds(t)
-- The 'hold' decision for the topic of the row aliased t, from the relay's per-topic
-- dead-letter policy.
(CASE WHEN {t}.topic = ANY(%(skip_topics)b::text[]) THEN false
      WHEN {t}.topic = ANY(%(hold_topics)b::text[]) THEN true
      ELSE %(hold_default)s::boolean END)

-- fragment: depth(t)
-- How many rows the key of the row aliased t could give a claim, read from the statement's
-- snapshot without locks: its first `per_key` + 1 unpublished rows if the first of them
-- looks claimable (pending, available, not leased; in a paused topic never), else 0. Only the
-- walk's length depends on it (where `keys` stops): what is claimed is decided under the
-- head's lock below, so an estimate that is wrong (a row published or leased meanwhile, a
-- dead row first under 'skip') makes a claim smaller or larger, never out of order. One
-- ordered read of at most `per_key` + 1 entries of the (topic, key, seq) index per key.
(SELECT CASE WHEN {t}.topic <> ALL(%(paused)b::text[]) AND (array_agg(r.open ORDER BY r.seq))[1]
             THEN count(*) ELSE 0 END AS n
 FROM (SELECT d.seq,
              d.status = 'pending' AND d.available_at <= clock_timestamp()
              AND (d.lease_until IS NULL OR d.lease_until < clock_timestamp()) AS open
       FROM {messages} AS d
       WHERE d.topic = {t}.topic AND d.key = {t}.key AND d.status <> 'published'
       ORDER BY d.topic, d.key, d.seq
       LIMIT %(per_key)s + 1) AS r)

-- name: tables_present
-- outbox_tables_present: the relay's startup probe. Catalog lookups only (no lock, no table
-- access): are the relay's tables there, and is the messages table migrated far enough to
-- carry leases (outbox_0002) and the write counter (outbox_0012)? Without them every claim (or
-- every reading of the commit watch) would fail with "relation does not
-- exist" and be retried forever.
SELECT to_regclass({messages_name}) IS NOT NULL
       AND to_regclass({relays_name}) IS NOT NULL
       AND to_regclass({audit_name}) IS NOT NULL AS tables,
       EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass({messages_name}) AND attname = 'lease_token'
                 AND NOT attisdropped)
       AND to_regclass({counter_name}) IS NOT NULL AS leases

-- name: origin
-- outbox_origin: the database's origin (outbox_identity, outbox_0020), read once at start: the
-- relay puts it on every message, so a consumer of several databases keeps one position per
-- (origin, topic, key). One row (its check constraint); NULL: no origin.
SELECT origin FROM {identity}

-- name: claim
-- outbox_claim_batch: claim up to %(limit)s rows, the heads of keys plus the runs behind them;
-- only the heads are written (leased). Depth first on a deep backlog (whole runs of a few keys,
-- see `keys`), breadth first when keys have a row or two.
--
-- Finding heads walks *keys*, never a key's backlog: a hot key with a million pending rows
-- costs one index probe, not a million (an ORDER BY available_at scan would re-read the whole
-- backlog behind a leased head on every claim).
--
-- Concurrency:
-- * `heads` is MATERIALIZED: only a WITH query is guaranteed to run once, so LIMIT bounds the
--   rows it locks (an IN (sub-select) can be re-executed and lock more, PostgreSQL bug #15715).
-- * `FOR UPDATE SKIP LOCKED` on the head row (`h`): a head another relay is claiming or marking
--   right now is skipped, never waited for. When the lock is granted on a row that changed after
--   our snapshot, PostgreSQL re-checks the row's own conditions (status, lease, available_at) on
--   the newest version, so a head that was meanwhile leased, published or postponed is dropped.
--   The lock sits in `h`'s sub-select, run once per key as LIMIT pulls rows: `limit` heads at
--   most are locked, whatever join method the planner picks.
-- * `first` is read from the statement's snapshot. It can only err towards "not a head": if the
--   row it found was published after the snapshot, the lock's re-check drops it (the next claim
--   takes the key's new head). It can never take a row as a head while an earlier row is
--   unpublished, because a key's rows become visible in seq order (seq is assigned under the
--   key's lock, in commit order).
-- * `run` is computed only for heads we hold locked. Nobody else can touch that key's pending
--   rows meanwhile (they would need the head), so the run read from our snapshot is current.
--   The heads' UPDATE re-checks status/lease, and the runs returned are those of the heads it
--   leased. A head our snapshot saw that another relay marked meanwhile is taken only if the
--   mark left it pending and available, which only a release does; a key's rows behind a
--   released row are released with it (relay/_claim.py: decide), and a release changes
--   nothing a run is chosen by (status, available_at, lease), so the snapshot's run holds.
-- * Heads are leased, not moved to another status: a crashed relay's keys become claimable
--   again when their head's lease_until passes, with no sweeper.
WITH RECURSIVE keys AS (
    -- A skip scan of the partial (topic, key, seq) index: one probe per key that has
    -- unpublished rows, starting after the key the previous claim ended at (rotation, so
    -- every key gets its turn). Lazy: it stops once `heads` has its LIMIT, or once the keys
    -- walked so far promise a full batch (`total`, see `depth` below).
    (SELECT m.topic, m.key, d.n AS depth, d.n AS total FROM {messages} AS m
     CROSS JOIN LATERAL {depth(m)} AS d
     WHERE m.status <> 'published' AND (m.topic, m.key) > (%(after_topic)s, %(after_key)s)
     ORDER BY m.topic, m.key, m.seq LIMIT 1)
    UNION ALL
    SELECT n.topic, n.key, d.n, k.total + d.n FROM keys AS k
    CROSS JOIN LATERAL (
        -- The next key; from a key of a paused topic (its destination refuses messages, see
        -- relay/_destinations.py), straight past that topic's last key in one probe, so a
        -- paused topic's keys are never walked one by one. The two branches' conditions on
        -- k are one-time filters: exactly one branch probes the index.
        (SELECT m.topic, m.key FROM {messages} AS m
         WHERE k.topic <> ALL(%(paused)b::text[])
           AND m.status <> 'published' AND (m.topic, m.key) > (k.topic, k.key)
         ORDER BY m.topic, m.key, m.seq LIMIT 1)
        UNION ALL
        (SELECT m.topic, m.key FROM {messages} AS m
         WHERE k.topic = ANY(%(paused)b::text[])
           AND m.status <> 'published' AND m.topic > k.topic
         ORDER BY m.topic, m.key, m.seq LIMIT 1)
    ) AS n
    CROSS JOIN LATERAL {depth(n)} AS d
    -- Depth first on a deep backlog: the walk ends once the keys behind it promise `limit`
    -- rows, so a claim takes whole runs of a few keys (their probes shared by many rows)
    -- instead of one row of each of `limit` keys. With a row or two per key it walks as many
    -- keys as before (breadth first).
    WHERE k.total < %(limit)s
),
heads AS MATERIALIZED (
    SELECT h.id, h.topic, h.key, h.seq, k.depth
    FROM keys AS k
    CROSS JOIN LATERAL (
        -- The key's first row that is pending, or dead under 'hold'. It is the head only if
        -- it is pending (h below): then no earlier row of the key is pending or held.
        -- One ordered index probe per key: never an anti join, which for a hot key made the
        -- planner hash or scan the whole table (it cannot know there are only `limit` heads).
        SELECT f.id FROM {messages} AS f
        WHERE f.topic = k.topic AND f.key = k.key AND f.status <> 'published'
          AND (f.status = 'pending' OR {holds(f)})
        ORDER BY f.topic, f.key, f.seq LIMIT 1
    ) AS first
    CROSS JOIN LATERAL (
        -- The head row itself, locked: a primary-key probe per key, in a sub-select that the
        -- planner cannot flatten (it has a locking clause) and must run per `first` row (it
        -- refers to first.id). As a plain join, a table without statistics (autovacuum off,
        -- or not yet analyzed) lets the planner scan the whole table for the head rows and,
        -- in a generic plan, drive the join from that scan with the key probes inside it:
        -- pending rows x keys probes per claim.
        -- `m.status || '' = 'pending'` is `m.status = 'pending'` in a form that matches no
        -- partial index. With statistics that say almost nothing is pending (a long published
        -- history), the planner would otherwise read every pending row through a partial
        -- index once per head.
        SELECT m.id, m.topic, m.key, m.seq FROM {messages} AS m
        WHERE m.id = first.id
          AND m.status || '' = 'pending'
          AND m.available_at <= clock_timestamp()
          AND (m.lease_until IS NULL OR m.lease_until < clock_timestamp())
        FOR UPDATE SKIP LOCKED
    ) AS h
    -- A paused topic's first key (reached by the walk) takes no head.
    WHERE k.topic <> ALL(%(paused)b::text[])
    -- The nested loop is pulled row by row, so the sub-select above runs (and locks) only
    -- until LIMIT has its rows.
    LIMIT %(limit)s
),
candidates AS (
    SELECT h.id AS head_id, x.id, x.status, x.seq,
           -- true while every row so far (head first) may go out in this batch
           bool_and(
               x.status = 'dead'
               OR (x.available_at <= clock_timestamp()
                   AND (x.lease_until IS NULL OR x.lease_until < clock_timestamp()))
           ) OVER (PARTITION BY h.id ORDER BY x.seq) AND NOT bool_or(
               x.status = 'dead' AND {holds(x)}
           ) OVER (PARTITION BY h.id ORDER BY x.seq) AS open
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT y.id, y.topic, y.status, y.seq, y.available_at, y.lease_until
        FROM {messages} AS y
        WHERE y.topic = h.topic AND y.key = h.key AND y.seq > h.seq
          AND y.status <> 'published'
        ORDER BY y.seq
        -- At most per_key rows: the key's depth as the walk saw it (which the walk stopped
        -- at about `limit` in all), or a fair share of what the batch has left after the heads,
        -- ceil((limit - #heads) / #heads), for a key the walk thought had none (its first row
        -- was leased or dead then). Runs are read only to be cut by `limited`, so this bounds
        -- the rows read here by about twice `limit` (not #heads x run length, read, sorted and
        -- dropped per claim). Fewer rows behind a head is always safe: a claim takes a prefix
        -- of each key's run, and the rest waits for the next claim.
        LIMIT least(%(per_key)s,
                    greatest(h.depth - 1,
                             (SELECT ceil((%(limit)s - count(*))::numeric
                                          / greatest(count(*), 1))::bigint FROM heads)))
    ) AS x
),
chosen AS (
    SELECT id, 0::bigint AS rank FROM heads
    UNION ALL
    SELECT id, row_number() OVER (PARTITION BY head_id ORDER BY seq) AS rank
    FROM candidates WHERE open AND status = 'pending'
),
limited AS (
    -- whole prefixes of each key only: all first rows, then all second rows, ...
    SELECT id FROM chosen ORDER BY rank LIMIT %(limit)s
),
leased AS (
    -- Only the heads are written: the lease of a key's head is the lease of the key. The run
    -- behind it is the holder's by the ordering argument (none of its rows is a head while
    -- the head is pending, so no other claim can take one), and is written once, by the mark.
    UPDATE {messages} AS m
    SET lease_owner = %(owner)s,
        lease_token = %(token)s,
        lease_until = clock_timestamp() + %(lease_seconds)s * interval '1 second',
        attempts = m.attempts + 1
    -- An array, not a join with `heads`: primary-key probes whatever the statistics say. As a
    -- join, a table without statistics may be read whole (a hash join) on every claim.
    WHERE m.id = ANY(ARRAY(SELECT id FROM heads))
      AND m.status || '' = 'pending'  -- = 'pending', kept a primary-key probe (see `heads`)
      AND (m.lease_until IS NULL OR m.lease_until < clock_timestamp())
    RETURNING m.id, m.topic, m.key, m.seq, m.payload, m.content_type, m.headers, m.traceparent,
              m.created_at, m.attempts
)
SELECT * FROM leased
UNION ALL
-- The runs of the leased heads, read from the statement's snapshot: nobody else changes a
-- key's pending rows while we hold its head (see the top of this file). Their attempts as this
-- claim's try of them counts it (the mark writes it: one row version per message).
SELECT r.id, r.topic, r.key, r.seq, r.payload, r.content_type, r.headers, r.traceparent,
       r.created_at, r.attempts + 1
FROM {messages} AS r
WHERE r.id = ANY(ARRAY(SELECT id FROM limited EXCEPT ALL SELECT id FROM heads))
  AND r.status || '' = 'pending'
  AND EXISTS (SELECT 1 FROM leased AS l WHERE l.topic = r.topic AND l.key = r.key)

-- name: mark
-- outbox_mark_batch: record the outcome of every row of one claim, in one statement.
--
-- Fencing: a claim leased the heads only, each with the claim's token. `fence` locks the rows
-- of the batch that still carry the token: the heads this claim still holds (FOR UPDATE
-- re-checks the newest row version, so a head another relay took over meanwhile, which then
-- carries that relay's token, is not among them, and a head being claimed right now is waited
-- for, then re-checked). Only rows of those keys are marked. If the lease lapsed and another
-- relay claimed the key, its head's token changed and the key is left alone; the caller
-- compares the returned ids with what it asked for. If the lease lapsed but nobody claimed the
-- key, the token still matches and the mark is right: nobody else published its rows. The
-- head's lock is held until the mark commits, so no claim takes the key in between.
-- Every action clears the head's lease. Attempts: the head's try was counted by the claim
-- ('release' gives it back: attempts - 1); a run row's try is counted here (not by 'release').
WITH fence AS MATERIALIZED (
    SELECT f.topic, f.key FROM {messages} AS f
    WHERE f.id = ANY(%(ids)b::uuid[]) AND f.lease_token = %(token)s AND f.status = 'pending'
    FOR UPDATE
)
UPDATE {messages} AS m
SET status = CASE o.action WHEN 'published' THEN 'published'
                           WHEN 'dead' THEN 'dead' ELSE 'pending' END,
    published_at = CASE WHEN o.action = 'published' THEN clock_timestamp()
                        ELSE m.published_at END,
    available_at = CASE WHEN o.action = 'retry'
                        THEN clock_timestamp() + o.delay * interval '1 second'
                        ELSE m.available_at END,
    attempts = CASE WHEN coalesce(m.lease_token = %(token)s, false)
                    THEN CASE WHEN o.action = 'release' THEN greatest(m.attempts - 1, 0)
                              ELSE m.attempts END
                    WHEN o.action = 'release' THEN m.attempts
                    ELSE m.attempts + 1 END,
    last_error = CASE WHEN o.action IN ('retry', 'dead') THEN o.error ELSE m.last_error END,
    lease_owner = NULL, lease_token = NULL, lease_until = NULL
FROM unnest(%(ids)b::uuid[], %(actions)b::text[], %(delays)s::float8[], %(errors)b::text[])
    AS o(id, action, delay, error)
-- The plan: `m.id = ANY(ids)` makes the rows primary-key probes joined (by hash) with the
-- outcomes. Without it the planner, taking the fencing condition on lease_token as matching
-- almost no row (statistics say it is nearly always NULL), scanned the table and joined the
-- outcomes inside a nested loop: ids x ids comparisons, about 200 ms for 500 rows.
WHERE m.id = o.id AND m.id = ANY(%(ids)b::uuid[]) AND m.status = 'pending'
  AND (m.topic, m.key) IN (SELECT topic, key FROM fence)
RETURNING m.id

-- name: mark_published
-- outbox_mark_published: the mark of a claim whose every row the broker acknowledged (a
-- drain's every batch): primary-key probes of the ids, no join with per-row outcomes. Fenced
-- and counted as `mark`.
WITH fence AS MATERIALIZED (
    SELECT f.topic, f.key FROM {messages} AS f
    WHERE f.id = ANY(%(ids)b::uuid[]) AND f.lease_token = %(token)s AND f.status = 'pending'
    FOR UPDATE
)
UPDATE {messages} AS m
SET status = 'published', published_at = clock_timestamp(),
    attempts = m.attempts + (NOT coalesce(m.lease_token = %(token)s, false))::int,
    lease_owner = NULL, lease_token = NULL, lease_until = NULL
WHERE m.id = ANY(%(ids)b::uuid[]) AND m.status = 'pending'
  AND (m.topic, m.key) IN (SELECT topic, key FROM fence)
RETURNING m.id

-- name: release_owner
-- outbox_release_owner: at shutdown, give back what this relay *process* still holds: the
-- heads of its own claims that never got their mark (cancelled or failed batches; the runs
-- behind them carry nothing to give back and counted no attempt yet). Matching the
-- claim tokens, not only lease_owner, matters when two processes run with one relay id (a
-- fixed --relay-id in a rolling deploy, or a takeover after this one's heartbeat lapsed): a
-- release by owner alone would give back the other process's in-flight rows, which a third
-- relay could then claim and publish while the other still did (two relays on one key).
UPDATE {messages}
SET lease_owner = NULL, lease_token = NULL, lease_until = NULL,
    attempts = greatest(attempts - 1, 0)
WHERE lease_owner = %(owner)s AND lease_token = ANY(%(tokens)b::uuid[]) AND status = 'pending'

-- name: register
-- outbox_relay_register: at start and every heartbeat. A relay id names one live process;
-- ``config->>'instance'`` (a random id per Relay object) tells this process's row from another's.
-- The row is taken over only when it is ours or its heartbeat is older than %(live_seconds)s (that
-- relay is gone, or stalled longer than its leases last). Otherwise no row is returned and the
-- relay refuses to start: two processes with one id would overwrite each other's row.
-- Concurrency: ON CONFLICT DO UPDATE locks the existing row and evaluates its WHERE on the newest
-- version, so of two processes starting at once with one id, the second sees the first's fresh
-- heartbeat and is refused.
INSERT INTO {relays} AS r (relay_id, hostname, pid, config)
VALUES (%(relay_id)s, %(hostname)s, %(pid)s, %(config)s)
ON CONFLICT (relay_id) DO UPDATE
SET heartbeat_at = clock_timestamp(),
    started_at = CASE WHEN r.config->>'instance' = excluded.config->>'instance'
                      THEN r.started_at ELSE clock_timestamp() END,
    hostname = excluded.hostname, pid = excluded.pid, config = excluded.config
WHERE r.config->>'instance' = excluded.config->>'instance'
   OR r.heartbeat_at < clock_timestamp() - %(live_seconds)s * interval '1 second'
RETURNING true

-- name: relay_holder
-- outbox_relay_holder: who holds a relay id that registration refused (for the error message).
SELECT hostname, pid, extract(epoch FROM clock_timestamp() - heartbeat_at)::float8
FROM {relays} WHERE relay_id = %(relay_id)s

-- name: heartbeat
-- outbox_relay_heartbeat: a primary-key update of this relay's row.
UPDATE {relays} SET heartbeat_at = clock_timestamp() WHERE relay_id = %(relay_id)s

-- name: unregister
-- outbox_relay_unregister: at shutdown. Only this process's row: another live process may have
-- taken the id over meanwhile.
DELETE FROM {relays} WHERE relay_id = %(relay_id)s AND config->>'instance' = %(instance)s

-- name: retention
-- outbox_retention_delete: one batch of old published rows. SKIP LOCKED and a small LIMIT keep
-- each transaction short; published rows are never heads, so deleting them cannot unblock or
-- reorder anything.
WITH old AS MATERIALIZED (
    SELECT id FROM {messages}
    WHERE status = 'published'
      AND published_at < clock_timestamp() - %(keep_seconds)s * interval '1 second'
    ORDER BY published_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {messages} AS m USING old WHERE m.id = old.id

-- name: status_topics
-- outbox_status_topics: backlog per topic (read-only, any snapshot is fine). `leased` counts
-- leased heads: the keys being relayed now (a claim leases a key's head only, see `claim`).
-- The messages committed but not numbered yet (the ledger, outbox_wal_pending) count as pending:
-- their topic is read from the record's bytes (outbox/_capture.py: the topic's 4-byte length at
-- offset 26, then the topic). A row a hostile producer made unreadable counts under '?' (the
-- relay skips it with an error), never fails the statement: `escape` shows any byte, and a valid
-- topic (ASCII letters, digits, . - _ /) reads as itself. A scan of the ledger, which holds a
-- few pages in steady state.
WITH ledger AS (
    SELECT CASE WHEN n.len BETWEEN 1 AND 255 AND octet_length(p.record) >= 30 + n.len
                THEN encode(substring(p.record FROM 31 FOR n.len::int4), 'escape')
                ELSE '?' END AS topic,
           p.written_at
    FROM {pending} AS p
    CROSS JOIN LATERAL (
        SELECT CASE WHEN octet_length(p.record) >= 30 AND get_byte(p.record, 0) = 1
                    THEN (get_byte(p.record, 26)::int8 << 24) | (get_byte(p.record, 27) << 16)
                         | (get_byte(p.record, 28) << 8) | get_byte(p.record, 29)
               END AS len
    ) AS n
),
backlog AS (
    SELECT m.topic, m.status, m.lease_until, m.created_at FROM {messages} AS m
    WHERE m.status <> 'published'
    UNION ALL
    SELECT l.topic, 'pending', NULL, l.written_at FROM ledger AS l
)
SELECT topic,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'pending' AND lease_until > clock_timestamp()) AS leased,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       extract(epoch FROM clock_timestamp()
               - min(created_at) FILTER (WHERE status = 'pending'))::float8 AS oldest_pending_s
FROM backlog
GROUP BY topic ORDER BY topic

-- name: status_relays
-- outbox_status_relays: the registered relays with what each holds right now: its leased heads,
-- one per key being relayed (read-only; an operator's query, not a hot path: its two
-- sub-selects run once per relay row). The broker's reachability is what the relay wrote on
-- its last heartbeat (JSON null, i.e. not tried yet, becomes SQL NULL).
SELECT r.relay_id, r.hostname, r.pid, r.started_at, r.heartbeat_at,
       extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8 AS silent_s,
       coalesce(r.config->'paused_destinations', '{{}}'::jsonb) AS paused_destinations,
       r.config->>'broker' AS broker,
       (r.config->>'broker_reachable')::boolean AS broker_reachable,
       r.config->>'broker_since' AS broker_since,
       r.config->>'broker_error' AS broker_error,
       (SELECT count(*) FROM {messages} AS m
        WHERE m.status = 'pending' AND m.lease_owner = r.relay_id
          AND m.lease_until > clock_timestamp()) AS leased,
       (SELECT array_agg(DISTINCT m.topic) FROM {messages} AS m
        WHERE m.status = 'pending' AND m.lease_owner = r.relay_id
          AND m.lease_until > clock_timestamp()) AS topics
FROM {relays} AS r ORDER BY r.started_at

-- name: last_reconciliation
-- outbox_last_reconciliation: the latest recorded run of the nightly reconciliation, for the
-- relay's gauges on every heartbeat (one row through outbox_reconciliation_runs_started_at_idx).
SELECT extract(epoch FROM finished_at)::float8 AS finished, outcome = 'ok' AS ok, discrepancies
FROM {runs} ORDER BY started_at DESC LIMIT 1

-- fragment: dead_filter
-- Which dead messages (outbox dead ...; the console's listing too): a fixed text with optional
-- parameters (NULL = no filter).
status = 'dead'
AND (%(topic)s::text IS NULL OR topic = %(topic)s)
AND (%(key)s::text IS NULL OR key = %(key)s)
AND (%(ids)b::uuid[] IS NULL OR id = ANY(%(ids)b::uuid[]))
AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)

-- name: dead_list
-- outbox_dead_list: the dead messages the filter matches, in key order (read-only).
SELECT id, topic, key, seq, attempts, created_at, last_error, payload, content_type, headers
FROM {messages} WHERE {dead_filter}
ORDER BY topic, key, seq LIMIT %(limit)s

-- name: dead_retry
-- outbox_dead_retry: back to pending, fresh attempts, available now, with an audit row in the
-- same statement (so the change and its audit commit together). FOR UPDATE: two operators
-- re-queueing at once audit each message once. The number taken from the write counter per
-- re-queued row wakes watching relays (relay/_watch.py) once the change commits.
WITH picked AS MATERIALIZED (
    SELECT id FROM {messages} WHERE {dead_filter} ORDER BY topic, key, seq
    LIMIT %(limit)s FOR UPDATE
),
changed AS (
    UPDATE {messages} AS m
    SET status = 'pending', attempts = 0, available_at = clock_timestamp(),
        lease_owner = NULL, lease_token = NULL, lease_until = NULL
    FROM picked WHERE m.id = picked.id AND m.status = 'dead'
    RETURNING m.id, m.topic, m.key, m.seq, m.last_error, nextval({counter_name}) AS watch
)
INSERT INTO {audit} (actor, action, message_id, topic, key, seq, last_error, reason)
SELECT %(actor)s, 'retry', id, topic, key, seq, last_error, %(reason)s FROM changed
RETURNING message_id

-- name: dead_purge
-- outbox_dead_purge: delete dead messages for good, with an audit row each, in one statement;
-- FOR UPDATE as for the retry. A key held behind a purged message moves on (its next row
-- becomes the head).
WITH picked AS MATERIALIZED (
    SELECT id FROM {messages} WHERE {dead_filter} ORDER BY topic, key, seq
    LIMIT %(limit)s FOR UPDATE
),
gone AS (
    DELETE FROM {messages} AS m USING picked
    WHERE m.id = picked.id AND m.status = 'dead'
    RETURNING m.id, m.topic, m.key, m.seq, m.last_error
)
INSERT INTO {audit} (actor, action, message_id, topic, key, seq, last_error, reason)
SELECT %(actor)s, 'purge', id, topic, key, seq, last_error, %(reason)s FROM gone
RETURNING message_id

-- name: dead_requeue_ids
-- The console's requeue (outbox/console/_data.py): the operator function of outbox_0018, which
-- runs as the tables' owner, changes rows still dead only and audits them in one statement
-- (the console role has no UPDATE on outbox_messages). The ids come from dead_list's filter.
SELECT {requeue_fn}(%(ids)s, %(actor)s, %(reason)s) AS id

-- name: dead_purge_ids
-- The console's purge: the operator function of outbox_0018 (no DELETE for the console role).
SELECT {purge_fn}(%(ids)s, %(actor)s, %(reason)s) AS id

-- name: dead_listing
-- The dead letters the console lists, and the ids a filtered change there acts on: the
-- dead-letter filter of `outbox dead list` and the error text, case-folded, in the query, so
-- the LIMIT counts matches. No payload or headers: those are read only for the one message a
-- page shows (dead_list). status = 'dead' lets the partial index on (topic, key, seq) of
-- unpublished rows serve it in its order, so a long published history is not scanned.
SELECT id, topic, key, seq, attempts, created_at, last_error
FROM {messages}
WHERE {dead_filter}
  AND (%(error)s::text = '' OR strpos(lower(coalesce(last_error, '')), lower(%(error)s)) > 0)
ORDER BY topic, key, seq LIMIT %(limit)s

-- name: published_since
-- Messages published per topic in the last given seconds (the console's publish-rate chart,
-- sampled while it runs). A range on published_at under status = 'published': the partial
-- index retention uses serves it, so a large published history is not scanned.
SELECT topic, count(*) AS published FROM {messages}
WHERE status = 'published'
  AND published_at > clock_timestamp() - %(seconds)s * interval '1 second'
GROUP BY topic

-- name: audit_list
-- outbox_dead_audit_list: the newest audit rows first: retries, purges and re-drives (the
-- re-drive of lost messages, `outbox redrive`, is in outbox/statements.sql: the Spark job that
-- runs it may not import the relay).
SELECT at, actor, action, message_id, topic, key, seq, reason FROM {audit}
ORDER BY id DESC LIMIT %(limit)s

-- WAL capture mode (relay/_capture.py, docs/explanation/capture.md): capture_durable, capture_known,
-- capture_bump, capture_waiting_keys, capture_record and capture_unsent run in ONE transaction
-- per decoded batch, which stays open while the batch is sent to the broker: the counter rows
-- capture_bump took stay locked until the batch is recorded and committed.

-- name: capture_mode
-- outbox_capture_mode: the database's capture mode and, in 'wal' mode, its slot and publication.
SELECT c.mode, c.slot, c.publication FROM {capture} AS c

-- name: capture_lock
-- outbox_capture_lock: one relay of the group streams the slot. A session-level advisory lock
-- (class 3084 = 0x0C0C, reserved for outbox-inbox; the slot's name hashed) on a connection the
-- capturing relay keeps open: it is released when that connection ends, however the relay died
-- (the server notices a killed process's closed socket at once), and a standby's next try takes
-- it. The slot itself refuses a second streamer too; the lock makes standbys wait politely. A
-- holder that is alive but frozen keeps its connection, so the lock alone would keep the slot
-- until it wakes: the lease below lets a standby end that connection.
SELECT pg_try_advisory_lock(3084, hashtext(%(slot)s)) AS locked

-- name: ledger_lock
-- outbox_ledger_lock: 'polling' mode's reader of the ledger (relay/_ledger.py) numbers a batch
-- only while it holds this transaction-scoped form of the capture lock (same class and key: the
-- slot's name, or the one `outbox capture enable` would make), so two relays never number at
-- once, and a relay streaming the slot (which holds the session-level form) excludes it too.
-- Released at commit or rollback: nothing to hand over, nothing to fence.
SELECT pg_try_advisory_xact_lock(3084, hashtext(%(slot)s)) AS locked

-- name: ledger_bound
-- outbox_ledger_bound: a numbering transaction that stops making progress (its relay frozen,
-- SIGSTOPped, cut off mid-batch) is ended by the server after this many milliseconds idle in the
-- transaction: it rolls back, its counter rows and the lock are free, and another relay numbers
-- the same rows (the lease of 'polling' mode, kept by PostgreSQL itself).
SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true)

-- name: capture_known
-- outbox_capture_known: ids of a decoded batch that already have a row: the rows of a batch
-- recorded before a crash that came before the slot's confirmation (decoded again now), and
-- idempotency keys published again. Their row stands; they are neither numbered nor sent again.
SELECT m.id FROM {messages} AS m WHERE m.id = ANY(%(ids)b::uuid[])

-- name: capture_bump
-- outbox_capture_bump: number a batch. One upsert per (topic, key), in (topic, key) order (no
-- deadlock with other batches), adding the batch's count; each key's row stays locked until
-- the batch's transaction ends. The batch's messages come in commit order ('wal' mode: as the
-- slot decodes them) or in the order they became visible and, within one read of the ledger, in
-- the order they were written ('polling' mode, relay/_ledger.py): numbering them in that order
-- gives gapless seqs, in commit order whenever a key's writers serialize. Rolled back (a crash,
-- a failed record), the counters are unchanged and the same transactions, decoded again from
-- the slot's confirmed position, get the same seqs.
INSERT INTO {sequences} AS s (topic, key, last_seq)
SELECT u.topic, u.key, u.n
FROM unnest(%(topics)b::text[], %(keys)b::text[], %(counts)b::int8[]) AS u(topic, key, n)
ORDER BY u.topic, u.key
ON CONFLICT (topic, key) DO UPDATE SET last_seq = s.last_seq + excluded.last_seq
RETURNING s.topic, s.key, s.last_seq

-- name: capture_waiting_keys
-- outbox_capture_waiting_keys: keys of the batch that already have a row the polling loop must
-- publish first (pending: delayed, failed, or redriven; or dead while its topic holds keys).
-- Their new messages are recorded pending behind it, so a key's order holds across the modes.
-- One probe of the partial (topic, key, seq) index per key.
SELECT u.topic, u.key
FROM unnest(%(topics)b::text[], %(keys)b::text[]) AS u(topic, key)
WHERE EXISTS (
    SELECT 1 FROM {messages} AS f
    WHERE f.topic = u.topic AND f.key = u.key AND f.status <> 'published'
      AND (f.status = 'pending' OR {holds(f)})
)

-- name: capture_record
-- outbox_capture_record: the batch's rows, numbered, in one statement, all 'pending': those
-- about to be sent carry this batch's lease (owner, a fresh token, until the lease ends), the
-- others (delayed, behind an earlier row of their key, or for an at-most-once topic) none,
-- for the polling loop. The batch's transaction commits (on disk) before anything is sent, so
-- a seq is bound to its message before any broker sees it: a crash, a lost slot or a restore
-- can never give that seq to another message. A leased row is not claimable (the claim takes
-- a head whose lease has lapsed only), so the polling loop leaves it to the capturing relay
-- until its lease ends; a relay that dies after the commit leaves its rows to the polling
-- loop, which publishes them with their seqs (the inbox absorbs what was already sent).
-- created_at is the writing transaction's commit time (or its row's time when taken from the
-- table).
INSERT INTO {messages}
    (id, topic, key, seq, headers, payload, content_type, traceparent, created_at,
     available_at, status, attempts, lease_owner, lease_token, lease_until)
SELECT u.id, u.topic, u.key, u.seq, u.headers::jsonb, u.payload, u.content_type, u.traceparent,
       u.created_at, coalesce(u.available_at, u.created_at), 'pending', 0,
       CASE WHEN u.leased THEN %(owner)s END, CASE WHEN u.leased THEN %(token)s::uuid END,
       CASE WHEN u.leased
            THEN clock_timestamp() + %(lease_seconds)s * interval '1 second' END
FROM unnest(%(ids)b::uuid[], %(topics)b::text[], %(keys)b::text[], %(seqs)b::int8[],
            %(headers)b::text[], %(payloads)b::bytea[], %(content_types)b::text[],
            %(traceparents)b::text[], %(created_ats)b::timestamptz[],
            %(available_ats)b::timestamptz[], %(leased)b::bool[])
    AS u(id, topic, key, seq, headers, payload, content_type, traceparent, created_at,
         available_at, leased)

-- name: capture_published
-- outbox_capture_published: after the sends, the rows the broker took are published. Fenced
-- by the batch's token: a row whose lease lapsed and that the polling loop claimed meanwhile
-- carries another token and is that relay's to mark. A primary-key probe per id
-- (`status || ''` keeps the partial index out, see `heads` in outbox_claim_batch).
UPDATE {messages} AS m
   SET status = 'published', published_at = clock_timestamp(),
       lease_owner = NULL, lease_token = NULL, lease_until = NULL
 WHERE m.id = ANY(%(ids)b::uuid[]) AND m.lease_token = %(token)s::uuid
   AND m.status || '' = 'pending'

-- name: capture_pending_delete
-- outbox_capture_pending_delete: in the batch's transaction, the pending rows of every message
-- it decoded (also those already known): from the commit on, outbox_messages holds them. A
-- primary-key probe per id.
DELETE FROM {pending} AS p WHERE p.id = ANY(%(ids)b::uuid[])

-- name: capture_recorded
-- outbox_capture_recorded: 'polling' mode recorded a batch for the claim loops: one number of
-- the write counter wakes every relay's commit watch (relay/_watch.py) once it commits. The
-- sequence's own oid (tableoid), so its name needs no quoting as a literal.
SELECT nextval(s.tableoid) FROM {counter} AS s

-- name: capture_pending_sweep
-- outbox_capture_pending_sweep: the ledger's committed rows written at least %(older)s seconds
-- ago, oldest first: their ids only, up to a round's worth (many batches). The ledger reader of
-- 'polling' mode and a 'wal' relay whose slot did not deliver them (missing, invalidated,
-- recreated, foreign, behind) then take them by id, a batch at a time (capture_pending_rows), in
-- this order. A key's rows come in the order they were written, which is their commit order
-- whenever the key's writers serialize (one writer, or a lock held to commit); rows decoded
-- from the slot come in exact commit order. The ledger has no index but its primary key (every
-- index costs every writer), so this is a scan and a sort of what it holds: once per round, not
-- once per batch, so a backlog of N rows costs N/round scans rather than N/batch (a relay back
-- after an outage of a million messages reads the table about twenty times, not two thousand).
-- In steady state the table holds a few pages.
SELECT p.id FROM {pending} AS p
 WHERE p.written_at <= clock_timestamp() - %(older)s * interval '1 second'
 ORDER BY p.written_at, p.id
 LIMIT %(limit)s

-- name: capture_pending_rows
-- outbox_capture_pending_rows: the ledger rows of a batch of ids from capture_pending_sweep
-- (those another relay numbered meanwhile are gone); the caller keeps the sweep's order. A
-- primary-key probe per id.
SELECT p.id, p.record, p.written_at FROM {pending} AS p WHERE p.id = ANY(%(ids)b::uuid[])

-- name: capture_pending_count
-- outbox_capture_pending_count: how many messages wait in outbox_wal_pending, and the age of
-- the oldest (`outbox status`, the relay's metrics). A scan of a table that holds only the
-- messages not recorded yet.
SELECT count(*) AS messages,
       extract(epoch FROM clock_timestamp() - min(p.written_at))::float8 AS oldest_seconds
FROM {pending} AS p

-- name: capture_durable
-- name: durable_commit
-- outbox_capture_durable: the capture transaction waits for its commit's flush (the relay's
-- sessions otherwise do not, see relay_session): the slot is confirmed right after the commit,
-- and a slot position saved to disk ahead of a commit lost in a server crash would skip the batch.
-- durable_commit: the same for an at-most-once mark (relay/_claim.py), made before the send,
-- which must survive a crash.
SET LOCAL synchronous_commit = on

-- name: capture_unsent
-- outbox_capture_unsent: sends of the batch the broker did not take, and their keys' later
-- messages of the batch, lose the batch's lease, settled as a claim's would be (relay/_claim.py
-- decide): a refusal counts its attempt and is retried after its backoff by the polling loop,
-- or is dead at once (permanent, or its last allowed attempt); the rest of its key and every
-- send of an outage count none. Fenced by the token as outbox_capture_published. A
-- primary-key probe per id; rare.
UPDATE {messages} AS m
   SET status = CASE WHEN u.dead THEN 'dead' ELSE 'pending' END,
       attempts = u.attempts, last_error = coalesce(u.error, m.last_error),
       available_at = CASE WHEN u.delay > 0
                           THEN clock_timestamp() + u.delay * interval '1 second'
                           ELSE m.available_at END,
       lease_owner = NULL, lease_token = NULL, lease_until = NULL
  FROM unnest(%(ids)b::uuid[], %(dead)s::bool[], %(attempts)b::int4[], %(errors)b::text[],
              %(delays)s::float8[]) AS u(id, dead, attempts, error, delay)
 WHERE m.id = u.id AND m.lease_token = %(token)s::uuid

-- name: capture_slot
-- outbox_capture_slot: the slot as `outbox status` shows it, and whether it can capture this
-- database's messages. One row, also when there is no such slot. A slot name is global to the
-- server and a logical slot decodes the database it was created in only, so `state` is:
-- 'ok'; 'missing' (no slot of that name); 'foreign' (another database's slot, or a physical
-- one: it decodes nothing of this database); 'plugin' (a slot of this database with another
-- output plugin than pgoutput); 'invalidated' (its WAL is gone: wal_status 'lost', or on
-- PostgreSQL 16+ invalidated for another reason; read through to_jsonb so that the query runs
-- on servers without those columns). The writers' emit makes the same check
-- (outbox/statements.sql): in 'wal' mode they write rows unless the state is 'ok'.
SELECT w.name AS slot, s.active,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint AS lag_bytes,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint AS retained_bytes,
       s.wal_status, s.database, s.plugin, s.confirmed_flush_lsn::text AS confirmed_lsn,
       CASE WHEN s.slot_name IS NULL THEN 'missing'
            WHEN s.database IS DISTINCT FROM current_database() THEN 'foreign'
            WHEN s.plugin IS DISTINCT FROM 'pgoutput' THEN 'plugin'
            WHEN s.wal_status = 'lost'
                 OR coalesce((to_jsonb(s) ->> 'conflicting')::boolean, false)
                 OR to_jsonb(s) ->> 'invalidation_reason' IS NOT NULL THEN 'invalidated'
            ELSE 'ok' END AS state,
       current_database() AS this_database
FROM (SELECT %(slot)s::text AS name) AS w
LEFT JOIN pg_catalog.pg_replication_slots AS s ON s.slot_name = w.name

-- The capture lease (outbox_capture_lease, one row per slot). The holder of the lock takes
-- the lease (a new epoch) on its lock session, so the row names that session; records every
-- batch on that session, so terminating it rolls back an open batch and frees the counter rows
-- it locked; and heartbeats on another connection, from the event loop that does the work (a
-- stuck loop stops both). A standby terminates the sessions of a holder whose heartbeat is
-- older than the holder's own lease (on the server's clock: no clock skew between relays),
-- then tries the lock again.

-- name: capture_lease_take
-- outbox_capture_lease_take: the lock's holder writes its lease: a new epoch, its lock session,
-- no walsender yet. Run only while holding the lock, so two relays never write it at once.
INSERT INTO {capture_lease} AS l
    (slot, holder, epoch, lock_pid, stream_pid, lease_seconds, acquired_at, heartbeat_at)
VALUES (%(slot)s, %(holder)s, 1, pg_backend_pid(), NULL, %(lease_seconds)s,
        clock_timestamp(), clock_timestamp())
ON CONFLICT (slot) DO UPDATE
   SET holder = excluded.holder, epoch = l.epoch + 1, lock_pid = excluded.lock_pid,
       stream_pid = NULL, lease_seconds = excluded.lease_seconds,
       acquired_at = excluded.acquired_at, heartbeat_at = excluded.heartbeat_at
RETURNING l.epoch

-- name: capture_lease_stream
-- outbox_capture_lease_stream: the walsender streams for the lease's epoch now. acquired_at
-- moves here: both sessions started before it, and a session a fencer terminates must have
-- (a pid reused by a later backend is never terminated).
UPDATE {capture_lease} AS l
   SET stream_pid = %(stream_pid)s, acquired_at = clock_timestamp(),
       heartbeat_at = clock_timestamp()
 WHERE l.slot = %(slot)s AND l.epoch = %(epoch)s
RETURNING l.epoch

-- name: capture_lease_beat
-- outbox_capture_lease_beat: the heartbeat; no row when a standby took the slot over (a later
-- epoch). A primary-key update, every quarter lease.
UPDATE {capture_lease} AS l SET heartbeat_at = clock_timestamp()
 WHERE l.slot = %(slot)s AND l.epoch = %(epoch)s
RETURNING l.epoch

-- name: capture_lease_check
-- outbox_capture_lease_check: in each batch's transaction, before anything is recorded: the
-- lease is still ours and this is its lock session. (A takeover needs the lock, so it comes
-- only after this session ended; the check makes the fencing explicit where progress is
-- recorded.) A primary-key probe per batch.
SELECT l.epoch FROM {capture_lease} AS l
 WHERE l.slot = %(slot)s AND l.epoch = %(epoch)s AND l.lock_pid = pg_backend_pid()

-- name: capture_lease_fence
-- outbox_capture_lease_fence: a standby that could not take the lock ends a lapsed holder's
-- sessions: the lock's (its open batch rolls back, the lock is released) and the walsender's
-- (the slot is free; the holder can confirm nothing more). The row is locked (FOR UPDATE), so
-- a heartbeat that lands first is seen (the lease is not lapsed then), and a heartbeat after
-- it finds its sessions gone. Only sessions that started before the lease was acquired are
-- terminated: a pid reused since is another backend. pg_terminate_backend waits (up to 5 s)
-- for the backend to exit. It needs the same role as the holder's sessions (or membership in
-- it, or pg_signal_backend); pg_stat_activity hides backend_start of other roles' sessions
-- without it, and then nothing is terminated. Rows: the holder, the pid, terminated or not.
WITH lapsed AS (
    SELECT l.holder, l.lock_pid, l.stream_pid, l.acquired_at FROM {capture_lease} AS l
     WHERE l.slot = %(slot)s
       AND l.heartbeat_at < clock_timestamp() - make_interval(secs => l.lease_seconds)
       FOR UPDATE
)
SELECT x.holder, p.pid,
       CASE WHEN a.pid IS NOT NULL THEN pg_terminate_backend(a.pid, 5000) ELSE false END
           AS terminated
FROM lapsed AS x
CROSS JOIN LATERAL unnest(ARRAY[x.lock_pid, x.stream_pid]) AS p(pid)
LEFT JOIN pg_stat_activity AS a ON a.pid = p.pid AND a.backend_start <= x.acquired_at
WHERE p.pid IS NOT NULL

-- name: capture_slot_free
-- outbox_capture_slot_free: the new holder ends a walsender still streaming the slot (a
-- fenced holder's that had not exited yet, or one the lease did not name): the slot takes one
-- streamer, and the lock says it is us. Waits up to 5 s for it to exit. Only a walsender: a
-- slot being created or dropped (by `outbox capture enable`, an operator, another tool) is
-- active on an ordinary backend, which is never terminated.
SELECT pg_terminate_backend(s.active_pid, 5000) FROM pg_replication_slots AS s
  JOIN pg_stat_activity AS a ON a.pid = s.active_pid AND a.backend_type = 'walsender'
 WHERE s.slot_name = %(slot)s AND s.active_pid IS NOT NULL AND s.active_pid <> pg_backend_pid()

-- name: capture_lease_resign
-- outbox_capture_lease_resign: the watchdog (relay/_capture_lease.py) ends this relay's own
-- lease when its capture loop makes no progress: it terminates the lease's sessions (the
-- lock's, which rolls back an open batch and releases the lock, and the walsender's, which
-- frees the slot), so a standby takes over at its next look, and the stuck loop fails out.
-- Run on another connection (the heartbeat's); only for this relay's epoch.
SELECT pg_terminate_backend(p.pid)
FROM {capture_lease} AS l
CROSS JOIN LATERAL unnest(ARRAY[l.lock_pid, l.stream_pid]) AS p(pid)
WHERE l.slot = %(slot)s AND l.epoch = %(epoch)s AND p.pid IS NOT NULL

-- name: watch_reading
-- outbox_watch_reading (relay/_watch.py), one statement, in this order: the snapshot (taken as
-- the statement starts), the write counter (a sequence: a one-page read that locks no table, read
-- by the scan), then the transaction counter (computed by the target list, after the scan):
-- age() of a fixed normal xid is the next xid to be assigned minus that xid (32 bits, signed),
-- read without taking an id; relay/_watch.py widens it with the snapshot's epoch.
SELECT s.last_value, s.is_called, pg_current_snapshot()::text AS snapshot,
       3 + age('3'::xid)::bigint AS counter32
FROM {counter} AS s

-- The relay's sessions and the LISTEN connection (relay/_claim.py, relay/_listener.py).

-- name: session
-- A relay pool connection: claims and at-least-once marks need no flush wait. A claim or mark
-- lost in a database crash is harmless: the lease was never recorded (any relay claims the row
-- again) or the row is still pending (it is published again, and the broker's dedup and the
-- consumer's inbox absorb the repeat).
SET synchronous_commit = off

-- name: listen
-- The producers' wake-ups (outbox/_wakeup.py, publish(..., wakeup=True)).
LISTEN {channel}

-- name: ping
-- Is the LISTEN connection still alive? (A half-open TCP connection takes no notification.)
SELECT 1

-- Operators' changes of the capture mode (relay/_admin.py: `outbox capture enable/disable`).

-- name: wal_level
SHOW wal_level

-- name: current_database
SELECT current_database() AS database

-- name: publication_exists
SELECT 1 FROM pg_publication WHERE pubname = %(publication)s

-- name: slot_create
-- The logical slot the relay streams; the caller checks what it got (capture_slot): a slot of
-- that name may have been created meanwhile, by another database too. The capturing relay
-- creates it too, when it finds it missing or invalidated (relay/_capture.py).
SELECT pg_create_logical_replication_slot(%(slot)s, 'pgoutput')

-- name: slot_drop
-- An invalidated slot of this database, dropped by the capturing relay before it creates a
-- fresh one (relay/_capture.py): it can decode nothing any more.
SELECT pg_drop_replication_slot(%(slot)s)

-- name: publication_has_table
-- Does the publication publish outbox_wal_pending (enabled by an older version: it was empty)?
SELECT 1 FROM pg_catalog.pg_publication_rel AS r
JOIN pg_catalog.pg_publication AS p ON p.oid = r.prpubid
WHERE p.pubname = %(publication)s AND r.prrelid = to_regclass({pending_name})

-- name: capture_enable
-- The switch to 'wal' mode. The slot is checked again here: one dropped since it was checked
-- is not recorded (no row updated). Writers check it on every emit anyway (wal_emit_checked,
-- outbox/statements.sql).
UPDATE {capture} SET mode = 'wal', slot = %(slot)s, publication = %(publication)s,
       changed_at = clock_timestamp()
WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots AS s
              WHERE s.slot_name = %(slot)s AND s.database = current_database())

-- name: capture_disable
-- Back to polling; the slot is kept (the relay still publishes what was emitted before).
UPDATE {capture} SET mode = 'polling', changed_at = clock_timestamp()

-- name: capture_table
-- This schema's outbox_capture table (NULL: not migrated).
SELECT to_regclass({capture_name})::oid AS oid

-- name: capture_tables
-- Every outbox_capture table of this database, one per schema that has an outbox.
SELECT c.oid, n.nspname FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relname = %(table)s AND c.relkind = 'r' ORDER BY n.nspname

-- name: capture_other
-- Another schema's capture row, if it is in 'wal' mode or still has a slot of this database
-- ({capture}: that schema's table, filled per call).
SELECT c.mode, c.slot FROM {capture} AS c
WHERE c.mode = 'wal' OR EXISTS (
    SELECT 1 FROM pg_catalog.pg_replication_slots AS s
    WHERE s.slot_name = c.slot AND s.database = current_database())

-- name: publication_create
-- The publication `outbox capture enable` creates: the inserts into outbox_wal_pending, which
-- carry the messages (pgoutput also sends the logical messages of older writers, whatever the
-- publication holds). {publication}, {pending}: filled per call.
CREATE PUBLICATION {publication} FOR TABLE {pending} WITH (publish = 'insert')

-- name: publication_add
-- A publication made by an older `outbox capture enable` (empty) publishes the table too.
ALTER PUBLICATION {publication} ADD TABLE {pending}

-- name: wake_relays
-- Wakes the relays' LISTEN connections once the transaction commits (dead-letter re-queues
-- and purges, relay/_admin.py); not at all after a rollback.
SELECT pg_notify({channel_name}, '')

-- name: start_replication
-- The replication command that streams the slot (relay/_replication.py), on a replication
-- connection: the inserts into outbox_wal_pending (the publication's table) and the logical
-- messages older writers emitted (messages 'true').
-- {slot} and {publication}: filled per call.
START_REPLICATION SLOT {slot} LOGICAL 0/0 (proto_version '1', publication_names {publication}, messages 'true')
