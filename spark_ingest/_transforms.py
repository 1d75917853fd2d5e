"""Pure DataFrame transforms of the reconciliation: no I/O, testable on small DataFrames.

Inputs (column names as the readers produce them):

* outbox: ``id, topic, key, seq, status, created_at, published_at, tx_id``
* inbox: ``consumer, message_id, topic, key, seq, received_at, processed_at, attempts, status``
  (``source`` optional)
* subscriptions: ``topic, consumer`` (the consumers expected to process each topic)

The job evaluates everything in ONE pass over the sources: ``reconcile_rows`` joins the outbox
rows read (one row per expected consumer) with the inbox rows in a single full outer join, so the
same shuffle yields the classified pairs and the phantom candidates; ``summary_frame`` then
aggregates that materialised result in one job, and the details are a small filter of it.
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
    "compact",
    "daily_counts",
    "details",
    "judged_outbox",
    "reconcile_rows",
    "subscriptions_frame",
    "summarise",
    "summary_frame",
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


def _processed_out_of_order() -> Column:
    """On inbox rows: True when a processed row's seq is below one that the same consumer
    processed before it (by processed_at, then seq) for the same topic and key."""
    # The 64-bit hash leads the partition keys only to make the sort cheap (it compares one
    # long before any string); the string keys that follow keep the groups exact.
    group = ("consumer", "topic", "key")
    w = (
        Window.partitionBy(F.xxhash64(*group), *group)
        .orderBy("processed_at", "seq")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    done = F.col("status") == "processed"
    before = F.max(F.when(done, F.col("seq"))).over(w)
    return F.coalesce(done & (F.col("seq") < before), F.lit(False))


def _between(col: str, lo: dt.datetime | None, hi: dt.datetime | None) -> Column:
    cond = F.lit(True)
    if lo is not None:
        cond = cond & (F.col(col) >= F.lit(lo))
    if hi is not None:
        cond = cond & (F.col(col) < F.lit(hi))
    return cond


def _expected(subscriptions: DataFrame | Mapping[str, Sequence[str]]) -> Column:
    """``topic`` -> the array of its expected consumers, as a literal map: the subscriptions are
    a handful of rows, and an expression costs no broadcast job (which, on two cores, waited
    for the reads to free a slot). Given as a mapping, no Spark job at all."""
    by_topic: dict[str, set[str]] = {}
    if isinstance(subscriptions, Mapping):
        items = [(t, c) for t, consumers in subscriptions.items() for c in consumers]
    else:
        items = [(r["topic"], r["consumer"]) for r in subscriptions.collect()]
    for topic, consumer in items:
        by_topic.setdefault(topic, set()).add(consumer)
    if not by_topic:
        return F.lit(None).cast("array<string>")
    pairs = [
        x
        for topic, consumers in sorted(by_topic.items())
        for x in (F.lit(topic), F.array(*(F.lit(c) for c in sorted(consumers))))
    ]
    return F.try_element_at(F.create_map(*pairs), F.col("topic"))


def reconcile_rows(
    outbox: DataFrame,
    inbox: DataFrame,
    subscriptions: DataFrame | Mapping[str, Sequence[str]],
    as_of: dt.datetime,
    sla: dt.timedelta,
    *,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    xmin: int | None = None,
) -> DataFrame:
    """The whole reconciliation as one DataFrame, from one full outer join.

    Rows with ``row = 'pair'``: one per outbox row read and expected consumer (or one with a
    null consumer when nobody subscribes to its topic), ``judged`` when the message is in
    ``[start, end)`` and its transaction is below ``xmin``; ``class``, ``duplicate`` and
    ``out_of_order`` are set on judged pairs (out of order is decided on the inbox rows, before
    the join: the consumer's processing order among every inbox row read, so the window runs
    on the narrow inbox rows and once). Rows with ``row = 'candidate'``: inbox rows
    received in ``[start, end)`` that matched no pair (the message was not read, or the consumer
    is not expected to process its topic): phantom candidates, to be confirmed by the caller.
    """
    judged = _between("created_at", start, end)
    if xmin is not None:
        judged = judged & (F.col("tx_id") < F.lit(xmin))
    msgs = outbox.select(
        "id",
        "topic",
        "key",
        "seq",
        F.col("status").alias("outbox_status"),
        "created_at",
        "published_at",
        judged.alias("judged"),
    ).select("*", F.posexplode_outer(_expected(subscriptions)).alias("pos", "consumer"))
    msgs = msgs.select(
        *(c for c in msgs.columns if c != "pos"),
        F.coalesce(F.col("pos") == 0, F.lit(True)).alias("first"),
    )
    ib = inbox.select(
        F.col("consumer").alias("i_consumer"),
        F.col("message_id").alias("i_id"),
        F.col("topic").alias("i_topic"),
        F.col("key").alias("i_key"),
        F.col("seq").alias("i_seq"),
        F.col("status").alias("inbox_status"),
        F.col("attempts").alias("inbox_attempts"),
        "received_at",
        "processed_at",
        _processed_out_of_order().alias("i_out_of_order"),
    )
    cond = (msgs["id"] == ib["i_id"]) & (msgs["consumer"] == ib["i_consumer"])
    joined = msgs.join(ib, cond, "full_outer")
    is_pair = F.col("id").isNotNull()
    rows = joined.select(
        F.when(is_pair, "pair").otherwise("candidate").alias("row"),
        F.coalesce(F.col("id"), F.col("i_id")).alias("id"),
        F.coalesce(F.col("topic"), F.col("i_topic")).alias("topic"),
        F.coalesce(F.col("key"), F.col("i_key")).alias("key"),
        F.when(is_pair, F.col("seq")).otherwise(F.col("i_seq")).alias("seq"),
        F.coalesce(F.col("consumer"), F.col("i_consumer")).alias("consumer"),
        F.coalesce(is_pair & F.col("judged"), F.lit(False)).alias("judged"),
        F.coalesce(F.col("first"), is_pair).alias("first"),
        "outbox_status",
        "inbox_status",
        "created_at",
        "published_at",
        "received_at",
        "processed_at",
        "inbox_attempts",
        "i_out_of_order",
    ).where((F.col("row") == "pair") | _between("received_at", start, end))
    judged_pair = F.col("judged") & F.col("consumer").isNotNull()
    deadline = as_of - sla
    return rows.select(
        *(c for c in rows.columns if c != "i_out_of_order"),
        F.when(judged_pair, _class(deadline)).alias("class"),
        F.coalesce(judged_pair & (F.col("inbox_attempts") > 1), F.lit(False)).alias("duplicate"),
        F.coalesce(judged_pair & F.col("i_out_of_order"), F.lit(False)).alias("out_of_order"),
    )


def classify(
    judged: DataFrame,
    inbox: DataFrame,
    subscriptions: DataFrame,
    as_of: dt.datetime,
    sla: dt.timedelta,
) -> DataFrame:
    """One row per (judged message, expected consumer) with ``class``, ``duplicate``,
    ``out_of_order``: the pairs of ``reconcile_rows`` when every message given is judged."""
    rows = reconcile_rows(judged, inbox, subscriptions, as_of, sla)
    return rows.where((F.col("row") == "pair") & F.col("consumer").isNotNull())


def details(rows: DataFrame, present: DataFrame | None = None) -> DataFrame:
    """The discrepancy rows (plus lagging), one per (kind, message, consumer).

    ``present``: ids (column ``id``) of candidates found in the outbox after all; every other
    candidate is a phantom.
    """
    cols = [c for c in DETAIL_COLUMNS if c != "kind"]
    pairs = rows.where(F.col("class").isNotNull())
    by_class = pairs.where(~F.col("class").isin("delivered", "in_flight")).select(
        F.col("class").alias("kind"), *cols
    )
    dupes = pairs.where("duplicate").select(F.lit("duplicate").alias("kind"), *cols)
    disorder = pairs.where("out_of_order").select(F.lit("out_of_order").alias("kind"), *cols)
    ghosts = rows.where(F.col("row") == "candidate")
    if present is not None:
        ghosts = ghosts.join(F.broadcast(present), "id", "left_anti")
    ghosts = ghosts.select(
        F.lit("phantom").alias("kind"),
        *cols[:5],
        F.lit(None).cast("string").alias("outbox_status"),
        "inbox_status",
        F.lit(None).cast("timestamp").alias("created_at"),
        F.lit(None).cast("timestamp").alias("published_at"),
        "processed_at",
        "inbox_attempts",
    )
    return by_class.unionByName(dupes).unionByName(disorder).unionByName(ghosts)


#: Columns only a detail row needs: ``compact`` keeps them on those rows alone.
_DETAIL_ONLY = (
    "id",
    "key",
    "seq",
    "outbox_status",
    "inbox_status",
    "created_at",
    "published_at",
    "processed_at",
    "inbox_attempts",
)


def compact(rows: DataFrame) -> DataFrame:
    """``rows`` reduced to what the outputs need, cheap to cache.

    Every row keeps the few columns the summary aggregates (``row, topic, consumer, judged,
    first, class, duplicate, out_of_order`` and the three latencies of delivered pairs, in ms);
    the per-message columns survive only on rows that can become a detail row (candidates and
    every judged pair that is not a clean delivery), a few percent of them. Caching the full
    rows cost more than the join itself.
    """
    delivered = F.col("class") == "delivered"
    clean = delivered & ~F.col("duplicate") & ~F.col("out_of_order")
    keep = (F.col("row") == "candidate") | (F.col("class").isNotNull() & ~clean)
    legs = [F.when(delivered, _millis(a, b)).alias(f"{leg}_ms") for leg, (a, b) in _LEGS.items()]
    return rows.select(
        "row",
        "topic",
        "consumer",
        "judged",
        "first",
        "class",
        "duplicate",
        "out_of_order",
        *legs,
        *(F.when(keep, F.col(c)).alias(c) for c in _DETAIL_ONLY),
    )


def _millis(a: str, b: str) -> Column:
    return (F.unix_micros(F.col(b)) - F.unix_micros(F.col(a))) / 1000.0


_PCTS = [0.5, 0.9, 0.99]


_LEGS = {
    "publish": ("created_at", "published_at"),
    "process": ("published_at", "processed_at"),
    "end_to_end": ("created_at", "processed_at"),
}


def summary_frame(rows: DataFrame, classes: Sequence[str], buckets: Sequence[float]) -> DataFrame:
    """Every figure of the summary in one aggregation of ``compact`` rows, one row per (topic,
    consumer): message
    and deferred counts, pairs per class, flags, candidates, and for delivered pairs the latency
    percentiles, maxima and end-to-end histogram (bucket i counts latencies <= ``buckets[i]``,
    the last bucket everything above)."""
    judged_pair = F.col("class").isNotNull()
    delivered = F.col("class") == "delivered"
    pair = F.col("row") == "pair"
    aggs = [
        F.count_if(pair & F.col("first") & F.col("judged")).alias("messages"),
        F.count_if(pair & F.col("first") & ~F.col("judged")).alias("deferred"),
        F.count_if(judged_pair).alias("pairs"),
        F.count_if(F.col("row") == "candidate").alias("candidates"),
        F.count_if(F.col("duplicate")).alias("duplicate"),
        F.count_if(F.col("out_of_order")).alias("out_of_order"),
    ]
    aggs += [F.count_if(F.col("class") == c).alias(f"class_{c}") for c in classes]
    for leg in _LEGS:
        ms = F.col(f"{leg}_ms")
        aggs.append(F.percentile_approx(ms, _PCTS, 1000).alias(f"{leg}_pct"))
        aggs.append(F.max(ms).alias(f"{leg}_max"))
    e2e = F.col("end_to_end_ms")
    lower: Column = F.lit(True)
    for i, edge in enumerate([*buckets, None]):
        upper = F.lit(True) if edge is None else e2e <= edge
        aggs.append(F.count_if(delivered & lower & upper).alias(f"bucket_{i}"))
        lower = ~upper if edge is not None else lower
    return rows.groupBy("topic", "consumer").agg(*aggs)


def summarise(
    groups: Sequence[Mapping[str, Any]], classes: Sequence[str], buckets: Sequence[float]
) -> dict[str, Any]:
    """The ``summary_frame`` groups (as mappings; absent means null) as plain figures:
    ``messages``, ``deferred``,
    ``candidates``, ``counts`` (pairs, classes, duplicate, out_of_order), ``latency`` (per topic
    and consumer with delivered pairs) and ``latency_histogram`` (non-empty buckets)."""
    out: dict[str, Any] = {"messages": 0, "deferred": 0, "candidates": 0}
    counts = dict.fromkeys(("pairs", *classes, "duplicate", "out_of_order"), 0)
    latency, histogram = [], []
    for g in sorted(groups, key=lambda r: (r.get("topic") or "", r.get("consumer") or "")):
        for name in ("messages", "deferred", "candidates"):
            out[name] += int(g[name])
        for name in ("pairs", "duplicate", "out_of_order"):
            counts[name] += int(g[name])
        for c in classes:
            counts[c] += int(g[f"class_{c}"])
        n = int(g["class_delivered"]) if "delivered" in classes else 0
        if not n or g.get("consumer") is None:
            continue
        item: dict[str, Any] = {"topic": g.get("topic"), "consumer": g["consumer"], "n": n}
        for leg in _LEGS:
            pct = g.get(f"{leg}_pct") or [None, None, None]
            item[leg] = {
                "p50_ms": pct[0],
                "p90_ms": pct[1],
                "p99_ms": pct[2],
                "max_ms": g.get(f"{leg}_max"),
            }
        latency.append(item)
        where = {"topic": g.get("topic"), "consumer": g["consumer"]}
        histogram += [
            where | {"bucket": i, "n": int(g[f"bucket_{i}"])}
            for i in range(len(buckets) + 1)
            if g[f"bucket_{i}"]
        ]
    return out | {"counts": counts, "latency": latency, "latency_histogram": histogram}


def daily_counts(detail: DataFrame) -> list[dict[str, Any]]:
    """Discrepancies per day (of created_at, else processed_at) and kind, for the report."""
    day = F.to_date(F.coalesce(F.col("created_at"), F.col("processed_at")))
    rows = detail.groupBy(day.alias("day"), "kind").count().orderBy("day", "kind").collect()
    return [{"day": str(r["day"]), "kind": r["kind"], "count": int(r["count"])} for r in rows]
