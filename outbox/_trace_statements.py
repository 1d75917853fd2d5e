"""The SQL of ``outbox trace`` (:mod:`outbox._journey`), rendered once per schema (the
convention of ``outbox/_sql.py``). Every statement only reads; the caller runs them in a
read-only transaction, so the console's role (or the relay's on the outbox database, a
consumer's on its inbox database) is enough.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox._sql import Names, qualified, registry
from outbox.schema import (
    INBOX_HELD,
    INBOX_MESSAGES,
    INBOX_POSITIONS,
    OUTBOX_MESSAGES,
    OUTBOX_RELAYS,
    RECONCILIATION_RUNS,
)

__all__ = ["TraceStatements", "trace_statements"]

# outbox_trace_by_id: one message's outbox row, by primary key. The payload is not read, only
# its size: a trace shows where a message is, not what it says.
_MESSAGE_BY_ID = """
SELECT id, topic, key, seq, status, attempts, last_error, created_at, available_at,
       published_at, lease_owner, lease_until, content_type, headers, octet_length(payload)
FROM {messages} WHERE id = %(id)s
"""

# outbox_trace_by_seq: the rows of one (topic, key, seq). Numbers are unique by construction,
# so there is at most one, but the caller still says "ambiguous" if a restore ever made two.
# No index covers (topic, key, seq) for published rows (the partial index of outbox_0005 leaves
# them out): the scan is bounded by the key's rows through that index or, for a published row,
# by the table; a trace is an operator's one-off question, never a hot path.
_MESSAGE_BY_SEQ = """
SELECT id, topic, key, seq, status, attempts, last_error, created_at, available_at,
       published_at, lease_owner, lease_until, content_type, headers, octet_length(payload)
FROM {messages} WHERE topic = %(topic)s AND key = %(key)s AND seq = %(seq)s
LIMIT 2
"""

# outbox_trace_neighbours: the key's previous and next message (seq - 1 and seq + 1) and their
# states; a neighbour deleted by retention (or never written) is simply missing.
_NEIGHBOURS = """
SELECT id, seq, status, attempts, last_error, published_at
FROM {messages}
WHERE topic = %(topic)s AND key = %(key)s AND seq IN (%(seq)s - 1, %(seq)s + 1)
ORDER BY seq
"""

# outbox_trace_key_blocker: the oldest unpublished message of the key before this one (what a
# pending message waits for: the relay publishes a key's messages in seq order). Through the
# partial index of unpublished rows (outbox_0005).
_KEY_BLOCKER = """
SELECT id, seq, status, attempts, last_error
FROM {messages}
WHERE topic = %(topic)s AND key = %(key)s AND seq < %(seq)s AND status <> 'published'
ORDER BY seq
LIMIT 1
"""

# outbox_trace_relays: the registered relays and where they publish (their broker, secrets
# masked when they registered), newest heartbeat first.
_RELAYS = """
SELECT relay_id, hostname, heartbeat_at, config->>'broker' AS broker,
       clock_timestamp() - heartbeat_at AS silent_for
FROM {relays}
ORDER BY heartbeat_at DESC
"""

# outbox_trace_last_run: the latest reconciliation run whose window holds the message's
# commit time (the run that judged it), else NULL; and the latest run of all.
_LAST_RUN = """
SELECT run_id, started_at, finished_at, window_start, window_end, outcome, discrepancies,
       summary->'files' AS files,
       (window_start <= %(created_at)s AND %(created_at)s < window_end) AS covers
FROM {runs}
ORDER BY (window_start <= %(created_at)s AND %(created_at)s < window_end) DESC,
         finished_at DESC
LIMIT 1
"""

# inbox_trace_records: every consumer's record of the message in this inbox database.
_INBOX_RECORDS = """
SELECT consumer, message_id, topic, key, seq, status, attempts, duplicates, last_error,
       received_at, processed_at
FROM {inbox} WHERE message_id = %(id)s
ORDER BY consumer
"""

# inbox_trace_records_by_seq: the same, by (topic, key, seq), for a message whose outbox row
# retention deleted. No index: a scan, bounded by the operator's patience (see _MESSAGE_BY_SEQ).
_INBOX_RECORDS_BY_SEQ = """
SELECT consumer, message_id, topic, key, seq, status, attempts, duplicates, last_error,
       received_at, processed_at
FROM {inbox} WHERE topic = %(topic)s AND key = %(key)s AND seq = %(seq)s
ORDER BY consumer
"""

# inbox_trace_consumers: the consumers of this database that take the topic: those with a
# record of it among their latest 10,000 (the caller adds those with a position on the key).
# The distinct consumers come from a skip scan of the primary key (consumer, message_id): one
# index probe per consumer, however many records each has; the look for the topic is bounded
# the same way, so a consumer of other topics only, with millions of records, costs 10,000.
_INBOX_CONSUMERS = """
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
"""

# inbox_trace_position: where each consumer stands on the key (the last seq applied, the seq
# that arrived too early and since when, the seq of a dead message holding it).
_INBOX_POSITION = """
SELECT consumer, last_seq, waiting_seq, blocked_since, held_seq, updated_at
FROM {positions} WHERE topic = %(topic)s AND key = %(key)s
ORDER BY consumer
"""

# inbox_trace_held: the message's row among the held ones (dead, or parked behind a dead one),
# and the dead message that holds its key.
_INBOX_HELD = """
SELECT h.consumer, h.role, h.held_at, h.decision, d.message_id AS dead_id, d.seq AS dead_seq
FROM {held} AS h
LEFT JOIN {held} AS d
  ON d.consumer = h.consumer AND d.topic = h.topic AND d.key = h.key AND d.role = 'dead'
WHERE h.message_id = %(id)s
ORDER BY h.consumer
"""


@dataclass(frozen=True)
class TraceStatements:
    message_by_id: bytes
    message_by_seq: bytes
    neighbours: bytes
    key_blocker: bytes
    relays: bytes
    last_run: bytes
    inbox_records: bytes
    inbox_records_by_seq: bytes
    inbox_consumers: bytes
    inbox_position: bytes
    inbox_held: bytes


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "relays": qualified(schema, OUTBOX_RELAYS),
        "runs": qualified(schema, RECONCILIATION_RUNS),
        "inbox": qualified(schema, INBOX_MESSAGES),
        "positions": qualified(schema, INBOX_POSITIONS),
        "held": qualified(schema, INBOX_HELD),
    }


#: The trace's statements for tables in ``schema`` (``None``: the search_path).
trace_statements = registry(
    TraceStatements,
    {
        "message_by_id": _MESSAGE_BY_ID,
        "message_by_seq": _MESSAGE_BY_SEQ,
        "neighbours": _NEIGHBOURS,
        "key_blocker": _KEY_BLOCKER,
        "relays": _RELAYS,
        "last_run": _LAST_RUN,
        "inbox_records": _INBOX_RECORDS,
        "inbox_records_by_seq": _INBOX_RECORDS_BY_SEQ,
        "inbox_consumers": _INBOX_CONSUMERS,
        "inbox_position": _INBOX_POSITION,
        "inbox_held": _INBOX_HELD,
    },
    _names,
)
