"""The Spark job's own SQL on the driver (psycopg), rendered once per schema (the convention of
``outbox/_sql.py``). Read the comments before changing anything.

Not here: the JDBC reads the executors run (``_sources.read_outbox`` / ``read_inbox``,
``_ingest``), which are sub-queries built per partition from the same qualified names, and the
re-drive, which is the relay's business and lives with the outbox (``outbox/_statements.py``,
``redrive_statements``).
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox._sql import Names, qualified, registry
from outbox.schema import OUTBOX_MESSAGES, RECONCILIATION_RUNS

__all__ = ["SparkStatements", "spark_statements"]

# outbox_reconciliation_horizon: what a source looks like at job start, in ONE statement (one
# snapshot: several statements could disagree): the snapshot's xmin, the server clock, and the
# start of the oldest transaction still open (or prepared) in that database. Why that makes the
# run consistent: spark_ingest/_sources.py. %(table)s is the quoted name of the table the job
# reads there (to_regclass: does it exist?). Catalog and statistics views only; no table is read.
_HORIZON = """
SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin,
       clock_timestamp() AS now,
       least(
           clock_timestamp(),
           (SELECT min(a.xact_start) FROM pg_stat_activity AS a
             WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
               AND a.backend_type = 'client backend' AND a.xact_start IS NOT NULL),
           (SELECT min(p.prepared) FROM pg_prepared_xacts AS p
             WHERE p.database = current_database())
       ) AS safe_time,
       to_regclass(%(table)s) IS NOT NULL AS has_table
"""

# outbox_reconciliation_present_ids: which phantom candidates (inbox rows with no outbox row in
# the run's read) exist in the outbox after all: older than the read, or delivered to a consumer
# not expected for the topic. Primary-key probes; the caller sends at most 10,000 ids at once.
_PRESENT_IDS = """
SELECT id::text FROM {messages} WHERE id = ANY(%(ids)s::uuid[])
"""

# outbox_reconciliation_record_run: the run's row in outbox_reconciliation_runs, written after
# the run's files (if any) and before their directory gets its final name.
_RECORD_RUN = """
INSERT INTO {runs} (run_id, started_at, finished_at, window_start, window_end, horizon_xmin,
                    messages, discrepancies, outcome, summary)
VALUES (%(run_id)s, %(started_at)s, %(finished_at)s, %(window_start)s, %(window_end)s,
        %(horizon_xmin)s, %(messages)s, %(discrepancies)s, %(outcome)s, %(summary)s)
"""

# outbox_reconciliation_last_unjudged: what the latest run that ended by ``start`` left open
# (the oldest created_at it could not judge for good). The run history is small: a row a run.
_LAST_UNJUDGED = """
SELECT (summary->>'unjudged_from')::timestamptz FROM {runs}
WHERE window_end <= %(start)s
ORDER BY window_end DESC, finished_at DESC
LIMIT 1
"""


@dataclass(frozen=True)
class SparkStatements:
    horizon: bytes
    present_ids: bytes
    record_run: bytes
    last_unjudged: bytes
    #: the quoted, qualified name of outbox_reconciliation_runs (for error messages)
    runs_name: str


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "runs": qualified(schema, RECONCILIATION_RUNS),
    }


#: The Spark job's statements for tables in ``schema`` (``None``: the search_path).
spark_statements = registry(
    SparkStatements,
    {
        "horizon": _HORIZON,
        "present_ids": _PRESENT_IDS,
        "record_run": _RECORD_RUN,
        "last_unjudged": _LAST_UNJUDGED,
    },
    _names,
    values=lambda schema: {
        "runs_name": qualified(schema, RECONCILIATION_RUNS).as_string(None),
    },
)
