"""The pure transforms on small in-memory DataFrames (no database), and the verdict."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from spark_ingest._outputs import judge
from spark_ingest._report import bar_chart
from spark_ingest._sources import time_predicates
from spark_ingest._transforms import classify, judged_outbox, subscriptions_frame

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
AS_OF = T0 + dt.timedelta(hours=5)
OUTBOX = "id string, topic string, key string, seq long, status string, created_at timestamp, available_at timestamp, published_at timestamp, tx_id long"  # noqa: E501
INBOX = "consumer string, message_id string, topic string, key string, seq long, received_at timestamp, processed_at timestamp, attempts int, duplicates int, status string"  # noqa: E501


def _pub(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


@pytest.mark.parametrize(
    ("status", "published", "inbox_status", "expected"),
    [
        ("published", _pub(1), "processed", "delivered"),
        ("published", _pub(1), None, "lost"),
        ("published", AS_OF - dt.timedelta(minutes=5), None, "lagging"),
        ("pending", None, None, "stuck"),
        ("dead", None, None, "dead"),
        ("published", _pub(1), "dead", "dead"),
        ("published", _pub(1), "stale", "stale"),
        ("published", _pub(1), "processing", "lost"),
    ],
)
def test_classify_one_pair(
    spark: Any, status: str, published: dt.datetime | None, inbox_status: str | None,
    expected: str,
) -> None:  # fmt: skip
    outbox = spark.createDataFrame([("m1", "t", "k", 1, status, T0, T0, published, 10)], OUTBOX)
    rows = [("c", "m1", "t", "k", 1, _pub(2), _pub(2), 1, 0, inbox_status)] if inbox_status else []
    inbox = spark.createDataFrame(rows, INBOX)
    judged = judged_outbox(outbox, T0, T0 + dt.timedelta(days=1), xmin=11)
    pairs = classify(judged, inbox, subscriptions_frame(spark, {"t": ["c"]}), AS_OF,
                     dt.timedelta(hours=1))  # fmt: skip
    assert [r["class"] for r in pairs.collect()] == [expected]


def test_judged_outbox_excludes_transactions_at_or_above_the_horizon(spark: Any) -> None:
    rows = [(f"m{x}", "t", "k", x, "published", T0, T0, T0, x) for x in (9, 10, 11)]
    outbox = spark.createDataFrame(rows, OUTBOX)
    judged = judged_outbox(outbox, T0, T0 + dt.timedelta(days=1), xmin=10)
    assert [r["id"] for r in judged.collect()] == ["m9"]


def test_judge_fails_only_above_the_thresholds() -> None:
    assert judge({"lost": 0, "lagging": 7}, {})["outcome"] == "ok"
    verdict = judge({"lost": 2, "duplicate": 3}, {"duplicate": 3, "total": 4})
    assert verdict["outcome"] == "failed"
    assert verdict["exceeded"] == {
        "lost": {"count": 2, "limit": 0},
        "total": {"count": 5, "limit": 4},
    }


def test_bar_chart_is_inline_svg_with_one_bar_per_value() -> None:
    svg = bar_chart(["a", "b<"], [1, 3], title="x & y")
    assert svg.startswith("<svg")
    assert svg.count("<rect") == 2
    assert "b&lt;" in svg
    assert "x &amp; y" in svg


def test_time_predicates_split_the_window_and_run_the_last_range_on_to_until() -> None:
    # The inbox is read up to its safe time (days after the window): split over that whole span,
    # the first partition would hold every row and the others none.
    end, until = T0 + dt.timedelta(days=10), T0 + dt.timedelta(days=300)
    mid = (T0 + dt.timedelta(days=5)).isoformat()
    preds = time_predicates("received_at", T0, end, 2, until=until)
    assert preds == [
        f"received_at >= '{T0.isoformat()}'::timestamptz AND received_at < '{mid}'::timestamptz",
        f"received_at >= '{mid}'::timestamptz AND received_at < '{until.isoformat()}'::timestamptz",
    ]
    assert time_predicates("received_at", T0, end, 2) == [
        preds[0],
        preds[1].replace(until.isoformat(), end.isoformat()),
    ]


def _exchanges(df: Any) -> list[str]:
    plan = str(df._jdf.queryExecution().executedPlan().toString())
    return [line.strip() for line in plan.splitlines() if "Exchange " in line]


def test_window_and_join_share_one_shuffle_per_side(spark: Any) -> None:
    # Both sides are hash-partitioned once on xxhash64(topic, key): the out-of-order window
    # (consumer, topic, key) and the join (pk, id, consumer, topic, key) reuse it, and the one
    # aggregation adds the only other shuffle.
    from spark_ingest._job import LATENCY_BUCKETS
    from spark_ingest._outcomes import outcome_groups
    from spark_ingest._transforms import CO_PARTITION_CONF, co_partitioned, reconcile_rows

    outbox = spark.createDataFrame([("m1", "t", "k", 1, "published", T0, T0, _pub(1), 10)], OUTBOX)
    inbox = spark.createDataFrame([("c", "m1", "t", "k", 1, _pub(2), _pub(2), 1, 0, "processed")],
                                  INBOX)  # fmt: skip
    before = spark.conf.get(CO_PARTITION_CONF)
    with co_partitioned(spark):
        rows = reconcile_rows(outbox, inbox, {"t": ["c"]}, AS_OF, dt.timedelta(hours=1))
        exchanges = _exchanges(outcome_groups(rows, LATENCY_BUCKETS))
        assert [r["class"] for r in rows.collect()] == ["delivered"]
    assert spark.conf.get(CO_PARTITION_CONF) == before
    assert len(exchanges) == 3, exchanges
    assert sum("hashpartitioning(pk" in e for e in exchanges) == 2, exchanges
    # Planned without it, the join shuffles both sides again.
    again = reconcile_rows(outbox, inbox, {"t": ["c"]}, AS_OF, dt.timedelta(hours=1))
    assert len(_exchanges(outcome_groups(again, LATENCY_BUCKETS))) == 5


def test_an_inbox_row_with_another_key_is_no_delivery_of_the_message(spark: Any) -> None:
    from spark_ingest._transforms import reconcile_rows

    outbox = spark.createDataFrame([("m1", "t", "k", 1, "published", T0, T0, _pub(1), 10)], OUTBOX)
    inbox = spark.createDataFrame([("c", "m1", "t", "other", 1, _pub(2), _pub(2), 1, 0,
                                    "processed")], INBOX)  # fmt: skip
    rows = reconcile_rows(outbox, inbox, {"t": ["c"]}, AS_OF, dt.timedelta(hours=1))
    got = sorted((r["row"], r["class"]) for r in rows.collect())
    assert got == [("candidate", None), ("pair", "lost")]
