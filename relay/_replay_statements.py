"""The SQL of ``outbox replay`` (:mod:`relay._replay`), rendered once per schema (the
convention of ``outbox/_sql.py``). Read the comments before changing anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox._sql import Names, qualified, registry
from outbox.schema import OUTBOX_DEAD_AUDIT, OUTBOX_MESSAGES, OUTBOX_REPLAY_CURSORS

__all__ = ["ReplayStatements", "replay_statements"]

# outbox_replay_lock: one replay per (topic, consumer) at a time, for the session's life (two
# would both advance the cursor, each past what the other has not sent). A session-level
# advisory lock: released when the connection ends, however the process ends.
_LOCK = """
SELECT pg_try_advisory_lock(hashtext('outbox_replay:' || %(topic)s), hashtext(%(consumer)s))
"""

# outbox_replay_cursor: the (topic, consumer)'s cursor, if a replay to it ever started.
_CURSOR = """
SELECT destination, since, last_key, last_seq, replayed, actor, reason, started_at,
       updated_at, finished_at
FROM {cursors} WHERE topic = %(topic)s AND consumer = %(consumer)s
"""

# outbox_replay_start: a fresh cursor (the caller deleted an old one it was told to restart).
_START = """
INSERT INTO {cursors} (topic, consumer, destination, since, actor, reason, options)
VALUES (%(topic)s, %(consumer)s, %(destination)s, %(since)s, %(actor)s, %(reason)s,
        %(options)s)
"""

# outbox_replay_resume: a re-run continues; it is reopened and says who ran it this time.
_RESUME = """
UPDATE {cursors} SET finished_at = NULL, actor = %(actor)s,
                     reason = coalesce(%(reason)s, reason), updated_at = clock_timestamp()
WHERE topic = %(topic)s AND consumer = %(consumer)s
"""

_RESET = """
DELETE FROM {cursors} WHERE topic = %(topic)s AND consumer = %(consumer)s
"""

# outbox_replay_count: how many rows are left to send (for the progress line), in the same
# order and filter as _ROWS. One scan of the topic's retained rows, once per run.
_COUNT = """
SELECT count(*) FROM {messages}
WHERE topic = %(topic)s AND status = 'published'
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(key)s::text IS NULL OR (key, seq) > (%(key)s::text, %(seq)s::bigint))
"""

# outbox_replay_rows: the topic's retained history after the cursor, in (key, seq) order:
# every key's messages in their order, the keys one after the other. Only published rows:
# a pending row reaches every consumer live, a dead one reached none. No index serves this
# order for published rows (outbox_0005's partial index leaves them out, on purpose: the
# write path pays for every index), so the rows are read through a server-side cursor in one
# sort per chunk, the chunk's transaction short-lived (see relay/_replay.py), never one
# statement per batch.
_ROWS = """
SELECT id, topic, key, seq, payload, content_type, headers, traceparent, created_at
FROM {messages}
WHERE topic = %(topic)s AND status = 'published'
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(key)s::text IS NULL OR (key, seq) > (%(key)s::text, %(seq)s::bigint))
ORDER BY key, seq
"""

# outbox_replay_advance: the broker confirmed every message up to (key, seq): move the cursor
# and audit them, in one transaction (one row per message, like a re-drive's).
_ADVANCE = """
WITH moved AS (
    UPDATE {cursors}
       SET last_key = %(key)s, last_seq = %(seq)s, replayed = replayed + %(count)s,
           updated_at = clock_timestamp()
     WHERE topic = %(topic)s AND consumer = %(consumer)s
)
INSERT INTO {audit} (actor, action, message_id, topic, key, seq, reason)
SELECT %(actor)s, 'replay', u.id, %(topic)s, u.key, u.seq, %(reason)s
FROM unnest(%(ids)s::uuid[], %(keys)s::text[], %(seqs)s::bigint[]) AS u(id, key, seq)
"""

_FINISH = """
UPDATE {cursors} SET finished_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE topic = %(topic)s AND consumer = %(consumer)s
RETURNING replayed
"""


@dataclass(frozen=True)
class ReplayStatements:
    lock: bytes
    cursor: bytes
    start: bytes
    resume: bytes
    reset: bytes
    count: bytes
    rows: bytes
    advance: bytes
    finish: bytes


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "cursors": qualified(schema, OUTBOX_REPLAY_CURSORS),
        "audit": qualified(schema, OUTBOX_DEAD_AUDIT),
    }


#: The replay's statements for tables in ``schema`` (``None``: the search_path).
replay_statements = registry(
    ReplayStatements,
    {
        "lock": _LOCK,
        "cursor": _CURSOR,
        "start": _START,
        "resume": _RESUME,
        "reset": _RESET,
        "count": _COUNT,
        "rows": _ROWS,
        "advance": _ADVANCE,
        "finish": _FINISH,
    },
    _names,
)
