"""Pure DataFrame transforms of the reconciliation: no I/O, testable on small DataFrames.

Inputs (column names as the readers produce them):

* outbox: ``id, topic, key, seq, status, created_at, available_at, published_at, tx_id``
* inbox: ``consumer, message_id, topic, key, seq, received_at, processed_at, attempts,
  duplicates, status`` (``source`` optional)
* subscriptions: ``topic, consumer`` (the consumers expected to process each topic)

The job evaluates everything in ONE pass over the sources: ``reconcile_rows`` joins the outbox
rows read (one row per expected consumer) with the inbox rows in a single full outer join, so the
same shuffle yields the classified pairs and the phantom candidates; ``_outcomes`` then counts
them in one aggregation that also keeps the detail rows. Each side is shuffled once, on a hash of
(topic, key), which both the out-of-order window and the join use.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, Window
from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "CO_PARTITION_CONF",
    "classify",
    "co_partitioned",
    "daily_counts",
    "judged_outbox",
    "reconcile_rows",
    "subscriptions_frame",
]


#: Spark's guard against co-partitioning on a subset of the join keys (default true: a join is
#: only planned without a shuffle when its sides are hash-partitioned on ALL its keys).
CO_PARTITION_CONF = "spark.sql.requireAllClusterKeysForCoPartition"


@contextmanager
def co_partitioned(spark: SparkSession) -> Iterator[None]:
    """Plan the queries run inside with ``CO_PARTITION_CONF`` false, then restore it.

    ``reconcile_rows`` partitions both sides on a hash of (topic, key) alone, a subset of its
    join keys: only with this setting false does the join reuse that partitioning instead of
    shuffling both sides again (the skew the guard is there for is the window's anyway: it
    needs every row of a consumer, topic and key in one partition). The setting is read when
    a query is planned, that is at its first action."""
    before = spark.conf.get(CO_PARTITION_CONF, None)
    spark.conf.set(CO_PARTITION_CONF, "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(CO_PARTITION_CONF)
        else:
            spark.conf.set(CO_PARTITION_CONF, before)


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


def _due() -> Column:
    """When the relay may publish a message: ``available_at`` when the producer scheduled it
    later (``deliver_after`` / ``available_at``), else ``created_at``. The SLA to publish runs
    from here: a message not yet due is in flight, never stuck.

    ``available_at`` is also where the relay puts a retry (``outbox_mark_batch``) and where a
    re-drive or a dead-letter retry re-queues a row, so a row being retried is due at its next
    try and a re-queued row at its re-queue: the relay's retries end in ``dead`` after
    ``max_attempts`` (each wait at most ``backoff_max``), so a retry never hides a row for
    long. Rows released untried (a broker outage) keep their ``available_at``."""
    return F.greatest(F.col("created_at"), F.col("available_at"))


def _class(deadline: dt.datetime) -> Column:
    """The class of one (message, expected consumer) pair; ``deadline`` = as_of - SLA."""
    late_publish = F.col("due_at") < F.lit(deadline)
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


def _processed_out_of_order(
    consumer: str = "consumer", topic: str = "topic", key: str = "key", hashed: str | None = None
) -> Column:
    """On inbox rows: True when a processed row's seq is below one that the same consumer
    processed before it (by processed_at, then seq) for the same topic and key.

    ``hashed``: a column holding ``xxhash64(topic, key)`` (the rows are partitioned on it, so
    the window needs no shuffle of its own); without it the hash is computed here."""
    # The 64-bit hash leads the partition keys only to make the sort cheap (it compares one
    # long before any string); the string keys that follow keep the groups exact.
    lead = F.xxhash64(topic, key) if hashed is None else F.col(hashed)
    w = (
        Window.partitionBy(lead, consumer, topic, key)
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

    An inbox row matches its pair on (message id, consumer) and on the message's topic and key,
    which it copies from the message: one hash partitioning on (topic, key) then serves the
    window and the join, with one shuffle per side, when the plan is made under
    ``co_partitioned`` (else the join shuffles both sides again). An inbox row carrying
    another topic or key than its message's is a candidate (found in the outbox, so not a
    phantom), and its pair has no inbox row.
    """
    judged = _between("created_at", start, end)
    if xmin is not None:
        judged = judged & (F.col("tx_id") < F.lit(xmin))
    msgs = _message_side(outbox, subscriptions, judged)
    rows = _joined(msgs, _inbox_side(inbox), start, end)
    judged_pair = F.col("judged") & F.col("consumer").isNotNull()
    deadline = as_of - sla
    return rows.select(
        *(c for c in rows.columns if c != "i_out_of_order"),
        F.when(judged_pair, _class(deadline)).alias("class"),
        # Delivered again after it was settled (inbox_note_duplicate); not attempts > 1, which
        # also counts the failed handler attempts of a retried or dead message.
        F.coalesce(judged_pair & (F.col("inbox_duplicates") > 0), F.lit(False)).alias("duplicate"),
        F.coalesce(judged_pair & F.col("i_out_of_order"), F.lit(False)).alias("out_of_order"),
    )


