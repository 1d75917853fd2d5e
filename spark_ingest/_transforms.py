"""Pure DataFrame transforms of the reconciliation: no I/O, testable on small DataFrames.

Inputs (column names as the readers produce them):

* outbox: ``id, topic, key, seq, status, attempts, created_at, published_at, tx_id``
* inbox: ``consumer, message_id, topic, key, seq, received_at, processed_at, attempts, status``
  (``source`` optional)
* subscriptions: ``topic, consumer`` (the consumers expected to process each topic)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, Window
from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DETAIL_COLUMNS",
    "classify",
    "counts",
    "daily_counts",
    "details",
    "judged_outbox",
    "latency",
    "phantom_candidates",
    "subscriptions_frame",
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


def subscriptions_frame(
    spark: SparkSession, subscriptions: Mapping[str, Sequence[str]]
) -> DataFrame:
    """``topic, consumer`` rows from a topic -> consumers map."""
    rows = [(t, c) for t, consumers in sorted(subscriptions.items()) for c in consumers]
    return spark.createDataFrame(rows, "topic string, consumer string")


def judged_outbox(outbox: DataFrame, start: dt.datetime, end: dt.datetime, xmin: int) -> DataFrame:
    """Messages of the window written by transactions complete at job start (tx_id < xmin)."""
    return outbox.where(
        (F.col("created_at") >= F.lit(start))
        & (F.col("created_at") < F.lit(end))
        & (F.col("tx_id") < F.lit(xmin))
    )


def _class(deadline: dt.datetime) -> Column:
    """The class of one (message, expected consumer) pair; ``deadline`` = as_of - SLA."""
    late_publish = F.col("created_at") < F.lit(deadline)
    late_process = F.col("published_at") < F.lit(deadline)
    ob, ib = F.col("outbox_status"), F.col("inbox_status")
    return (
        F.when(ib == "processed", "delivered")
        .when((ib == "dead") | (ob == "dead"), "dead")
        .when(ib == "stale", "stale")
        .when((ob == "pending") & late_publish, "stuck")
        .when(ob == "pending", "in_flight")
        .when(late_process, "lost")
        .otherwise("lagging")
    )


def _out_of_order() -> Column:
    """True when a processed row's seq is below one the consumer processed before it."""
    w = (
        Window.partitionBy("consumer", "topic", "key")
        .orderBy("processed_at", "seq")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    before = F.max(F.when(F.col("inbox_status") == "processed", F.col("seq"))).over(w)
    return F.coalesce(
        (F.col("inbox_status") == "processed") & (F.col("seq") < before), F.lit(False)
    )


def classify(
    judged: DataFrame,
    inbox: DataFrame,
    subscriptions: DataFrame,
    as_of: dt.datetime,
    sla: dt.timedelta,
) -> DataFrame:
    """One row per (message, expected consumer) with ``class``, ``duplicate``, ``out_of_order``."""
    msgs = judged.select(
        "id",
        "topic",
        "key",
        "seq",
        F.col("status").alias("outbox_status"),
        "created_at",
        "published_at",
    )
    ib = inbox.select(
        "consumer",
        F.col("message_id").alias("id"),
        F.col("status").alias("inbox_status"),
        F.col("attempts").alias("inbox_attempts"),
        "processed_at",
    )
    pairs = msgs.join(subscriptions, "topic").join(ib, ["id", "consumer"], "left")
    return pairs.select(
        "*",
        _class(as_of - sla).alias("class"),
        F.coalesce(F.col("inbox_attempts") > 1, F.lit(False)).alias("duplicate"),
        _out_of_order().alias("out_of_order"),
    )


def phantom_candidates(
    inbox: DataFrame, outbox: DataFrame, start: dt.datetime, end: dt.datetime
) -> DataFrame:
    """Inbox rows received in the window whose message is not among the outbox rows read.

    Only candidates: the message may be older than what was read. The job confirms each one
    with a point lookup in the outbox database before calling it a phantom.
    """
    window = inbox.where(
        (F.col("received_at") >= F.lit(start)) & (F.col("received_at") < F.lit(end))
    )
    return window.join(outbox.select(F.col("id").alias("message_id")), "message_id", "left_anti")


def details(pairs: DataFrame, phantoms: DataFrame) -> DataFrame:
    """The discrepancy rows (plus lagging), one per (kind, message, consumer)."""
    cols = [c for c in DETAIL_COLUMNS if c != "kind"]
    base = pairs.select(*cols, "class", "duplicate", "out_of_order")
    by_class = base.where(F.col("class").isin("delivered", "in_flight") == F.lit(False)).select(
        F.col("class").alias("kind"), *cols
    )
    dupes = base.where("duplicate").select(F.lit("duplicate").alias("kind"), *cols)
    disorder = base.where("out_of_order").select(F.lit("out_of_order").alias("kind"), *cols)
    ghosts = phantoms.select(
        F.lit("phantom").alias("kind"),
        F.col("message_id").alias("id"),
        "topic",
        "key",
        "seq",
        "consumer",
        F.lit(None).cast("string").alias("outbox_status"),
        F.col("status").alias("inbox_status"),
        F.lit(None).cast("timestamp").alias("created_at"),
        F.lit(None).cast("timestamp").alias("published_at"),
        "processed_at",
        F.col("attempts").alias("inbox_attempts"),
    )
    return by_class.unionByName(dupes).unionByName(disorder).unionByName(ghosts)


def counts(pairs: DataFrame, detail: DataFrame) -> dict[str, int]:
    """Pair counts per class and detail counts per kind, in one dict (zeros included)."""
    out: dict[str, int] = {"pairs": 0}
    for row in pairs.groupBy("class").count().collect():
        out[row["class"]] = int(row["count"])
        out["pairs"] += int(row["count"])
    for row in (
        detail.where(F.col("kind").isin("duplicate", "out_of_order", "phantom"))
        .groupBy("kind")
        .count()
        .collect()
    ):
        out[row["kind"]] = int(row["count"])
    return out


def _millis(a: str, b: str) -> Column:
    return (F.unix_micros(F.col(b)) - F.unix_micros(F.col(a))) / 1000.0


_PCTS = [0.5, 0.9, 0.99]


def latency(pairs: DataFrame) -> list[dict[str, Any]]:
    """Per topic and consumer: p50/p90/p99/max in ms of created->published->processed."""
    done = pairs.where(F.col("class") == "delivered").select(
        "topic",
        "consumer",
        _millis("created_at", "published_at").alias("publish"),
        _millis("published_at", "processed_at").alias("process"),
        _millis("created_at", "processed_at").alias("end_to_end"),
    )
    aggs = [F.count(F.lit(1)).alias("n")]
    for leg in ("publish", "process", "end_to_end"):
        aggs.append(F.percentile_approx(leg, _PCTS, 1000).alias(f"{leg}_pct"))
        aggs.append(F.max(leg).alias(f"{leg}_max"))
    rows = done.groupBy("topic", "consumer").agg(*aggs).orderBy("topic", "consumer").collect()
    result = []
    for r in rows:
        item: dict[str, Any] = {"topic": r["topic"], "consumer": r["consumer"], "n": r["n"]}
        for leg in ("publish", "process", "end_to_end"):
            pct = r[f"{leg}_pct"] or [None, None, None]
            item[leg] = {
                "p50_ms": pct[0],
                "p90_ms": pct[1],
                "p99_ms": pct[2],
                "max_ms": r[f"{leg}_max"],
            }
        result.append(item)
    return result


def daily_counts(detail: DataFrame) -> list[dict[str, Any]]:
    """Discrepancies per day (of created_at, else processed_at) and kind, for the report."""
    day = F.to_date(F.coalesce(F.col("created_at"), F.col("processed_at")))
    rows = detail.groupBy(day.alias("day"), "kind").count().orderBy("day", "kind").collect()
    return [{"day": str(r["day"]), "kind": r["kind"], "count": int(r["count"])} for r in rows]


def latency_histogram(pairs: DataFrame, buckets: Sequence[float]) -> list[dict[str, Any]]:
    """End-to-end latency counts per topic, consumer and bucket (upper bounds in ms)."""
    e2e = _millis("created_at", "processed_at")
    bucket: Column = F.lit(len(buckets))
    for i, edge in reversed(list(enumerate(buckets))):
        bucket = F.when(e2e <= edge, i).otherwise(bucket)
    rows = (
        pairs.where(F.col("class") == "delivered")
        .groupBy("topic", "consumer", bucket.alias("bucket"))
        .count()
        .collect()
    )
    return [
        {"topic": r["topic"], "consumer": r["consumer"], "bucket": r["bucket"], "n": r["count"]}
        for r in rows
    ]
