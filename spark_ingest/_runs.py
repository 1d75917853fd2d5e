"""The reconciliation runs recorded in an outbox database (the console's overview)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from psycopg.rows import class_row, dict_row

from outbox.kit import Database, connected
from spark_ingest._statements import spark_statements

__all__ = ["RunSummary", "latest_runs", "run_report"]


@dataclass(frozen=True)
class RunSummary:
    """One run's row: its window, what it judged, and where its report was written."""

    run_id: uuid.UUID
    started_at: dt.datetime
    finished_at: dt.datetime
    window_start: dt.datetime
    window_end: dt.datetime
    messages: int
    discrepancies: int
    #: 'ok', or 'failed' (a configured threshold was exceeded)
    outcome: str
    #: the path of the run's HTML report, as the run recorded it (None: none written)
    report: str | None


def latest_runs(url: Database, *, limit: int = 5, schema: str | None = None) -> list[RunSummary]:
    """The ``limit`` latest runs, newest first."""
    with connected(url) as conn, conn.cursor(row_factory=class_row(RunSummary)) as cur:
        return cur.execute(spark_statements(schema).latest_runs, {"limit": limit}).fetchall()


def run_report(url: Database, run_id: uuid.UUID, *, schema: str | None = None) -> str | None:
    """Where the report of run ``run_id`` was written, as its row says (None: nowhere, or no
    such run)."""
    with connected(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(spark_statements(schema).run_report, {"run_id": run_id}).fetchone()
    return None if row is None or row["report"] is None else str(row["report"])
