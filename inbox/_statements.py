"""The inbox's SQL, rendered once per schema. Read the comments before changing anything.

Every statement runs on the consumer's own connection, inside the transaction that applies the
message's effect, so the record and the effect commit or roll back together (failure mode F30).
Identifiers are composed with ``psycopg.sql`` from validated names, never formatted into text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from psycopg import sql

from outbox.schema import (
    INBOX_KAFKA_OFFSETS,
    INBOX_MESSAGES,
    INBOX_POSITIONS,
    check_identifier,
)

__all__ = ["InboxStatements", "inbox_statements"]

# inbox_record: the FIRST statement of a consumer's transaction.
#
# * A new (consumer, message_id) is inserted as 'processed' and returns a row: process it.
# * A row that already exists returns nothing (a duplicate) unless it is 'processing', the mark
#   inbox_record_failure leaves after a failed attempt; then it becomes 'processed' here.
# * Concurrency (F32): under READ COMMITTED a second transaction inserting the same key *waits*
#   for the first one to end. If the first committed, the second sees its row and returns
#   nothing (duplicate); if it rolled back, the second inserts. Because this is the first
#   statement, the unique index acts as a per-message lock held until commit, and no handler
#   ever runs twice concurrently for one message. Under REPEATABLE READ / SERIALIZABLE a
#   conflicting row committed after the snapshot was taken raises 40001 instead (translated
#   to ConcurrentDeliveryError: roll back and retry; the retry sees the duplicate).
# * ON CONFLICT ON CONSTRAINT, not an inferred target: while REINDEX CONCURRENTLY runs, an
#   inferred target may raise a unique violation (F15), which would abort the caller's
#   transaction. DO UPDATE ... WHERE locks the existing row even when WHERE is false.
_RECORD = """
INSERT INTO {messages} AS i (consumer, message_id, topic, key, seq, processed_at, status)
VALUES (%(consumer)s, %(id)s, %(topic)s, %(key)s, %(seq)s, clock_timestamp(), 'processed')
ON CONFLICT ON CONSTRAINT {messages_pkey} DO UPDATE
    SET status = 'processed', processed_at = excluded.processed_at, attempts = i.attempts + 1
    WHERE i.status = 'processing'
RETURNING i.attempts
"""

# inbox_note_duplicate: count the delivery (an aid for operators; never used to decide). The
# row is already locked by inbox_record, so this waits for nobody. inbox_record returned no
# row, so the message is settled (processed, stale or dead): this delivery is a duplicate, and
# only here is `duplicates` counted (`attempts` also counts failed handler attempts).
_NOTE_DUPLICATE = """
UPDATE {messages} SET attempts = attempts + 1, duplicates = duplicates + 1
WHERE consumer = %(consumer)s AND message_id = %(id)s
RETURNING attempts
"""

# inbox_position_lock: read the key's last applied seq *and lock it* until commit. The no-op
# DO UPDATE locks the existing row (under READ COMMITTED it reads the latest committed version
# after waiting), so two messages of one key are decided one after the other, never on the
# same stale position. A new key starts at 0: its first message must be seq 1.
_POSITION_LOCK = """
INSERT INTO {positions} AS p (consumer, topic, key, last_seq)
VALUES (%(consumer)s, %(topic)s, %(key)s, 0)
ON CONFLICT ON CONSTRAINT {positions_pkey} DO UPDATE SET last_seq = p.last_seq
RETURNING p.last_seq
"""

# inbox_position_advance: the message is next in line; it is applied in this transaction.
_POSITION_ADVANCE = """
UPDATE {positions} SET last_seq = %(seq)s, updated_at = clock_timestamp()
WHERE consumer = %(consumer)s AND topic = %(topic)s AND key = %(key)s
"""

# inbox_mark_stale: an older message of the key than the last applied one: recorded, no effect.
_MARK_STALE = """
UPDATE {messages} SET status = 'stale'
WHERE consumer = %(consumer)s AND message_id = %(id)s
"""

# inbox_forget: a message ahead of a gap is not processed now. Its record must not survive, or
# the redelivery would be taken for a duplicate; the caller's transaction holds the row's lock,
# so a concurrent delivery waiting on it inserts afresh once this transaction ends.
_FORGET = """
DELETE FROM {messages} WHERE consumer = %(consumer)s AND message_id = %(id)s
"""

# inbox_record_failure: in a transaction of its own, after the handler's transaction rolled
# back. Counts the failed delivery and keeps the error; after max_attempts the message is
# 'dead' (and acknowledged by the runner). Only a missing or 'processing' row is touched: if a
# concurrent delivery has processed the message meanwhile, this changes nothing.
_RECORD_FAILURE = """
INSERT INTO {messages} AS i (consumer, message_id, topic, key, seq, status, last_error, attempts)
VALUES (%(consumer)s, %(id)s, %(topic)s, %(key)s, %(seq)s,
        CASE WHEN %(max_attempts)s <= 1 THEN 'dead' ELSE 'processing' END, %(error)s, 1)
