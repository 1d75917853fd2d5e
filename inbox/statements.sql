-- The inbox's SQL, loaded and checked by outbox/_sql.py (which says what the headers and
-- placeholders mean). Every statement runs on the consumer's own connection, inside the
-- transaction that applies the message's effect, so the record and the effect commit or roll
-- back together. Read the comments before changing anything.

-- name: record
-- name: record_args (by position: consumer, id, topic, key, seq)
-- inbox_record: the FIRST statement of a consumer's transaction. record_args is the same
-- statement bound from a tuple (consumer, id, topic, key, seq), as record_on runs it for every
-- message; the named form serves the decision steps and asyncpg.
--
-- * A new (consumer, message_id) is inserted as 'processed' (one row): process it.
-- * A row that already exists is left alone (no row: a duplicate) unless it is 'processing',
--   the mark inbox_record_failure leaves after a failed attempt; then it becomes 'processed'.
-- * Concurrency: under READ COMMITTED a second transaction inserting the same key *waits*
--   for the first one to end. If the first committed, the second sees its row and returns
--   nothing (duplicate); if it rolled back, the second inserts. Because this is the first
--   statement, the unique index acts as a per-message lock held until commit, and no handler
--   ever runs twice concurrently for one message. Under REPEATABLE READ / SERIALIZABLE a
--   conflicting row committed after the snapshot was taken raises 40001 instead (translated
--   to ConcurrentDeliveryError: roll back and retry; the retry sees the duplicate).
-- * ON CONFLICT ON CONSTRAINT, not an inferred target: while REINDEX CONCURRENTLY runs, an
--   inferred target may raise a unique violation, which would abort the caller's
--   transaction. DO UPDATE ... WHERE locks the existing row even when WHERE is false.
-- * No RETURNING: the row count says it (1: process, 0: a duplicate); a returned column costs
--   every consumer transaction a little.
INSERT INTO {messages} AS i (consumer, message_id, topic, key, seq, processed_at, status)
VALUES (%(consumer)s, %(id)s, %(topic)s, %(key)s, %(seq)s, clock_timestamp(), 'processed')
ON CONFLICT ON CONSTRAINT {messages_pkey} DO UPDATE
    SET status = 'processed', processed_at = excluded.processed_at, attempts = i.attempts + 1
    WHERE i.status = 'processing'

-- name: note_duplicate
-- inbox_note_duplicate: count the delivery (an aid for operators; never used to decide). The
-- row is already locked by inbox_record, so this waits for nobody. inbox_record returned no
-- row, so the message is settled (processed, stale or dead): this delivery is a duplicate, and
-- only here is `duplicates` counted (`attempts` also counts failed handler attempts).
-- The status comes back: a 'parked' message (on_dead="hold") is kept in inbox_held and applied
-- from there, so its redelivery must neither apply it nor move the key on. A parked message's
-- attempts count only its handler's tries (max_attempts applies to them), not redeliveries.
UPDATE {messages}
SET attempts = attempts + (status <> 'parked')::int, duplicates = duplicates + 1
WHERE consumer = %(consumer)s AND message_id = %(id)s
RETURNING attempts, status

-- name: position_lock
-- inbox_position_lock: read the key's last applied seq *and lock it* until commit. The no-op
-- DO UPDATE locks the existing row (under READ COMMITTED it reads the latest committed version
-- after waiting), so two messages of one key are decided one after the other, never on the
-- same stale position. A new key starts at 0: its first message must be seq 1. held_seq is
-- the dead message holding the key (on_dead="hold"): from that seq on, messages are parked.
-- A position is per origin (the publishing database; '' for messages without one): several
-- databases number one (topic, key) each, from 1.
INSERT INTO {positions} AS p (consumer, origin, topic, key, last_seq)
VALUES (%(consumer)s, %(origin)s, %(topic)s, %(key)s, 0)
ON CONFLICT ON CONSTRAINT {positions_pkey} DO UPDATE SET last_seq = p.last_seq
RETURNING p.last_seq, p.held_seq

