"""Outputs of a run: verdict against thresholds, files, the run row, the text summary."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from spark_ingest._config import DISCREPANCY_CLASSES, Source
from spark_ingest._errors import SourceError
from spark_ingest._sources import connect
from spark_ingest._statements import spark_statements

__all__ = [
    "carried_start",
    "format_summary",
    "judge",
    "output_files",
    "record_run",
    "write_outputs",
]


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


def write_outputs(directory: Path, summary: dict[str, Any], lost_ids: list[str]) -> None:
    """Next to ``directory/details`` (Parquet, written by the Spark pass): summary.json,
    redrive.txt and report.html. ``directory`` is the run's partial directory, renamed to
    its final name (``summary["files"]``) only once everything is written and recorded."""
    from spark_ingest._report import render_html

    (directory / "redrive.txt").write_text("".join(f"{i}\n" for i in lost_ids))
    (directory / "report.html").write_text(render_html(summary))
    (directory / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


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
        with connect(source) as conn:
            row = conn.execute(
                spark_statements(source.schema).last_unjudged, {"start": start}
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        return start  # never recorded: nothing to carry (recording will say what is missing)
    carried: dt.datetime | None = None if row is None else row[0]
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
            f"  latency {item['topic']} -> {item['consumer']}: n={item['n']} "
            f"p50 {_ms(e2e['p50_ms'])} p90 {_ms(e2e['p90_ms'])} p99 {_ms(e2e['p99_ms'])} "
            f"max {_ms(e2e['max_ms'])}"
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


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f}s" if value >= 1000 else f"{value:.0f}ms"
