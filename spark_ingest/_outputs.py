"""Outputs of a run: verdict against thresholds, files, the run row, the text summary."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from outbox.kit import one_line
from spark_ingest._config import DISCREPANCY_CLASSES, Source
from spark_ingest._errors import SourceError
from spark_ingest._report import format_duration
from spark_ingest._sources import connect
from spark_ingest._statements import spark_statements

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "REPORT_ROWS",
    "carried_start",
    "format_summary",
    "judge",
    "output_files",
    "record_run",
    "report_rows",
    "write_outputs",
]

#: How many messages of each discrepancy class, and how many keys, the HTML report lists.
REPORT_ROWS = 20


def judge(counts: Mapping[str, int], thresholds: Mapping[str, int]) -> dict[str, Any]:
    """``outcome`` 'failed' when any class exceeds its threshold (default 0 for every
    discrepancy class; ``total`` bounds their sum; ``lagging`` is unbounded unless set)."""
    limits = {c: 0 for c in DISCREPANCY_CLASSES} | dict(thresholds)
    total = sum(counts.get(c, 0) for c in DISCREPANCY_CLASSES)
    observed = dict(counts) | {"total": total}
    exceeded = {
        name: {"count": observed.get(name, 0), "limit": limit}
        for name, limit in sorted(limits.items())
        if observed.get(name, 0) > limit
    }
    return {
        "discrepancies": total,
        "thresholds": limits,
        "exceeded": exceeded,
        "outcome": "failed" if exceeded else "ok",
    }


def output_files(target: Path) -> dict[str, str]:
    """Where a run's files end up (``target`` is ``output_dir/<run_id>``)."""
    return {
        "details": str(target / "details"),
        "redrive": str(target / "redrive.txt"),
        "report": str(target / "report.html"),
        "summary": str(target / "summary.json"),
    }