-- name: position_advance
-- inbox_position_advance: the message is next in line; it is applied in this transaction.
-- The key is no longer waiting for it (blocked_since cleared; see inbox_forget).
UPDATE {positions}
SET last_seq = %(seq)s, updated_at = clock_timestamp(), blocked_since = NULL
WHERE consumer = %(consumer)s AND origin = %(origin)s AND topic = %(topic)s AND key = %(key)s

-- name: mark_stale
-- inbox_mark_stale: an older message of the key than the last applied one: recorded, no effect.
UPDATE {messages} SET status = 'stale'
WHERE consumer = %(consumer)s AND message_id = %(id)s

-- name: forget
-- inbox_forget: a message ahead of a gap is not processed now. Its record must not survive, or
-- the redelivery would be taken for a duplicate; the caller's transaction holds the row's lock,
-- so a concurrent delivery waiting on it inserts afresh once this transaction ends.
-- The same round trip notes on the key's position (already locked by inbox_position_lock, so
-- this waits for nobody) that the key is waiting: the early seq, since when (kept from the
-- first refusal until the key moves on) and one more refused delivery, for `outbox inbox
-- blocked`. Only when the caller commits the OUT_OF_ORDER verdict, as the runners do.
WITH noted AS (
    UPDATE {positions}
    SET waiting_seq = %(seq)s, out_of_order = out_of_order + 1,
        blocked_since = coalesce(blocked_since, clock_timestamp())
    WHERE consumer = %(consumer)s AND origin = %(origin)s AND topic = %(topic)s AND key = %(key)s
)
DELETE FROM {messages} WHERE consumer = %(consumer)s AND message_id = %(id)s

-- name: record_failure
-- inbox_record_failure: in a transaction of its own, after the handler's transaction rolled
-- back. Counts the failed delivery and keeps the error; after max_attempts the message is
-- 'dead' (and acknowledged by the runner). Only a missing or 'processing' row is touched: if a
-- concurrent delivery has processed the message meanwhile, this changes nothing.
INSERT INTO {messages} AS i (consumer, message_id, topic, key, seq, status, last_error, attempts)
VALUES (%(consumer)s, %(id)s, %(topic)s, %(key)s, %(seq)s,
        CASE WHEN %(max_attempts)s <= 1 THEN 'dead' ELSE 'processing' END, %(error)s, 1)
ON CONFLICT ON CONSTRAINT {messages_pkey} DO UPDATE
    SET attempts = i.attempts + 1, last_error = excluded.last_error,
        status = CASE WHEN i.attempts + 1 >= %(max_attempts)s THEN 'dead' ELSE 'processing' END
    WHERE i.status = 'processing'
RETURNING i.attempts, i.status

-- name: position_skip
-- inbox_position_skip: a dead message of an ordered key moves the key on (its successors are
-- not blocked forever). Only if the position is exactly before it: a concurrent advance wins.
-- Always exactly one input row: an existing position at seq - 1 moves to seq; a key with no
-- position row yet (its first message died, and the failed transaction that created the row
-- rolled back) starts at seq when seq is 1, else at 0, which is what inbox_position_lock would
-- create. The VALUES row is needed: an input row that depends on seq (say SELECT ... WHERE
-- seq = 1) would leave the DO UPDATE unrun for seq > 1, and the key stuck behind its dead
-- message.
INSERT INTO {positions} AS p (consumer, origin, topic, key, last_seq)
VALUES (%(consumer)s, %(origin)s, %(topic)s, %(key)s, CASE WHEN %(seq)s = 1 THEN 1 ELSE 0 END)
ON CONFLICT ON CONSTRAINT {positions_pkey} DO UPDATE
    SET last_seq = %(seq)s, updated_at = clock_timestamp(), blocked_since = NULL
    WHERE p.last_seq = %(seq)s - 1

