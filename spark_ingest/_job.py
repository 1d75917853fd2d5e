"""The reconciliation run: freeze horizons, read, classify, write the outputs."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox.schema import INBOX_MESSAGES, OUTBOX_MESSAGES
from spark_ingest import _outputs, _transforms
from spark_ingest._config import DISCREPANCY_CLASSES, JobConfig
from spark_ingest._sources import Horizon, connect, read_horizon, read_inbox, read_outbox

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["RunResult", "reconcile"]

#: Upper bounds (ms) of the end-to-end latency histogram buckets in the report.
LATENCY_BUCKETS = (10.0, 50.0, 100.0, 500.0, 1_000.0, 5_000.0, 30_000.0, 300_000.0, 3_600_000.0)


@dataclass
class RunResult:
    """What one run found; ``summary`` is the JSON document, ``exit_code`` 0 or 1."""

    run_id: uuid.UUID
    summary: dict[str, Any]
    lost_ids: list[str]
    output_dir: Path | None
    exit_code: int
    details: list[dict[str, Any]] = field(default_factory=list)


def _confirm_phantoms(config: JobConfig, candidates: DataFrame) -> DataFrame:
    """Drop candidates whose message exists in the outbox after all (older than the read)."""
    from psycopg import sql

    ids = sorted({r["message_id"] for r in candidates.select("message_id").collect()})
    if not ids:
        return candidates
    src = config.outbox
    table = (
        sql.Identifier(src.schema, OUTBOX_MESSAGES)
        if src.schema
        else sql.Identifier(OUTBOX_MESSAGES)
    )
    query = sql.SQL("SELECT id::text FROM {} WHERE id = ANY(%s::uuid[])").format(table)
    present: set[str] = set()
    with connect(src) as conn:
        for i in range(0, len(ids), 10_000):
            present.update(r[0] for r in conn.execute(query, (ids[i : i + 10_000],)))
    if not present:
        return candidates
    from pyspark.sql import functions as F

    return candidates.where(~F.col("message_id").isin(sorted(present)))


def _read(
    spark: SparkSession, config: JobConfig, end: dt.datetime, horizons: list[Horizon]
) -> tuple[DataFrame, DataFrame]:
    parts = config.partitions or spark.sparkContext.defaultParallelism
    outbox = read_outbox(spark, config.outbox, config.window.start, end, parts)
    inbox_frames = [
        read_inbox(spark, src, config.window.start, h.safe_time, parts)
        for src, h in zip(config.inboxes, horizons, strict=True)
    ]
    inbox = inbox_frames[0]
    for frame in inbox_frames[1:]:
        inbox = inbox.unionByName(frame)
    return outbox.persist(), inbox.persist()


def reconcile(
    spark: SparkSession,
    config: JobConfig,
    output_dir: str | Path | None = None,
    *,
    record: bool = True,
    now: dt.datetime | None = None,
) -> RunResult:
    """Run one reconciliation of ``config.window``; write outputs under ``output_dir/<run>``."""
    run_id = uuid.uuid4()
    started = now or dt.datetime.now(dt.UTC)
    ob_h = read_horizon(config.outbox, OUTBOX_MESSAGES)
    ib_hs = [read_horizon(src, INBOX_MESSAGES) for src in config.inboxes]
    # SLA judgements use the earliest clock below which every source is complete.
    as_of = min([ob_h.now, *(h.safe_time for h in ib_hs)])
    end = min(config.window.end, ob_h.now)
    outbox, inbox = _read(spark, config, end, ib_hs)
    try:
        subs = _transforms.subscriptions_frame(spark, config.subscriptions)
        judged = _transforms.judged_outbox(outbox, config.window.start, end, ob_h.xmin)
        pairs = _transforms.classify(judged, inbox, subs, as_of, config.sla).persist()
        candidates = _transforms.phantom_candidates(inbox, outbox, config.window.start, end)
        phantoms = _confirm_phantoms(config, candidates)
        detail = _transforms.details(pairs, phantoms).persist()
        counts = _transforms.counts(pairs, detail)
        summary: dict[str, Any] = {
            "run_id": str(run_id),
            "started_at": started.isoformat(),
            "window": {"start": config.window.start.isoformat(), "end": end.isoformat()},
            "as_of": as_of.isoformat(),
            "sla_seconds": config.sla.total_seconds(),
            "horizon": {"outbox_xmin": ob_h.xmin, "outbox_now": ob_h.now.isoformat()},
            "messages": judged.count(),
            "deferred_in_flight": outbox.where(
                (outbox["created_at"] >= config.window.start) & (outbox["tx_id"] >= ob_h.xmin)
            ).count(),
            "subscriptions": {t: list(c) for t, c in sorted(config.subscriptions.items())},
            "counts": {k: counts.get(k, 0) for k in ("pairs", *_CLASS_KEYS)},
            "latency": _transforms.latency(pairs),
            "daily": _transforms.daily_counts(detail),
            "latency_histogram": {
                "buckets_ms": list(LATENCY_BUCKETS),
                "rows": _transforms.latency_histogram(pairs, LATENCY_BUCKETS),
            },
        }
        verdict = _outputs.judge(summary["counts"], config.thresholds)
        summary.update(verdict)
        lost_ids = sorted(
            r["id"] for r in detail.where("kind = 'lost'").select("id").distinct().collect()
        )
        target = _outputs.write_outputs(output_dir, run_id, summary, detail, lost_ids)
        summary["finished_at"] = dt.datetime.now(dt.UTC).isoformat()
        if record:
            _outputs.record_run(config.outbox, summary, ob_h.xmin)
        rows = [r.asDict() for r in detail.orderBy("kind", "id", "consumer").limit(1000).collect()]
        return RunResult(
            run_id, summary, lost_ids, target, 1 if verdict["outcome"] == "failed" else 0, rows
        )
    finally:
        outbox.unpersist()
        inbox.unpersist()


_CLASS_KEYS = ("delivered", "in_flight", "lagging", *DISCREPANCY_CLASSES)
