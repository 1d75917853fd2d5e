"""The console's own reads (everything it changes goes through the CLI's audited functions).

Operator queries, not hot paths: each runs once per page view or history sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from outbox._sql import Names, qualified, registry
from outbox.schema import INBOX_MESSAGES, OUTBOX_MESSAGES, RECONCILIATION_RUNS
from relay._statements import _DEAD_FILTER

__all__ = ["ConsoleStatements", "console_statements"]

# console_published_since: messages published per topic in the last %(seconds)s (the publish
# rate of the overview chart). Range on published_at under status = 'published': the partial
# index retention uses serves it, so a large published history is not scanned.
_PUBLISHED_SINCE = """
SELECT topic, count(*) FROM {messages}
WHERE status = 'published'
  AND published_at > clock_timestamp() - %(seconds)s * interval '1 second'
GROUP BY topic
"""

# console_consumers: per inbox consumer, its last processed message, what it processed in the
# last minute, and its dead and parked records (one scan of the inbox table; operator page).
_CONSUMERS = """
SELECT consumer,
       max(processed_at) AS last_processed_at,
       extract(epoch FROM clock_timestamp() - max(processed_at))::float8 AS silent_s,
       count(*) FILTER (WHERE processed_at > clock_timestamp() - interval '1 minute')
           AS last_minute,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) FILTER (WHERE status = 'parked') AS parked
FROM {inbox}
GROUP BY consumer ORDER BY consumer
"""

# console_runs: the latest reconciliation runs (a row a run: a small table).
_RUNS = """
SELECT run_id, started_at, finished_at, window_start, window_end, messages, discrepancies,
       outcome, summary->'files'->>'report' AS report
FROM {runs}
ORDER BY started_at DESC
LIMIT %(limit)s
"""

# console_dead_listing: the dead letters the listing shows, and the ids a filtered change acts
# on: the relay's dead-letter filter (`outbox dead list`) and the error text, case-folded, in
# the query, so the LIMIT counts matches. No payload or headers: those are read only for the
# one message a page shows. status = 'dead' lets the partial index on (topic, key, seq) of
# unpublished rows serve it in its order, so a long published history is not scanned.
_DEAD_LISTING = """
SELECT id, topic, key, seq, attempts, created_at, last_error
FROM {messages}
WHERE {filter}
  AND (%(error)s::text = '' OR strpos(lower(coalesce(last_error, '')), lower(%(error)s)) > 0)
ORDER BY topic, key, seq LIMIT %(limit)s
"""

# console_run_report: where one run's HTML report was written.
_RUN_REPORT = """
SELECT summary->'files'->>'report' AS report FROM {runs} WHERE run_id = %(run_id)s
"""


@dataclass(frozen=True)
class ConsoleStatements:
    published_since: bytes
    consumers: bytes
    runs: bytes
    run_report: bytes
    dead_listing: bytes


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "inbox": qualified(schema, INBOX_MESSAGES),
        "runs": qualified(schema, RECONCILIATION_RUNS),
        "filter": sql.SQL(_DEAD_FILTER),
    }


#: The console's statements for tables in ``schema`` (``None``: the search_path).
console_statements = registry(
    ConsoleStatements,
    {
        "published_since": _PUBLISHED_SINCE,
        "consumers": _CONSUMERS,
        "runs": _RUNS,
        "run_report": _RUN_REPORT,
        "dead_listing": _DEAD_LISTING,
    },
    _names,
)