def _message_side(
    outbox: DataFrame, subscriptions: DataFrame | Mapping[str, Sequence[str]], judged: Column
) -> DataFrame:
    """The outbox rows, hash-partitioned on (topic, key), one per expected consumer."""
    # Both sides are hash-partitioned ONCE, on the same column: the 64-bit hash of (topic, key).
    # The out-of-order window (per consumer, topic and key) and the join (whose keys include
    # topic and key) are then both satisfied by that partitioning, so neither adds a shuffle
    # (EnsureRequirements: a hash partitioning on a subset of the keys satisfies them, and the
    # two sides are co-partitioned on the same key position). The outbox rows are shuffled
    # before they are expanded per expected consumer: half the rows of an expansion first.
    msgs = outbox.select(
        "id",
        "topic",
        "key",
        "seq",
        F.col("status").alias("outbox_status"),
        "created_at",
        _due().alias("due_at"),
        "published_at",
        judged.alias("judged"),
        F.xxhash64("topic", "key").alias("pk"),
    ).repartition("pk")
    msgs = msgs.select("*", F.posexplode_outer(_expected(subscriptions)).alias("pos", "consumer"))
    msgs = msgs.select(
        *(c for c in msgs.columns if c != "pos"),
        F.coalesce(F.col("pos") == 0, F.lit(True)).alias("first"),
    )
    return msgs


def _inbox_side(inbox: DataFrame) -> DataFrame:
    """The narrow inbox rows, hash-partitioned like the messages, with their out-of-order flag."""
    narrow = inbox.select(
        "consumer",
        "message_id",
        "topic",
        "key",
        "seq",
        "status",
        "attempts",
        "duplicates",
        "received_at",
        "processed_at",
        F.xxhash64("topic", "key").alias("pk"),
    ).repartition("pk")
    return narrow.select(
        F.col("pk").alias("i_pk"),
        F.col("consumer").alias("i_consumer"),
        F.col("message_id").alias("i_id"),
        F.col("topic").alias("i_topic"),
        F.col("key").alias("i_key"),
        F.col("seq").alias("i_seq"),
        F.col("status").alias("inbox_status"),
        F.col("attempts").alias("inbox_attempts"),
        F.col("duplicates").alias("inbox_duplicates"),
        "received_at",
        "processed_at",
        _processed_out_of_order(hashed="pk").alias("i_out_of_order"),
    )


def _joined(
    msgs: DataFrame, ib: DataFrame, start: dt.datetime | None, end: dt.datetime | None
) -> DataFrame:
    """One full outer join: pairs (a message and its consumer, with its inbox row if any) and
    candidates (inbox rows received in ``[start, end)`` that matched no pair)."""
    # An inbox row matches its message on (id, consumer) and on the message's topic and key,
    # which every inbox row copies from the message it received.
    cond = (
        (msgs["pk"] == ib["i_pk"])
        & (msgs["id"] == ib["i_id"])
        & (msgs["consumer"] == ib["i_consumer"])
        & msgs["topic"].eqNullSafe(ib["i_topic"])
        & msgs["key"].eqNullSafe(ib["i_key"])
    )
    joined = msgs.join(ib, cond, "full_outer")
    is_pair = F.col("id").isNotNull()
    return joined.select(
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
        "due_at",
        "published_at",
        "received_at",
        "processed_at",
        "inbox_attempts",
        "inbox_duplicates",
        "i_out_of_order",
    ).where((F.col("row") == "pair") | _between("received_at", start, end))


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


def daily_counts(detail: DataFrame) -> list[dict[str, Any]]:
    """Discrepancies per day (of created_at, else processed_at) and kind, for the report."""
    day = F.to_date(F.coalesce(F.col("created_at"), F.col("processed_at")))
    rows = detail.groupBy(day.alias("day"), "kind").count().orderBy("day", "kind").collect()
    return [{"day": str(r["day"]), "kind": r["kind"], "count": int(r["count"])} for r in rows]