def write_outputs(
    directory: Path, summary: dict[str, Any], lost_ids: list[str], *, top: int = REPORT_ROWS
) -> None:
    """Next to ``directory/details`` (Parquet, written by the Spark pass): summary.json,
    redrive.txt and report.html. ``directory`` is the run's partial directory, renamed to
    its final name (``summary["files"]``) only once everything is written and recorded.

    The report lists the ``top`` oldest messages of each discrepancy class and the ``top``
    worst keys, read from ``directory/details`` with the active Spark session
    (``report_rows``, bounded); without either, it lists none. ``summary`` is not changed:
    summary.json keeps its raw figures (milliseconds) and nothing else."""
    from spark_ingest._report import render_html

    worst = _worst(directory / "details", summary, top)
    redrive = {"href": "redrive.txt", "messages": len(lost_ids)}
    (directory / "redrive.txt").write_text("".join(f"{i}\n" for i in lost_ids))
    report = render_html(summary, worst=worst, redrive=redrive)
    (directory / "report.html").write_text(report)
    (directory / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def _worst(details: Path, summary: Mapping[str, Any], top: int) -> dict[str, Any] | None:
    if not details.is_dir():
        return None
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        return None
    as_of = dt.datetime.fromisoformat(summary["as_of"])
    return report_rows(spark.read.parquet(str(details)), as_of, top)


def report_rows(details: DataFrame, as_of: dt.datetime, top: int = REPORT_ROWS) -> dict[str, Any]:
    """What the report lists, from the details (``_outcomes.details``), collected bounded:
    at most ``top`` rows per discrepancy class and ``top`` keys reach the driver.

    ``messages``: class -> its ``top`` oldest rows (one per message and consumer: ``id, topic,
    key, seq, consumer, age_ms``), oldest first. ``keys``: the ``top`` (topic, key) with the
    most distinct problem messages (ties: the oldest first), with ``messages``, ``kinds`` and
    ``age_ms`` of the oldest. An age is ``as_of`` minus ``created_at`` in ms; a phantom has
    no outbox row, so its age runs from ``processed_at``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    aware = as_of if as_of.tzinfo is not None else as_of.replace(tzinfo=dt.UTC)
    as_of_us = (aware - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)

    def age(col: Any) -> Any:
        return (F.lit(as_of_us) - F.unix_micros(col)) / 1000.0

    since = F.coalesce(F.col("created_at"), F.col("processed_at"))
    problems = details.where(F.col("kind").isin(*DISCREPANCY_CLASSES))
    oldest_first = Window.partitionBy("kind").orderBy(
        since.asc_nulls_last(), F.col("id").asc_nulls_last(), F.col("consumer").asc_nulls_last()
    )
    ranked = problems.select(
        "kind",
        "id",
        "topic",
        "key",
        "seq",
        "consumer",
        age(since).alias("age_ms"),
        F.row_number().over(oldest_first).alias("rank"),
    ).where(F.col("rank") <= top)
    messages: dict[str, list[dict[str, Any]]] = {k: [] for k in DISCREPANCY_CLASSES}
    for row in ranked.orderBy("kind", "rank").drop("rank").collect():
        r = row.asDict()
        messages[r.pop("kind")].append(r)
    keys = (
        problems.groupBy("topic", "key")
        .agg(
            F.countDistinct("id").alias("messages"),
            F.sort_array(F.collect_set("kind")).alias("kinds"),
            F.min(since).alias("oldest"),
        )
        .orderBy(
            F.desc("messages"),
            F.asc_nulls_last("oldest"),
            F.asc_nulls_last("topic"),
            F.asc_nulls_last("key"),
        )
        .select("topic", "key", "messages", "kinds", age(F.col("oldest")).alias("age_ms"))
        .limit(top)
        .collect()
    )
    return {"top": top, "messages": messages, "keys": [k.asDict() for k in keys]}


def record_run(source: Source, summary: dict[str, Any], xmin: int) -> None:
    """One row in ``outbox_reconciliation_runs`` of the outbox database."""
    stmts = spark_statements(source.schema)
    params = {
        "run_id": summary["run_id"],
        "started_at": dt.datetime.fromisoformat(summary["started_at"]),
        "finished_at": dt.datetime.fromisoformat(summary["finished_at"]),
        "window_start": dt.datetime.fromisoformat(summary["window"]["start"]),
        "window_end": dt.datetime.fromisoformat(summary["window"]["end"]),
        "horizon_xmin": xmin,
        "messages": summary["messages"],
        "discrepancies": summary["discrepancies"],
        "outcome": summary["outcome"],
        "summary": Jsonb(json.loads(json.dumps(summary, default=str))),
    }
    try:
        with connect(source) as conn:
            conn.execute(stmts.record_run, params)
    except psycopg.Error as exc:
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(
            f"cannot record the run in {stmts.runs_name} of the outbox database "
            f"({cause}): run `outbox migrate upgrade` there, grant INSERT on it to the job's "
            "user, or pass --no-record; no output files were published",
        ) from exc


def carried_start(source: Source, start: dt.datetime) -> dt.datetime:
    """The start of a default (nightly) window that would begin at ``start``: earlier, if the
    latest recorded run that ended by then left messages it could not judge for good (still
    in flight, lagging, or deferred behind an open transaction). They are judged by this run
    instead of by none. Messages of that earlier range judged before are judged again, so a
    discrepancy among them can be reported twice; none is missed."""
    try:
        with connect(source) as conn, conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                spark_statements(source.schema).last_unjudged, {"start": start}
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        return start  # never recorded: nothing to carry (recording will say what is missing)
    carried: dt.datetime | None = None if row is None else row["unjudged_from"]
    return start if carried is None else min(start, carried)


def format_summary(summary: Mapping[str, Any]) -> str:
    """The human summary printed on stdout."""
    c = summary["counts"]
    w = summary["window"]
    lines = [
        f"reconciliation {summary['run_id']}  window {w['start']} .. {w['end']}",
        f"  messages judged: {summary['messages']}  (message x consumer pairs: {c['pairs']}; "
        f"deferred, still in flight at start: {summary['deferred_in_flight']})",
        f"  delivered {c['delivered']}   in flight {c['in_flight']}   lagging {c['lagging']}",
        "  discrepancies: "
        + "  ".join(f"{k} {c[k]}" for k in DISCREPANCY_CLASSES)
        + f"   total {summary['discrepancies']}",
    ]
    for item in summary["latency"]:
        e2e = item["end_to_end"]
        lines.append(
            f"  latency {one_line(item['topic'])} -> {one_line(item['consumer'])}: n={item['n']} "
            f"p50 {format_duration(e2e['p50_ms'])}  p90 {format_duration(e2e['p90_ms'])}  "
            f"p99 {format_duration(e2e['p99_ms'])}  max {format_duration(e2e['max_ms'])}"
        )
    if summary.get("unjudged_from"):
        lines.append(
            f"  not judged for good (in flight, lagging or deferred) from "
            f"{summary['unjudged_from']} on: the next default run starts there"
        )
    for name, ex in summary["exceeded"].items():
        lines.append(f"  THRESHOLD EXCEEDED: {name} {ex['count']} > {ex['limit']}")
    lines.append(f"  outcome: {summary['outcome'].upper()}")
    files = summary.get("files")
    if files:
        lines.append(f"  report: {files['report']}  re-drive list: {files['redrive']}")
    return "\n".join(lines)