-- name: purge_batch
-- inbox_purge_batch: delete one batch of old finished records. SKIP LOCKED: a record locked by
-- a consumer's transaction is simply left for the next run; batches keep locks and WAL small.
-- 'processing' rows (failed, waiting for redelivery) are never purged.
WITH doomed AS (
    SELECT consumer, message_id FROM {messages}
    WHERE received_at < %(before)s AND status = ANY(%(statuses)b::text[])
      AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s::text)
    ORDER BY received_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {messages} AS m USING doomed AS d
WHERE m.consumer = d.consumer AND m.message_id = d.message_id

-- name: finished
-- inbox_processed_ids: which of the given ids this consumer has finished (testing helper).
SELECT message_id FROM {messages}
WHERE consumer = %(consumer)s AND message_id = ANY(%(ids)b::uuid[])
  AND status IN ('processed', 'stale', 'dead')

-- name: purge_cutoff
-- The retention's cut-off (inbox/_retention.py): records received before it are old. Taken
-- once, on the server's clock, so every batch of one purge deletes up to the same instant.
SELECT clock_timestamp() - %(older_than)s::interval AS before

-- name: kafka_offset_store
-- inbox_kafka_offset_store: in the transaction of the effect, so the offset and the effect
-- commit together (a crash can replay nothing that was applied). Never moves backwards: a
-- redelivered older message of the partition leaves the newer position.
INSERT INTO {kafka_offsets} AS o (consumer, topic, partition, next_offset)
VALUES (%(consumer)s, %(topic)s, %(partition)s, %(next_offset)s)
ON CONFLICT ON CONSTRAINT {kafka_offsets_pkey} DO UPDATE
    SET next_offset = excluded.next_offset, updated_at = clock_timestamp()
    WHERE o.next_offset < excluded.next_offset

-- name: kafka_offsets_read
-- inbox_kafka_offsets_read: where to resume each assigned partition.
SELECT topic, partition, next_offset FROM {kafka_offsets}
WHERE consumer = %(consumer)s AND topic = ANY(%(topics)b::text[])

-- name: blocked_keys
-- inbox_blocked_keys: keys that have waited at least %(min_age)s for a predecessor, oldest
-- wait first, with the dead message at the head of the gap if there is one (a consumer with
-- on-dead skip never stops there; one whose predecessor was never delivered does). A scan of
-- the positions table: an operator's query, not a hot path.
SELECT p.consumer, p.topic, p.key, p.last_seq, p.waiting_seq, p.blocked_since,
       p.out_of_order, clock_timestamp() - p.blocked_since AS waited,
       d.message_id AS dead_id, d.last_error AS dead_error, p.origin
FROM {positions} AS p
LEFT JOIN {messages} AS d
  ON d.consumer = p.consumer AND d.topic = p.topic AND d.key = p.key
 AND d.seq = p.last_seq + 1 AND d.status = 'dead'
WHERE p.blocked_since IS NOT NULL
  AND p.blocked_since <= clock_timestamp() - %(min_age)s::interval
  AND (%(consumer)s::text IS NULL OR p.consumer = %(consumer)s::text)
ORDER BY p.blocked_since, p.consumer, p.origin, p.topic, p.key
LIMIT %(limit)s

