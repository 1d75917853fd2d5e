"""The Spark job's own SQL, from ``spark_ingest/statements.sql`` (the convention of
``outbox/_sql.py``). Read that file's comments before changing anything.

The driver's statements (psycopg) are rendered once per schema; the JDBC reads the executors
run are :data:`TEMPLATES`, completed per source and cut into partitions by the predicates of
``_sources``. The re-drive is the relay's business and lives with the outbox
(``outbox/statements.sql``, ``redrive_statements``).
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from outbox.kit import Names, load, qualified, registry, templates
from outbox.schema import OUTBOX_MESSAGES, RECONCILIATION_RUNS

__all__ = ["TEMPLATES", "SparkStatements", "SparkTemplates", "spark_statements"]


@dataclass(frozen=True)
class SparkStatements:
    horizon: bytes
    present_ids: bytes
    record_run: bytes
    last_unjudged: bytes
    latest_runs: bytes
    run_report: bytes
    #: the quoted, qualified name of outbox_reconciliation_runs (for error messages)
    runs_name: str


@dataclass(frozen=True)
class SparkTemplates:
    """The JDBC reads, completed per call (``.format(...).as_string(None)``)."""

    read_outbox: sql.SQL
    read_inbox: sql.SQL
    count_rows: sql.SQL
    time_range: sql.SQL
    outbox_range: sql.SQL
    ingest_outbox: sql.SQL
    ingest_inbox: sql.SQL
    row_version: sql.SQL


_SQL = load("spark_ingest", SparkStatements, SparkTemplates)


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "runs": qualified(schema, RECONCILIATION_RUNS),
        "oldest_xact_fn": qualified(schema, "outbox_oldest_xact_start"),
    }


#: The Spark job's statements for tables in ``schema`` (``None``: the search_path).
spark_statements = registry(
    SparkStatements,
    _SQL,
    _names,
    values=lambda schema: {
        "runs_name": qualified(schema, RECONCILIATION_RUNS).as_string(None),
    },
)


#: The JDBC reads' templates.
TEMPLATES = templates(SparkTemplates, _SQL)
