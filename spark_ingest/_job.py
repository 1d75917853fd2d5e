"""The reconciliation run: freeze horizons, read, classify, write the outputs."""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from outbox.schema import INBOX_MESSAGES, OUTBOX_MESSAGES
from spark_ingest import _outcomes, _outputs, _transforms
from spark_ingest._config import CLASSES, DISCREPANCY_CLASSES, JobConfig, Source, database_of
from spark_ingest._sources import (
    Horizon,
    connect,
    count_inbox,
    count_outbox,
    partitions_for,
    read_horizon,
    read_inbox,
    read_outbox,
    share_connections,
)
from spark_ingest._statements import spark_statements

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Reads", "RunResult", "classified_rows", "plan_partitions", "read_sources", "reconcile"]

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


def _confirm_phantoms(config: JobConfig, spark: SparkSession, ids: list[str]) -> DataFrame | None:
    """The candidate ids that exist in the outbox after all (older than the read, or a consumer
    not expected for the topic), as a one-column DataFrame; None when there are none."""
    if not ids:
        return None
    src = config.outbox
    query = spark_statements(src.schema).present_ids
    present: set[str] = set()
    with connect(src) as conn, conn.cursor(row_factory=dict_row) as cur:
        for i in range(0, len(ids), 10_000):
            present.update(r["id"] for r in cur.execute(query, {"ids": ids[i : i + 10_000]}))
    if not present:
        return None
    return spark.createDataFrame([(i,) for i in sorted(present)], "id string")


@dataclass(frozen=True)
class Reads:
    """The horizons frozen at start and the JDBC reads of one run (lazy, not cached)."""

    outbox_horizon: Horizon
    inbox_horizons: list[Horizon]
    end: dt.datetime  #: window end, capped at the outbox clock
    as_of: dt.datetime  #: the earliest clock below which every source is complete
    outbox: DataFrame
    inbox: DataFrame
    #: JDBC partitions of each read (at most; fewer if the window has fewer microseconds):
    #: the outbox first, then each inbox in the configuration's order.
    partitions: tuple[int, ...] = ()
    #: The rows each read was sized on (counted up to what its partitions can use), same
    #: order; None with an explicit ``config.partitions``.
    estimated_rows: tuple[int, ...] | None = None


def plan_partitions(sources: list[Source], wanted: list[int]) -> tuple[int, ...]:
    """Partitions per read, ``wanted`` bounded per database: the reads whose sources are in one
    database (host, port, database) get at most the smallest ``max_connections`` among those
    sources, in all (``share_connections``)."""
    groups: dict[tuple[str, int, str], list[int]] = {}
    for i, src in enumerate(sources):
        groups.setdefault(database_of(src), []).append(i)
    got = list(wanted)
    for members in groups.values():
        cap = min(sources[i].max_connections for i in members)
        for i, n in zip(members, share_connections([wanted[i] for i in members], cap), strict=True):
            got[i] = n
    return tuple(got)


def read_sources(spark: SparkSession, config: JobConfig) -> Reads:
    """Freeze every source's horizon, then build its JDBC read: the outbox rows of the window,
    the inbox rows from the window start (less a clock margin) up to each inbox's safe time.
    The plan built on them reads each source exactly once; ``bench/reconcile.py`` times these
    same reads as its floor.

    Each read gets ``ceil(rows / rows_per_partition)`` partitions (one at least), the rows
    counted on the driver with the read's own predicate (``count_outbox`` / ``count_inbox``),
    or ``config.partitions``; then the reads of one database share its ``max_connections``
    (``plan_partitions``), so no more partition queries than that run against it at once.
    """
    ob_h = read_horizon(config.outbox, OUTBOX_MESSAGES)
    ib_hs = [read_horizon(src, INBOX_MESSAGES) for src in config.inboxes]
    # SLA judgements use the earliest clock below which every source is complete.
    as_of = min([ob_h.now, *(h.safe_time for h in ib_hs)])
    end = min(config.window.end, ob_h.now)
    start = config.window.start
    sources = [config.outbox, *config.inboxes]
    rows: tuple[int, ...] | None = None
    if config.partitions is not None:
        wanted = [config.partitions] * len(sources)
    else:
        per = config.rows_per_partition

        def limit(src: Source) -> int:  # more rows than this cannot get more partitions
            return src.max_connections * per

        rows = (
            count_outbox(config.outbox, start, end, limit(config.outbox)),
            *(
                count_inbox(src, start, h.safe_time, limit(src))
                for src, h in zip(config.inboxes, ib_hs, strict=True)
            ),
        )
        wanted = [partitions_for(n, per) for n in rows]
    parts = plan_partitions(sources, wanted)
    outbox = read_outbox(spark, config.outbox, start, end, parts[0])
    inbox_frames = [
        read_inbox(spark, src, start, end, n, until=h.safe_time)
        for src, h, n in zip(config.inboxes, ib_hs, parts[1:], strict=True)
    ]
    inbox = inbox_frames[0]
    for frame in inbox_frames[1:]:
        inbox = inbox.unionByName(frame)
    return Reads(ob_h, ib_hs, end, as_of, outbox, inbox, parts, rows)


