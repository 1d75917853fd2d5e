"""A/B of the reconciliation's plan: one shuffle per side (now) vs the plan before issue 14.

Before: the outbox rows expanded per expected consumer, then shuffled on (id, consumer) for the
join; the inbox rows shuffled on (consumer, topic, key) for the out-of-order window, then again
on (id, consumer) for the join (4 shuffles in the main pass). Now: both sides shuffled once on
xxhash64(topic, key) (3 shuffles). "before" runs the whole job with ``reconcile_rows`` replaced
by a copy of the former one; everything else is the same code. Alternating runs in one Spark
session (local[2], as bench/reconcile.py) on the databases ``bench/reconcile.py --reuse`` keeps.

Usage: python bench/reconcile_ab.py [--messages 1000000] [--repeat 3] [--name reconcile_ab]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import write_result
from reconcile import _databases, _read_floor, configs

from spark_ingest import _transforms, reconcile, spark_session


def _rows_before(
    outbox: Any,
    inbox: Any,
    subscriptions: Mapping[str, Sequence[str]],
    as_of: dt.datetime,
    sla: dt.timedelta,
    *,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    xmin: int | None = None,
) -> Any:
    """``reconcile_rows`` as it was before issue 14 (same rows, another plan)."""
    from pyspark.sql import Window as W
    from pyspark.sql import functions as F

    t = _transforms
    judged = t._between("created_at", start, end)
    if xmin is not None:
        judged = judged & (F.col("tx_id") < F.lit(xmin))
    msgs = outbox.select(
        "id",
        "topic",
        "key",
        "seq",
        F.col("status").alias("outbox_status"),
        "created_at",
        t._due().alias("due_at"),
        "published_at",
        judged.alias("judged"),
    ).select("*", F.posexplode_outer(t._expected(subscriptions)).alias("pos", "consumer"))
    msgs = msgs.select(
        *(c for c in msgs.columns if c != "pos"),
        F.coalesce(F.col("pos") == 0, F.lit(True)).alias("first"),
    )
    group = ("consumer", "topic", "key")
    w = (
        W.partitionBy(F.xxhash64(*group), *group)
        .orderBy("processed_at", "seq")
        .rowsBetween(W.unboundedPreceding, -1)
    )
    done = F.col("status") == "processed"
    ooo = F.coalesce(
        done & (F.col("seq") < F.max(F.when(done, F.col("seq"))).over(w)), F.lit(False)
    )
    ib = inbox.select(
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
        ooo.alias("i_out_of_order"),
    )
    joined = msgs.join(
        ib, (msgs["id"] == ib["i_id"]) & (msgs["consumer"] == ib["i_consumer"]), "full_outer"
    )
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
        "due_at",
        "published_at",
        "received_at",
        "processed_at",
        "inbox_attempts",
        "inbox_duplicates",
        "i_out_of_order",
    ).where((F.col("row") == "pair") | t._between("received_at", start, end))
    judged_pair = F.col("judged") & F.col("consumer").isNotNull()
    return rows.select(
        *(c for c in rows.columns if c != "i_out_of_order"),
        F.when(judged_pair, t._class(as_of - sla)).alias("class"),
        F.coalesce(judged_pair & (F.col("inbox_duplicates") > 0), F.lit(False)).alias("duplicate"),
        F.coalesce(judged_pair & F.col("i_out_of_order"), F.lit(False)).alias("out_of_order"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--name", default="reconcile_ab")
    args = parser.parse_args()
    _, urls, _ = _databases(args.messages, True)
    conf = {"spark.driver.memory": "8g", "spark.sql.shuffle.partitions": "16"}
    spark = spark_session(master="local[2]", extra_conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    full, _ = configs(urls)
    now = _transforms.reconcile_rows
    runs: dict[str, list[float]] = {"floor": [], "before": [], "now": []}
    counts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as out:
        reconcile(spark, full, out, record=False)  # warm-up
        for _ in range(args.repeat):
            for variant in ("floor", "before", "now"):
                _transforms.reconcile_rows = _rows_before if variant == "before" else now  # type: ignore[assignment]
                start = time.perf_counter()
                if variant == "floor":
                    _read_floor(spark, full)
                else:
                    counts[variant] = reconcile(spark, full, out, record=False).summary["counts"]
                runs[variant].append(round(time.perf_counter() - start, 2))
                print(variant, runs[variant][-1], flush=True)
        _transforms.reconcile_rows = now
    spark.stop()
    best = {k: min(v) for k, v in runs.items()}
    path = write_result(
        args.name,
        {
            "setup": "local[2], driver 8g, spark.sql.shuffle.partitions 16 (AQE), 2 JDBC "
            "partitions "
            "per source, alternating runs in one session after a warm-up run; 'before' = "
            "the job with reconcile_rows as before issue 14 (4 shuffles), 'now' = 3",
            "messages": args.messages,
            "runs_s": runs,
            "best_s": best,
            "ratio_over_floor_best": {
                k: round(best[k] / best["floor"], 2) for k in ("before", "now")
            },
            "speedup_now_over_before_best": round(best["before"] / best["now"], 2),
            "same_counts": counts.get("before") == counts.get("now"),
            "counts": counts.get("now"),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