ON CONFLICT ON CONSTRAINT {messages_pkey} DO UPDATE
    SET attempts = i.attempts + 1, last_error = excluded.last_error,
        status = CASE WHEN i.attempts + 1 >= %(max_attempts)s THEN 'dead' ELSE 'processing' END
    WHERE i.status = 'processing'
RETURNING i.attempts, i.status
"""

# inbox_position_skip: a dead message of an ordered key moves the key on (its successors are
# not blocked forever). Only if the position is exactly before it: a concurrent advance wins.
_POSITION_SKIP = """
INSERT INTO {positions} AS p (consumer, topic, key, last_seq)
SELECT %(consumer)s, %(topic)s, %(key)s, %(seq)s WHERE %(seq)s = 1
ON CONFLICT ON CONSTRAINT {positions_pkey} DO UPDATE
    SET last_seq = excluded.last_seq, updated_at = clock_timestamp()
    WHERE p.last_seq = excluded.last_seq - 1
"""

# inbox_purge_batch: delete one batch of old finished records. SKIP LOCKED: a record locked by
# a consumer's transaction is simply left for the next run; batches keep locks and WAL small.
# 'processing' rows (failed, waiting for redelivery) are never purged.
_PURGE_BATCH = """
WITH doomed AS (
    SELECT consumer, message_id FROM {messages}
    WHERE received_at < %(before)s AND status = ANY(%(statuses)s::text[])
      AND (%(consumer)s::text IS NULL OR consumer = %(consumer)s::text)
    ORDER BY received_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {messages} AS m USING doomed AS d
WHERE m.consumer = d.consumer AND m.message_id = d.message_id
"""

# inbox_processed_ids: which of the given ids this consumer has finished (testing helper).
_FINISHED = """
SELECT message_id FROM {messages}
WHERE consumer = %(consumer)s AND message_id = ANY(%(ids)s::uuid[])
  AND status IN ('processed', 'stale', 'dead')
"""

# inbox_kafka_offset_store: in the transaction of the effect, so the offset and the effect
# commit together (a crash can replay nothing that was applied). Never moves backwards: a
# redelivered older message of the partition leaves the newer position.
_KAFKA_OFFSET_STORE = """
INSERT INTO {kafka_offsets} AS o (consumer, topic, partition, next_offset)
VALUES (%(consumer)s, %(topic)s, %(partition)s, %(next_offset)s)
ON CONFLICT ON CONSTRAINT {kafka_offsets_pkey} DO UPDATE
    SET next_offset = excluded.next_offset, updated_at = clock_timestamp()
    WHERE o.next_offset < excluded.next_offset
"""

# inbox_kafka_offsets_read: where to resume each assigned partition.
_KAFKA_OFFSETS_READ = """
SELECT topic, partition, next_offset FROM {kafka_offsets}
WHERE consumer = %(consumer)s AND topic = ANY(%(topics)s::text[])
"""


@dataclass(frozen=True)
class InboxStatements:
    record: bytes
    note_duplicate: bytes
    position_lock: bytes
    position_advance: bytes
    mark_stale: bytes
    forget: bytes
    record_failure: bytes
    position_skip: bytes
    purge_batch: bytes
    finished: bytes
    kafka_offset_store: bytes
    kafka_offsets_read: bytes
    messages_name: str


def _qualified(schema: str | None, table: str) -> sql.Identifier:
    return sql.Identifier(schema, table) if schema else sql.Identifier(table)


@lru_cache(maxsize=32)
def inbox_statements(schema: str | None) -> InboxStatements:
    """The inbox statements for tables in ``schema`` (``None``: the search_path)."""
    if schema is not None:
        check_identifier(schema)
    names = {
        "messages": _qualified(schema, INBOX_MESSAGES),
        "positions": _qualified(schema, INBOX_POSITIONS),
        "messages_pkey": sql.Identifier(f"{INBOX_MESSAGES}_pkey"),
        "positions_pkey": sql.Identifier(f"{INBOX_POSITIONS}_pkey"),
        "kafka_offsets": _qualified(schema, INBOX_KAFKA_OFFSETS),
        "kafka_offsets_pkey": sql.Identifier(f"{INBOX_KAFKA_OFFSETS}_pkey"),
    }

    def render(text: str) -> bytes:
        return sql.SQL(text).format(**names).as_string(None).encode()

    return InboxStatements(
        record=render(_RECORD),
        note_duplicate=render(_NOTE_DUPLICATE),
        position_lock=render(_POSITION_LOCK),
        position_advance=render(_POSITION_ADVANCE),
        mark_stale=render(_MARK_STALE),
        forget=render(_FORGET),
        record_failure=render(_RECORD_FAILURE),
        position_skip=render(_POSITION_SKIP),
        purge_batch=render(_PURGE_BATCH),
        finished=render(_FINISHED),
        kafka_offset_store=render(_KAFKA_OFFSET_STORE),
        kafka_offsets_read=render(_KAFKA_OFFSETS_READ),
        messages_name=names["messages"].as_string(None),
    )