def classified_rows(config: JobConfig, reads: Reads) -> DataFrame:
    """The rows of ``reconcile_rows`` on ``reads``: every pair and phantom candidate of the
    window, classified. ``bench/reconcile.py`` counts these alone as its core reference."""
    return _transforms.reconcile_rows(
        reads.outbox,
        reads.inbox,
        config.subscriptions,
        reads.as_of,
        config.sla,
        start=config.window.start,
        end=reads.end,
        xmin=reads.outbox_horizon.xmin,
    )


def _write_details(
    config: JobConfig, spark: SparkSession, groups: DataFrame, target: Path
) -> DataFrame:
    """Confirm the phantom candidates (point lookups), write the details to ``target`` (Parquet)
    and return them read back."""
    from pyspark.sql import functions as F

    candidates = groups.where(F.col("row") == "candidate").select("id").distinct().collect()
    present = _confirm_phantoms(config, spark, sorted(r["id"] for r in candidates))
    # A few files, not one per shuffle partition of the groups (tiny files, a task each).
    files = max(1, spark.sparkContext.defaultParallelism)
    detail = _outcomes.details(groups, present).coalesce(files)
    detail.write.mode("overwrite").parquet(str(target))
    return spark.read.parquet(str(target))


def reconcile(
    spark: SparkSession,
    config: JobConfig,
    output_dir: str | Path | None = None,
    *,
    record: bool = True,
    now: dt.datetime | None = None,
) -> RunResult:
    """Run one reconciliation of ``config.window``; write outputs under ``output_dir/<run>``.

    Its queries are planned under ``_transforms.co_partitioned`` (one shuffle per side for
    the window and the join); the session's setting is restored afterwards.
    """
    with _transforms.co_partitioned(spark):
        return _reconcile(spark, config, output_dir, record=record, now=now)