-- name: key_gauges
-- inbox_key_gauges: how many of this consumer's keys have waited at least %(min_age)s for a
-- predecessor, and how many are held behind a dead message: the consumer's gauges. Both read
-- only small partial sets (the partial index of waiting positions; held keys' dead messages).
SELECT (SELECT count(*) FROM {positions}
        WHERE consumer = %(consumer)s AND blocked_since IS NOT NULL
          AND blocked_since <= clock_timestamp() - %(min_age)s::interval) AS blocked,
       (SELECT count(*) FROM {held} WHERE consumer = %(consumer)s AND role = 'dead') AS held

-- Key-aware dead letters (on_dead="hold"): a held key's dead message and later messages are
-- kept whole in inbox_held; the consumer applies them, in seq order, once an operator has
-- retried or purged the dead message.

-- name: hold_key
-- inbox_hold_key: in the failure transaction, when an ordered message goes dead under hold:
-- the key is held at its seq (only if the position is exactly before it, as for the skip) and
-- the message is kept to be retried. A parked message that goes dead when released becomes the
-- key's dead message (role 'dead', any earlier decision cleared).
WITH held_key AS (
    INSERT INTO {positions} AS p (consumer, origin, topic, key, last_seq, held_seq)
    VALUES (%(consumer)s, %(origin)s, %(topic)s, %(key)s, 0, %(seq)s)
    ON CONFLICT ON CONSTRAINT {positions_pkey} DO UPDATE
        SET held_seq = %(seq)s, updated_at = clock_timestamp()
        WHERE p.last_seq = %(seq)s - 1
)
INSERT INTO {held} AS h (consumer, message_id, topic, key, seq, role, payload, content_type,
                         headers, traceparent, created_at, origin)
VALUES (%(consumer)s, %(id)s, %(topic)s, %(key)s, %(seq)s, 'dead', %(payload)s,
        %(content_type)s, %(headers)s, %(traceparent)s, %(created_at)s, %(origin)s)
ON CONFLICT ON CONSTRAINT {held_pkey} DO UPDATE
    SET role = 'dead', decision = NULL, held_at = clock_timestamp()

-- name: park
-- inbox_park: a message of a held key at or after the held seq, in its delivery transaction
-- (inbox_record inserted its row and the position is locked): kept whole and marked 'parked',
-- then acknowledged at the broker. A redelivery finds the 'parked' row: a duplicate. Parking
-- is no attempt of the handler: attempts start at 0 and count the releases that failed.
WITH kept AS (
    INSERT INTO {held} (consumer, message_id, topic, key, seq, role, payload, content_type,
                        headers, traceparent, created_at, origin)
    VALUES (%(consumer)s, %(id)s, %(topic)s, %(key)s, %(seq)s, 'parked', %(payload)s,
            %(content_type)s, %(headers)s, %(traceparent)s, %(created_at)s, %(origin)s)
    ON CONFLICT ON CONSTRAINT {held_pkey} DO NOTHING
)
UPDATE {messages} SET status = 'parked', processed_at = NULL, attempts = 0
WHERE consumer = %(consumer)s AND message_id = %(id)s

-- name: unsettle
-- inbox_unsettle: the first statement of a release transaction: a parked (or, for a retry, the
-- dead) record becomes 'processing' again, so the ordinary inbox_record that follows in the
-- same transaction takes it as a first delivery. Locks the row: a concurrent redelivery waits
-- and then finds the outcome. No row: someone else released it first.
UPDATE {messages} SET status = 'processing'
WHERE consumer = %(consumer)s AND message_id = %(id)s AND status = %(from_status)s
RETURNING attempts

-- name: unhold
-- inbox_unhold: a retried dead message frees its key in the transaction that applies it.
UPDATE {positions} SET held_seq = NULL, updated_at = clock_timestamp()
WHERE consumer = %(consumer)s AND origin = %(origin)s AND topic = %(topic)s AND key = %(key)s
  AND held_seq = %(seq)s

-- name: release_done
-- inbox_release_done: the held copy is gone once the message is applied (or found stale).
DELETE FROM {held} WHERE consumer = %(consumer)s AND message_id = %(id)s

-- name: repark
-- inbox_repark: a released message's handler failed but it is not dead yet: back to 'parked'
-- (the broker will not deliver it again; the next release tries it again).
UPDATE {messages} SET status = 'parked'
WHERE consumer = %(consumer)s AND message_id = %(id)s AND status = 'processing'

-- name: audit
-- inbox_audit: one audit row (who, what, why) in the transaction of the change it describes.
INSERT INTO {audit} (actor, action, consumer, message_id, topic, key, seq, last_error, reason)
VALUES (%(actor)s, %(action)s, %(consumer)s, %(id)s, %(topic)s, %(key)s, %(seq)s,
        %(error)s, %(reason)s)

-- name: retry_failed
-- inbox_retry_failed: a retried dead message failed again: it stays dead and holds its key;
-- the decision is cleared (an operator decides again), the attempt and the error are kept.
WITH undecided AS (
    UPDATE {held} SET decision = NULL
    WHERE consumer = %(consumer)s AND message_id = %(id)s
)
UPDATE {messages} SET attempts = attempts + 1, last_error = %(error)s
WHERE consumer = %(consumer)s AND message_id = %(id)s

-- name: purge_apply
-- inbox_purge_apply: a dead message the operator purged: the key moves on past it (as with the
-- skip) and is no longer held; its held copy is dropped; the record stays 'dead'. Guarded by
-- the hold itself, so applying one decision twice changes nothing the second time.
WITH moved AS (
    UPDATE {positions}
    SET last_seq = %(seq)s, held_seq = NULL, blocked_since = NULL,
        updated_at = clock_timestamp()
    WHERE consumer = %(consumer)s AND origin = %(origin)s AND topic = %(topic)s AND key = %(key)s
      AND held_seq = %(seq)s AND last_seq = %(seq)s - 1
    RETURNING 1
)
DELETE FROM {held} AS h
WHERE h.consumer = %(consumer)s AND h.message_id = %(id)s AND h.decision = 'purge'
  AND EXISTS (SELECT 1 FROM moved)
RETURNING h.message_id

-- name: held_decided
-- inbox_held_decided: dead messages an operator has decided on, for the consumer to apply.
-- Driven by the primary key's consumer prefix; inbox_held only has held keys' messages.
SELECT {held_columns}, h.decision
FROM {held} AS h
WHERE h.consumer = %(consumer)s AND h.role = 'dead' AND h.decision IS NOT NULL
ORDER BY h.held_at
LIMIT %(limit)s

-- name: parked_ready
-- inbox_parked_ready: parked messages whose key is no longer held and whose turn has come (or
-- passed: those are released as stale), in key and seq order.
SELECT {held_columns}
FROM {held} AS h
JOIN {positions} AS p ON p.consumer = h.consumer AND p.origin = h.origin
 AND p.topic = h.topic AND p.key = h.key
WHERE h.consumer = %(consumer)s AND h.role = 'parked' AND p.held_seq IS NULL
  AND h.seq <= p.last_seq + 1
ORDER BY h.origin, h.topic, h.key, h.seq
LIMIT %(limit)s

-- fragment: held_columns
-- What the consumer needs of a held message to apply it (inbox_held aliased h).
h.message_id, h.topic, h.key, h.seq, h.payload, h.content_type, h.headers,
       h.traceparent, h.created_at, h.origin

-- name: held_list
-- inbox_held_list: held keys for operators: the dead message holding each, its error, since
-- when, the pending decision and how many messages are parked behind it.
SELECT h.consumer, h.topic, h.key, h.seq, h.message_id, m.last_error, m.attempts, h.held_at,
       h.decision,
       (SELECT count(*) FROM {held} AS x
        WHERE x.consumer = h.consumer AND x.origin = h.origin AND x.topic = h.topic
          AND x.key = h.key AND x.role = 'parked') AS parked
FROM {held} AS h
LEFT JOIN {messages} AS m ON m.consumer = h.consumer AND m.message_id = h.message_id
WHERE h.role = 'dead'
  AND (%(consumer)s::text IS NULL OR h.consumer = %(consumer)s::text)
  AND (%(topic)s::text IS NULL OR h.topic = %(topic)s::text)
  AND (%(key)s::text IS NULL OR h.key = %(key)s::text)
  AND (cardinality(%(ids)b::uuid[]) = 0 OR h.message_id = ANY(%(ids)b::uuid[]))
ORDER BY h.held_at, h.consumer, h.topic, h.key
LIMIT %(limit)s

-- name: dead_decide
-- inbox_dead_decide: an operator's retry or purge of held dead messages, and its audit row, in
-- one statement. FOR UPDATE: two operators deciding at once audit each message once (the
-- second waits, then finds the decision already taken and skips it).
WITH chosen AS (
    SELECT h.consumer, h.message_id, h.topic, h.key, h.seq, m.last_error
    FROM {held} AS h
    LEFT JOIN {messages} AS m ON m.consumer = h.consumer AND m.message_id = h.message_id
    WHERE h.role = 'dead' AND h.decision IS DISTINCT FROM %(decision)s
      AND (%(consumer)s::text IS NULL OR h.consumer = %(consumer)s::text)
      AND (%(topic)s::text IS NULL OR h.topic = %(topic)s::text)
      AND (%(key)s::text IS NULL OR h.key = %(key)s::text)
      AND (cardinality(%(ids)b::uuid[]) = 0 OR h.message_id = ANY(%(ids)b::uuid[]))
    ORDER BY h.consumer, h.topic, h.key, h.seq
    LIMIT %(limit)s
    FOR UPDATE OF h
), decided AS (
    UPDATE {held} AS h SET decision = %(decision)s
    FROM chosen AS c
    WHERE h.consumer = c.consumer AND h.message_id = c.message_id
)
INSERT INTO {audit} (actor, action, consumer, message_id, topic, key, seq, last_error, reason)
SELECT %(actor)s, %(decision)s, consumer, message_id, topic, key, seq, last_error, %(reason)s
FROM chosen
RETURNING message_id

-- name: dead_audit_list
-- inbox_dead_audit_list: the newest audit rows first.
SELECT at, actor, action, consumer, message_id, topic, key, seq, reason, last_error
FROM {audit}
WHERE (%(consumer)s::text IS NULL OR consumer = %(consumer)s::text)
ORDER BY id DESC
LIMIT %(limit)s

-- name: consumer_activity
-- Per consumer (the console's overview): its last processed message, what it processed in the
-- last minute, and its dead and parked records (one scan of the inbox table; an operator's
-- page view, not a hot path).
SELECT consumer,
       max(processed_at) AS last_processed_at,
       extract(epoch FROM clock_timestamp() - max(processed_at))::float8 AS silent_s,
       count(*) FILTER (WHERE processed_at > clock_timestamp() - interval '1 minute')
           AS last_minute,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) FILTER (WHERE status = 'parked') AS parked
FROM {messages}
GROUP BY consumer ORDER BY consumer

-- Batches (runner.handle_batch): one statement per step for the whole batch. The same
-- decisions as the single-message statements above, taken for N messages at once. Rows are
-- inserted and locked in (message_id) and (topic, key) order, so two transactions whose
-- batches overlap take their row locks in one order and do not deadlock on them.

-- name: record_batch
-- inbox_record_batch: inbox_record for every message of the batch. The rows returned are the
-- messages to decide on (new, or 'processing' after a failed attempt); the others are settled
-- duplicates, each locked by the DO UPDATE ... WHERE even though nothing is updated.
INSERT INTO {messages} AS i (consumer, message_id, topic, key, seq, processed_at, status)
SELECT %(consumer)s, m.id, m.topic, m.key, m.seq, clock_timestamp(), 'processed'
FROM unnest(%(ids)b::uuid[], %(topics)b::text[], %(keys)b::text[], %(seqs)b::bigint[])
     AS m(id, topic, key, seq)
ORDER BY m.id
ON CONFLICT ON CONSTRAINT {messages_pkey} DO UPDATE
    SET status = 'processed', processed_at = excluded.processed_at, attempts = i.attempts + 1
    WHERE i.status = 'processing'
RETURNING i.message_id

-- name: note_duplicates
-- inbox_note_duplicates: inbox_note_duplicate for the batch's duplicates (rows locked above).
UPDATE {messages}
SET attempts = attempts + (status <> 'parked')::int, duplicates = duplicates + 1
WHERE consumer = %(consumer)s AND message_id = ANY(%(ids)b::uuid[])
RETURNING message_id, status

-- name: positions_lock
-- inbox_positions_lock: inbox_position_lock for every key of the batch, in (origin, topic,
-- key) order.
INSERT INTO {positions} AS p (consumer, origin, topic, key, last_seq)
SELECT %(consumer)s, k.origin, k.topic, k.key, 0
FROM unnest(%(origins)b::text[], %(topics)b::text[], %(keys)b::text[]) AS k(origin, topic, key)
ORDER BY k.origin, k.topic, k.key
ON CONFLICT ON CONSTRAINT {positions_pkey} DO UPDATE SET last_seq = p.last_seq
RETURNING p.origin, p.topic, p.key, p.last_seq, p.held_seq

-- name: positions_advance
-- inbox_positions_advance: inbox_position_advance for every key that moved (rows locked above;
-- the join is on the primary key).
UPDATE {positions} AS p
SET last_seq = v.seq, updated_at = clock_timestamp(), blocked_since = NULL
FROM unnest(%(origins)b::text[], %(topics)b::text[], %(keys)b::text[], %(seqs)b::bigint[])
     AS v(origin, topic, key, seq)
WHERE p.consumer = %(consumer)s AND p.origin = v.origin AND p.topic = v.topic AND p.key = v.key

-- name: mark_stale_batch
-- inbox_mark_stale_batch: inbox_mark_stale for the batch's stale messages.
UPDATE {messages} SET status = 'stale'
WHERE consumer = %(consumer)s AND message_id = ANY(%(ids)b::uuid[])

-- name: forget_batch
-- inbox_forget_batch: inbox_forget for the batch's messages ahead of a gap: their records go,
-- and each waiting key notes its lowest refused seq and how many were refused.
WITH noted AS (
    UPDATE {positions} AS p
    SET waiting_seq = v.seq, out_of_order = p.out_of_order + v.refused,
        blocked_since = coalesce(p.blocked_since, clock_timestamp())
    FROM unnest(%(origins)b::text[], %(topics)b::text[], %(keys)b::text[], %(seqs)b::bigint[],
                %(refused)b::int[]) AS v(origin, topic, key, seq, refused)
    WHERE p.consumer = %(consumer)s AND p.origin = v.origin AND p.topic = v.topic
      AND p.key = v.key
)
DELETE FROM {messages} WHERE consumer = %(consumer)s AND message_id = ANY(%(ids)b::uuid[])


-- name: partition_join
-- inbox_partition_join: a partitioned consumer's member joins, or renews its heartbeat. Its
-- row names how many partitions it consumes (every member of a consumer must say the same).
INSERT INTO {partition_members} AS m (consumer, member, partitions, expires_at)
VALUES (%(consumer)s, %(member)s, %(partitions)s,
        clock_timestamp() + make_interval(secs => %(lease)s))
ON CONFLICT ON CONSTRAINT {partition_members_pkey} DO UPDATE
    SET expires_at = excluded.expires_at, partitions = excluded.partitions

-- name: partition_slots
-- inbox_partition_slots: one lease row per partition, made once (by whichever member is first).
INSERT INTO {partition_leases} (consumer, partition)
SELECT %(consumer)s, p FROM generate_series(0, %(partitions)s - 1) AS p
ON CONFLICT ON CONSTRAINT {partition_leases_pkey} DO NOTHING

-- name: partition_members
-- inbox_partition_members: the live members (heartbeat not lapsed), in a stable order: the
-- partitions are balanced over them (each gets floor or ceil of partitions / members). Members
-- lapsed for a minute are forgotten first.
WITH gone AS (
    DELETE FROM {partition_members}
    WHERE consumer = %(consumer)s AND expires_at < clock_timestamp() - interval '1 minute'
)
SELECT member, partitions FROM {partition_members}
WHERE consumer = %(consumer)s AND expires_at > clock_timestamp()
ORDER BY joined_at, member

-- name: partition_renew
-- inbox_partition_renew: extend the leases this member still holds. A lease that lapsed is not
-- renewed (the member must acquire it again, with a new epoch): the partitions returned are the
-- ones still held.
UPDATE {partition_leases}
SET expires_at = clock_timestamp() + make_interval(secs => %(lease)s)
WHERE consumer = %(consumer)s AND owner = %(member)s
  AND partition = ANY(%(held)s::int4[]) AND expires_at > clock_timestamp()
RETURNING partition, epoch

-- name: partition_acquire
-- inbox_partition_acquire: take up to %(wanted)s partitions no member holds (released, or
-- their lease lapsed), lowest first; a new epoch each. FOR UPDATE SKIP LOCKED: a partition
-- whose previous owner is committing a message right now (its fence holds the row FOR KEY
-- SHARE) is left for the next round.
UPDATE {partition_leases} AS l
SET owner = %(member)s, epoch = l.epoch + 1,
    expires_at = clock_timestamp() + make_interval(secs => %(lease)s)
FROM (
    SELECT partition FROM {partition_leases}
    WHERE consumer = %(consumer)s AND partition < %(partitions)s
      AND (owner IS NULL OR expires_at <= clock_timestamp())
    ORDER BY owner IS NOT NULL, partition
    LIMIT %(wanted)s
    FOR UPDATE SKIP LOCKED
) AS free
WHERE l.consumer = %(consumer)s AND l.partition = free.partition
RETURNING l.partition, l.epoch

-- name: partition_release
-- inbox_partition_release: give a partition back (its broker consumer has stopped), so that
-- another member takes it at once instead of after the lease.
UPDATE {partition_leases} SET owner = NULL, expires_at = NULL
WHERE consumer = %(consumer)s AND partition = %(partition)s
  AND owner = %(member)s AND epoch = %(epoch)s

-- name: partition_leave
-- inbox_partition_leave: a member that stops leaves at once (the others rebalance now).
DELETE FROM {partition_members} WHERE consumer = %(consumer)s AND member = %(member)s

-- name: partition_fence
-- inbox_partition_fence: the LAST statement of every transaction that applies a message of a
-- partition: no row means this member no longer holds the partition's lease (taken over, or
-- lapsed while the process was frozen), and the transaction is rolled back. FOR KEY SHARE
-- until the commit: a takeover locks the row FOR UPDATE first (partition_acquire), which
-- conflicts, so it waits for (skips, in fact, until the next round) a commit in progress and
-- two members never commit messages of one partition at overlapping times; the owner's own
-- renewals (an UPDATE of expires_at only: FOR NO KEY UPDATE) do not conflict, so they never
-- wait behind its transactions.
SELECT epoch FROM {partition_leases}
WHERE consumer = %(consumer)s AND partition = %(partition)s
  AND owner = %(member)s AND epoch = %(epoch)s AND expires_at > clock_timestamp()
FOR KEY SHARE

-- name: partition_status
-- inbox_partition_status: who holds which partition (the operator's view).
SELECT l.consumer, l.partition, l.owner, l.epoch,
       greatest(l.expires_at - clock_timestamp(), interval '0') AS expires_in,
       l.owner IS NOT NULL AND l.expires_at > clock_timestamp() AS held
FROM {partition_leases} AS l
WHERE %(consumer)s::text IS NULL OR l.consumer = %(consumer)s
ORDER BY l.consumer, l.partition
