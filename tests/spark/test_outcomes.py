"""The one aggregation of the classified rows: figures, latency percentiles, details."""

from __future__ import annotations

import datetime as dt
from typing import Any

from spark_ingest._config import CLASSES
from spark_ingest._outcomes import details, figure_groups, log_bucket, outcome_groups, summarise
from spark_ingest._transforms import reconcile_rows

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
MS = dt.timedelta(milliseconds=1)
OUTBOX = "id string, topic string, key string, seq long, status string, created_at timestamp, available_at timestamp, published_at timestamp, tx_id long"  # noqa: E501
INBOX = "consumer string, message_id string, topic string, key string, seq long, received_at timestamp, processed_at timestamp, attempts int, duplicates int, status string"  # noqa: E501
EDGES = (10.0, 50.0, 100.0)


def _run(spark: Any, latencies_ms: list[int]) -> tuple[dict[str, Any], list[Any]]:
    """One message per latency, published 1 ms after creation, processed ``ms`` after it."""
    out, inb = [], []
    for i, ms in enumerate(latencies_ms):
        created = T0 + dt.timedelta(seconds=i)
        out.append((f"m{i}", "t", f"k{i}", 1, "published", created, created, created + MS, 1))
        done = created + ms * MS
        inb.append(("c", f"m{i}", "t", f"k{i}", 1, done, done, 1, 0, "processed"))
    inb.append(("c", "ghost", "t", "g", 1, T0, T0, 2, 1, "processed"))
    rows = reconcile_rows(
        spark.createDataFrame(out, OUTBOX), spark.createDataFrame(inb, INBOX),
        {"t": ["c"]}, T0 + dt.timedelta(days=2), dt.timedelta(hours=1),
        start=T0, end=T0 + dt.timedelta(days=1), xmin=2,
    )  # fmt: skip
    groups = outcome_groups(rows, EDGES)
    figures = summarise([g.asDict() for g in figure_groups(groups).collect()], CLASSES, EDGES)
    return figures, details(groups).collect()


def test_summary_percentiles_are_seen_latencies_at_most_one_bucket_above_the_exact_ones(
    spark: Any,
) -> None:
    figures, _ = _run(spark, list(range(1, 201)))
    [item] = figures["latency"]
    e2e = item["end_to_end"]
    # Nearest rank over 1..200 ms: p50 = 100, p90 = 180, p99 = 198; buckets are 2^(1/64) wide.
    for key, exact in (("p50_ms", 100), ("p90_ms", 180), ("p99_ms", 198)):
        assert exact <= e2e[key] < exact * 2 ** (1 / 64), key
        assert float(e2e[key]).is_integer()  # a latency that occurred
    assert e2e["max_ms"] == 200
    assert item["publish"] == {"p50_ms": 1.0, "p90_ms": 1.0, "p99_ms": 1.0, "max_ms": 1.0}
    assert item["n"] == 200
    hist = {r["bucket"]: r["n"] for r in figures["latency_histogram"]}
    assert hist == {0: 10, 1: 40, 2: 50, 3: 100}  # <= 10, <= 50, <= 100, above


def test_summary_counts_and_details_come_from_the_same_groups(spark: Any) -> None:
    figures, rows = _run(spark, [5, 5, 5])
    assert figures["messages"] == 3
    assert figures["candidates"] == 1
    assert figures["counts"]["delivered"] == 3
    # The ghost: one detail row; clean deliveries are none.
    assert [(r["kind"], r["id"], r["inbox_attempts"]) for r in rows] == [("phantom", "ghost", 2)]


def test_log_bucket_sorts_as_the_latencies_do(spark: Any) -> None:
    values = [-5000.0, -2.0, -0.001, 0.0, 0.001, 0.5, 1.0, 1.02, 2.0, 86_400_000.0]
    df = spark.createDataFrame([(v,) for v in values], "ms double")
    buckets = [r["b"] for r in df.select(log_bucket(df["ms"]).alias("b")).collect()]
    assert buckets == sorted(buckets)
    assert len(set(buckets)) == len(values)