def _reconcile(
    spark: SparkSession,
    config: JobConfig,
    output_dir: str | Path | None,
    *,
    record: bool,
    now: dt.datetime | None,
) -> RunResult:
    """``reconcile``, planned under ``co_partitioned``.

    One Spark job does the work: it reads every source once, joins, classifies and counts the
    rows in one aggregation whose small result (the figures, and the few rows that are
    details) is cached; the summary and the details come from that result, and the rest reads
    the small details dataset (docs/explanation/performance.md,
    "Where the time goes", measures it).
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    run_id = uuid.uuid4()
    started = now or dt.datetime.now(dt.UTC)
    reads = read_sources(spark, config)
    ob_h, as_of, end = reads.outbox_horizon, reads.as_of, reads.end
    rows = classified_rows(config, reads)
    # The one expensive pass: read every source once, join, classify, count. Its result is a
    # few rows plus one per detail row: cached, it is all the rest reads.
    # A cached plan keeps its shuffle partitions (AQE does not coalesce them), so the small
    # result would be read by spark.sql.shuffle.partitions tiny tasks in every job after the
    # pass: merged (no shuffle) into one partition per core instead.
    cores = max(1, spark.sparkContext.defaultParallelism)
    groups = (
        _outcomes.outcome_groups(rows, LATENCY_BUCKETS)
        .coalesce(cores)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    target = None if output_dir is None else Path(output_dir) / str(run_id)
    scratch = _scratch(target, run_id)
    try:
        figure_rows = _outcomes.figure_groups(groups).collect()
        detail = _write_details(config, spark, groups, scratch / "details")
        groups.unpersist()
        figures = _outcomes.summarise([g.asDict() for g in figure_rows], CLASSES, LATENCY_BUCKETS)
        daily = _transforms.daily_counts(detail)
        summary = _summary(config, run_id, started, figures, daily, ob_h, as_of, end)
        verdict = _outputs.judge(summary["counts"], config.thresholds)
        summary.update(verdict)
        lost = detail.where(F.col("kind") == "lost").select("id").distinct().collect()
        lost_ids = sorted(r["id"] for r in lost)
        first = detail.orderBy("kind", "id", "consumer").limit(1000).collect()
        if target is not None:
            summary["files"] = _outputs.output_files(target)
        summary["finished_at"] = dt.datetime.now(dt.UTC).isoformat()
        if target is not None:
            _outputs.write_outputs(scratch, summary, lost_ids)
        if record:
            _outputs.record_run(config.outbox, summary, ob_h.xmin)
        if target is not None:
            scratch.rename(target)
        return RunResult(
            run_id,
            summary,
            lost_ids,
            target,
            1 if verdict["outcome"] == "failed" else 0,
            [_aware(r.asDict()) for r in first],
        )
    finally:
        groups.unpersist()
        if target is None or scratch.exists():  # a failed run leaves no partial directory
            shutil.rmtree(scratch, ignore_errors=True)


def _scratch(target: Path | None, run_id: uuid.UUID) -> Path:
    """Where the run writes. Everything is written under a partial directory and renamed to
    ``target`` last, once the run is recorded: a run that fails half-way publishes nothing
    that looks finished."""
    if target is None:
        return Path(tempfile.mkdtemp(prefix="reconcile-"))
    scratch = target.with_name(f".{run_id}.partial")
    scratch.mkdir(parents=True, exist_ok=True)
    return scratch


def _summary(
    config: JobConfig,
    run_id: uuid.UUID,
    started: dt.datetime,
    figures: dict[str, Any],
    daily: list[dict[str, Any]],
    ob_h: Horizon,
    as_of: dt.datetime,
    end: dt.datetime,
) -> dict[str, Any]:
    """The run's summary, before its verdict: the window, the horizon and the figures."""
    counts = figures["counts"] | {"phantom": 0}
    counts["phantom"] = sum(d["count"] for d in daily if d["kind"] == "phantom")
    return {
        "run_id": str(run_id),
        "started_at": started.isoformat(),
        "window": {"start": config.window.start.isoformat(), "end": end.isoformat()},
        "as_of": as_of.isoformat(),
        "sla_seconds": config.sla.total_seconds(),
        "horizon": {"outbox_xmin": ob_h.xmin, "outbox_now": ob_h.now.isoformat()},
        "messages": figures["messages"],
        "deferred_in_flight": figures["deferred"],
        # The oldest created_at this run could not judge for good (deferred, in flight,
        # lagging): the next default window starts there (_outputs.carried_start).
        "unjudged_from": _unjudged_from(figures["unjudged_from"], ob_h, end),
        "subscriptions": {t: list(c) for t, c in sorted(config.subscriptions.items())},
        "counts": {k: counts.get(k, 0) for k in ("pairs", *_CLASS_KEYS)},
        "latency": figures["latency"],
        "daily": daily,
        "latency_histogram": {
            "buckets_ms": list(LATENCY_BUCKETS),
            "rows": figures["latency_histogram"],
        },
    }


def _unjudged_from(oldest: dt.datetime | None, horizon: Horizon, end: dt.datetime) -> str | None:
    """ISO 8601 (UTC) of the oldest created_at this run left unjudged: ``oldest`` (collected
    from Spark, naive and driver-local) among the rows it read, or the start of the oldest
    transaction still open in the outbox database at job start, whose rows nobody could read
    yet and will carry a created_at no earlier than that."""
    found = [] if oldest is None else [oldest.astimezone(dt.UTC)]
    if horizon.safe_time < min(end, horizon.now):
        found.append(horizon.safe_time)
    return min(found).isoformat() if found else None


def _aware(row: dict[str, Any]) -> dict[str, Any]:
    """PySpark collects a timestamp as a naive datetime in the driver's local time zone: make
    each one aware, in UTC, whatever TZ the job runs under."""
    return {
        k: v.astimezone(dt.UTC) if isinstance(v, dt.datetime) and v.tzinfo is None else v
        for k, v in row.items()
    }


_CLASS_KEYS = ("delivered", "in_flight", "lagging", *DISCREPANCY_CLASSES)
