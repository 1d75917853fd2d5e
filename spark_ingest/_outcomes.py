"""One aggregation of the classified rows: every summary figure and every detail row.

``outcome_groups`` turns the rows of ``reconcile_rows`` into one small DataFrame in a single
hash aggregation, with no cache of the rows and no sort:

* ``leg = 0`` groups count the rows per (topic, consumer, row kind, class, flags). A row that
  can become a detail row (a phantom candidate, any judged pair but a clean delivery) keeps its
  message columns in the key, so it is a group of its own: the details are read back from this
  result, a few percent of the rows.
* ``leg`` 1-3 groups are the latency histograms of delivered pairs (created -> published,
  published -> processed, created -> processed), one group per log-scale bucket (64 per
  doubling), with the largest latency seen in it, and for the end-to-end leg also per bucket of
  the report's fixed histogram.

Percentiles are read from the log-scale histogram: the nearest-rank percentile lies in the
bucket where the cumulative count reaches its rank, and the largest latency seen in that bucket
is reported. That is a latency that occurred, less than 1.1% (2^(1/64) - 1) above the exact
percentile; exact when the bucket holds one distinct value. ``percentile_approx`` over the rows
cost more than the join (a buffer update per row and leg, then a second pass over a cache).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "DETAIL_COLUMNS",
    "LEGS",
    "details",
    "figure_groups",
    "log_bucket",
    "outcome_groups",
    "summarise",
]

DETAIL_COLUMNS = (
    "kind",
    "id",
    "topic",
    "key",
    "seq",
    "consumer",
    "outbox_status",
    "inbox_status",
    "created_at",
    "published_at",
    "processed_at",
    "inbox_attempts",
)

#: The latency legs, numbered 1-3 in ``outcome_groups``: (from, to) columns.
LEGS = {
    "publish": ("created_at", "published_at"),
    "process": ("published_at", "processed_at"),
    "end_to_end": ("created_at", "processed_at"),
}

_FLAGS = ("row", "judged", "first", "class", "duplicate", "out_of_order")
_DETAIL_ONLY = [c for c in DETAIL_COLUMNS if c not in ("kind", "topic", "consumer")]
_PER_DOUBLING = 64
_ZERO_BUCKET = -1_000
_NEGATIVE = -1_000_000
_PCTS = (0.5, 0.9, 0.99)
_NOT_FINAL = ("in_flight", "lagging")  # classes a later run may still change


def log_bucket(ms: Column) -> Column:
    """The histogram bucket of a latency in ms: ``floor(64 * log2(ms))`` for ms > 0, one bucket
    for 0, mirrored below it for negative latencies (a clock stepped back), so buckets sort as
    the latencies do (positive ones are >= -638: latencies have microsecond precision)."""
    return (
        F.when(ms > 0, F.floor(F.log2(ms) * _PER_DOUBLING))
        .when(ms == 0, F.lit(_ZERO_BUCKET))
        .when(ms < 0, _NEGATIVE - F.floor(F.log2(-ms) * _PER_DOUBLING))
        .cast("int")
    )


def _report_bucket(ms: Column, edges: Sequence[float]) -> Column:
    """Index of the first edge ``ms`` is at most, ``len(edges)`` above the last."""
    out: Column = F.lit(len(edges))
    for i, edge in reversed(list(enumerate(edges))):
        out = F.when(ms <= edge, F.lit(i)).otherwise(out)
    return F.when(ms.isNotNull(), out)


def _millis(a: str, b: str) -> Column:
    return (F.unix_micros(F.col(b)) - F.unix_micros(F.col(a))) / 1000.0


def outcome_groups(rows: DataFrame, report_edges: Sequence[float]) -> DataFrame:
    """Count ``rows`` (from ``reconcile_rows``) in one aggregation; see the module docstring.

    Columns: ``topic, consumer, leg, bucket, report_bucket``, the flags (``row, judged, first,
    class, duplicate, out_of_order``, null on leg rows), the message columns of detail rows
    (null elsewhere), ``n`` and ``max_ms``.
    """
    delivered = F.col("class") == "delivered"
    clean = delivered & ~F.col("duplicate") & ~F.col("out_of_order")
    keep = (F.col("row") == "candidate") | (F.col("class").isNotNull() & ~clean)
    count_row = F.struct(
        F.lit(0).alias("leg"),
        F.lit(None).cast("int").alias("bucket"),
        F.lit(None).cast("int").alias("report_bucket"),
        F.lit(None).cast("double").alias("ms"),
    )
    legs = []
    for i, (leg, (a, b)) in enumerate(LEGS.items(), 1):
        ms = _millis(a, b)
        report = _report_bucket(ms, report_edges) if leg == "end_to_end" else None
        legs.append(
            F.struct(
                F.lit(i).alias("leg"),
                log_bucket(ms).alias("bucket"),
                (F.lit(None).cast("int") if report is None else report).alias("report_bucket"),
                ms.alias("ms"),
            )
        )
    facets = F.when(delivered, F.array(count_row, *legs)).otherwise(F.array(count_row))
    # Few, flat grouping keys: the flags as one struct, the detail columns as another (null on
    # clean rows). Twenty separate keys generate code above Spark's hugeMethodLimit, and Spark
    # then interprets the whole stage instead of compiling it.
    flags = F.struct(*_FLAGS)
    detail = F.when(keep, F.struct(*_DETAIL_ONLY))
    exploded = rows.select(
        "topic",
        "consumer",
        flags.alias("flags"),
        detail.alias("detail"),
        "created_at",
        F.explode(facets).alias("f"),
    )
    on_count_row = F.col("f.leg") == 0
    grouped = exploded.groupBy(
        "topic",
        "consumer",
        F.col("f.leg").alias("leg"),
        F.col("f.bucket").alias("bucket"),
        F.col("f.report_bucket").alias("report_bucket"),
        F.when(on_count_row, F.col("flags")).alias("flags"),
        F.when(on_count_row, F.col("detail")).alias("detail"),
    ).agg(
        F.count(F.lit(1)).alias("n"),
        F.max("f.ms").alias("max_ms"),
        F.min("created_at").alias("first_created"),
    )
    return grouped.select(
        "topic",
        "consumer",
        "leg",
        "bucket",
        "report_bucket",
        *(F.col(f"flags.{c}").alias(c) for c in _FLAGS),
        *(F.col(f"detail.{c}").alias(c) for c in _DETAIL_ONLY),
        "n",
        "max_ms",
        "first_created",
    )


def figure_groups(groups: DataFrame) -> DataFrame:
    """``outcome_groups`` without the detail columns: what ``summarise`` needs, a few rows."""
    keys = ["topic", "consumer", "leg", "bucket", "report_bucket", *_FLAGS]
    return groups.groupBy(*keys).agg(
        F.sum("n").alias("n"),
        F.max("max_ms").alias("max_ms"),
        F.min("first_created").alias("first_created"),
    )


def details(groups: DataFrame, present: DataFrame | None = None) -> DataFrame:
    """The discrepancy rows (plus lagging), one per (kind, message, consumer), from
    ``outcome_groups``. ``present``: ids (column ``id``) of phantom candidates found in the
    outbox after all; every other candidate is a phantom."""
    rows = groups.where((F.col("leg") == 0) & F.col("id").isNotNull())
    if present is not None:
        rows = rows.join(
            F.broadcast(present.select("id", F.lit(True).alias("_present"))), "id", "left"
        )
    else:
        rows = rows.withColumn("_present", F.lit(None).cast("boolean"))
    cls = F.col("class")
    kinds = F.array(
        F.when(cls.isNotNull() & ~cls.isin("delivered", "in_flight"), cls),
        F.when(F.col("duplicate"), F.lit("duplicate")),
        F.when(F.col("out_of_order"), F.lit("out_of_order")),
        F.when((F.col("row") == "candidate") & F.col("_present").isNull(), F.lit("phantom")),
    )
    kind = F.explode(F.filter(kinds, lambda k: k.isNotNull())).alias("kind")
    return rows.select(kind, *DETAIL_COLUMNS[1:])


def _percentiles(buckets: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """p50/p90/p99 (nearest rank) and max of one leg from its (bucket, n, max_ms) groups.

    One log bucket may come in several groups (split by the report's histogram bucket, or by
    a second aggregation): they are merged first, so the value reported for a bucket is the
    largest latency seen in all of it, whatever order the groups come in.
    """
    merged: dict[int, tuple[int, float]] = {}
    for b in buckets:
        if b["bucket"] is None:
            continue
        n, most = merged.get(int(b["bucket"]), (0, -math.inf))
        merged[int(b["bucket"])] = (n + int(b["n"]), max(most, float(b["max_ms"])))
    ordered = sorted(merged.items())
    total = sum(n for _, (n, _) in ordered)
    out: dict[str, float | None] = {}
    for p in _PCTS:
        rank, seen, value = max(1, math.ceil(p * total)), 0, None
        for _, (n, most) in ordered:
            seen += n
            if seen >= rank:
                value = most
                break
        out[f"p{round(p * 100)}_ms"] = value
    out["max_ms"] = max((most for _, (_, most) in ordered), default=None)
    return out


def summarise(
    groups: Sequence[Mapping[str, Any]], classes: Sequence[str], report_edges: Sequence[float]
) -> dict[str, Any]:
    """The plain figures from ``figure_groups``: ``messages``, ``deferred``, ``candidates``,
    ``counts`` (pairs, classes, duplicate, out_of_order), ``latency`` (per topic and consumer
    with delivered pairs) and ``latency_histogram`` (non-empty report buckets of the
    end-to-end leg)."""
    out: dict[str, Any] = {"messages": 0, "deferred": 0, "candidates": 0, "unjudged_from": None}
    counts = dict.fromkeys(("pairs", *classes, "duplicate", "out_of_order"), 0)
    delivered: dict[tuple[str, str], int] = {}
    legs: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for g in groups:
        where = (g["topic"], g["consumer"])
        n = int(g["n"])
        if g["leg"]:
            legs.setdefault(where, []).append(g)
            continue
        pair = g["row"] == "pair"
        out["messages"] += n if pair and g["first"] and g["judged"] else 0
        out["deferred"] += n if pair and g["first"] and not g["judged"] else 0
        # Not judged for good by this run: deferred, still in flight, or lagging. A later run
        # whose window starts at the oldest of them judges them (see _job.carried_start).
        open_ = pair and (not g["judged"] or g["class"] in _NOT_FINAL)
        if open_ and g.get("first_created") is not None:
            first = g["first_created"]
            if out["unjudged_from"] is None or first < out["unjudged_from"]:
                out["unjudged_from"] = first
        out["candidates"] += n if g["row"] == "candidate" else 0
        if g["class"] is not None:
            counts["pairs"] += n
            counts[g["class"]] += n
        counts["duplicate"] += n if g["duplicate"] else 0
        counts["out_of_order"] += n if g["out_of_order"] else 0
        if g["class"] == "delivered" and g["consumer"] is not None:
            delivered[where] = delivered.get(where, 0) + n
    latency, histogram = [], []
    for (topic, consumer), n in sorted(delivered.items()):
        item: dict[str, Any] = {"topic": topic, "consumer": consumer, "n": n}
        mine = legs.get((topic, consumer), [])
        for i, leg in enumerate(LEGS, 1):
            item[leg] = _percentiles(g for g in mine if g["leg"] == i)
        latency.append(item)
        per_bucket = dict.fromkeys(range(len(report_edges) + 1), 0)
        for g in mine:
            if g["leg"] == len(LEGS) and g["report_bucket"] is not None:
                per_bucket[int(g["report_bucket"])] += int(g["n"])
        where_ = {"topic": topic, "consumer": consumer}
        histogram += [where_ | {"bucket": i, "n": k} for i, k in per_bucket.items() if k]
    return out | {"counts": counts, "latency": latency, "latency_histogram": histogram}
