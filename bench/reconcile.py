"""Reconciliation benchmark: JDBC read floor vs full reconciliation vs SQL in Postgres vs a night.

Seeds (INSERT ... SELECT generate_series) an outbox of N messages over 10 days and two inbox
databases (billing, shipping) with ~1% missing, ~0.5% duplicate deliveries and ~0.5% phantoms
each; then, side by side in one run:

  (a) read   : the job's own JDBC reads (same rows, columns, partitions), every column fetched
               and hashed, in one Spark job (the I/O floor)
  (b) full   : the whole reconciliation of the 10 days (reads, classify, outputs, run row)
  (c) sql    : the same left/anti-join classification in SQL inside Postgres, on co-located
               copies of the inbox tables (for reference; real inboxes live in other databases)
  (d) night  : the reconciliation of the last day only (1 day of 10)
  (e) core   : only what every reconciliation of these semantics must do, with the job's own
               reads and transforms: the out-of-order window over the inbox rows and the full
               outer join with the expected pairs, counted per class (no latency histograms,
               details, phantom confirmation or outputs): a reference for what (b) adds

Usage: python bench/reconcile.py [--sizes 1000000,10000000] [--reuse] [--drop]
                                 [--event-log DIR] [--name reconcile]
Sized for 2 cores / 24 GiB: local[2], 2 JDBC partitions per source.

--reuse keeps the seeded databases (bench_rec_<n>, _b, _s) and seeds a size only once, so that
iterations on the job do not pay the seed again; --drop drops them at the end. --event-log
writes Spark's event log there (summarise it with bench/spark_events.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from common import write_result

from outbox._migrate import upgrade
from spark_ingest import JobConfig, Source, Window, reconcile, spark_session
from spark_ingest._job import classified_rows, read_sources
from spark_ingest._transforms import co_partitioned

ADMIN = os.environ.get("OUTBOX_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DAYS = 10

_OUTBOX = """
INSERT INTO outbox_messages (id, topic, key, seq, payload, created_at, available_at, status,
                             published_at, attempts, tx_id)
SELECT md5('m' || g)::uuid, 'orders', 'k' || (g %% 10000), g / 10000 + 1, '\\x7b226e223a317d',
       ts, ts, CASE WHEN g %% 1000 = 7 THEN 'dead' ELSE 'published' END,
       ts + (20 + g %% 61) * interval '1 millisecond', 1, '3'::xid8
  FROM generate_series(1, %(n)s) AS g,
       LATERAL (SELECT %(t0)s::timestamptz + (g::float8 / %(n)s) * interval '10 days') AS t(ts)
"""
# ~1% missing (g % 100 = c), ~0.5% duplicate deliveries (delivered again after being processed:
# attempts 2, duplicates 1), ~0.5% phantoms. Latencies
# vary (publish 20-80 ms, process to 400 ms) so the histograms have thousands of buckets to fill.
_INBOX = """
INSERT INTO inbox_messages (consumer, message_id, topic, key, seq, received_at, processed_at,
                            attempts, duplicates, status)
SELECT %(consumer)s, md5('m' || g)::uuid, 'orders', 'k' || (g %% 10000), g / 10000 + 1,
       ts + (100 + g %% 43 * 7) * interval '1 millisecond',
       ts + (100 + g %% 43 * 7 + g %% 11) * interval '1 millisecond',
       CASE WHEN g %% 200 = 3 THEN 2 ELSE 1 END, CASE WHEN g %% 200 = 3 THEN 1 ELSE 0 END,
       'processed'
  FROM generate_series(1, %(n)s) AS g,
       LATERAL (SELECT %(t0)s::timestamptz + (g::float8 / %(n)s) * interval '10 days') AS t(ts)
 WHERE g %% 100 <> %(skip)s
UNION ALL
SELECT %(consumer)s, md5('x' || %(consumer)s || g)::uuid, 'orders', 'ghost', 1,
       ts, ts, 1, 0, 'processed'
  FROM generate_series(1, %(n)s / 200) AS g,
       LATERAL (SELECT %(t0)s::timestamptz + (g::float8 / (%(n)s / 200)) * interval '10 days')
               AS t(ts)
"""
# (c) the same classification inside Postgres, on co-located inbox copies.
_SQL_CLASSIFY = """
WITH subs(topic, consumer) AS (VALUES ('orders', 'billing'), ('orders', 'shipping')),
pairs AS (
  SELECT o.id, s.consumer, o.status AS ob, i.status AS ib, i.duplicates
    FROM outbox_messages o JOIN subs s USING (topic)
    LEFT JOIN inbox_messages i ON i.consumer = s.consumer AND i.message_id = o.id
   WHERE o.created_at >= %(lo)s AND o.created_at < %(hi)s
)
SELECT CASE WHEN ib = 'processed' THEN 'delivered' WHEN ib = 'dead' OR ob = 'dead' THEN 'dead'
            WHEN ob = 'pending' THEN 'stuck' ELSE 'lost' END AS class,
       count(*), count(*) FILTER (WHERE duplicates > 0)
  FROM pairs GROUP BY 1
UNION ALL
SELECT 'phantom', count(*), 0 FROM inbox_messages i
 WHERE i.received_at >= %(lo)s AND i.received_at < %(hi)s
   AND NOT EXISTS (SELECT 1 FROM outbox_messages o WHERE o.id = i.message_id)
"""


def _db(name: str) -> str:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN.rsplit("/", 1)[0] + "/" + name
    upgrade(url)
    return url


def _drop(name: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _seed(n: int, outbox: str, inboxes: dict[str, str]) -> float:
    start = time.perf_counter()
    params = {"n": n, "t0": T0}
    # One statement per connection, two at a time (one backend per core).
    jobs = [(outbox, _OUTBOX, params)]
    for skip, (consumer, url) in enumerate(inboxes.items(), 1):
        inbox = params | {"consumer": consumer, "skip": skip}
        jobs += [(url, _INBOX, inbox), (outbox, _INBOX, inbox)]  # + co-located copy for (c)

    def run(job: tuple[str, str, dict[str, Any]]) -> None:
        with psycopg.connect(job[0]) as conn:
            conn.execute(job[1], job[2])

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(run, jobs))
    for url in (outbox, *inboxes.values()):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - start


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _read_floor(spark: Any, config: JobConfig) -> int:
    """The job's own reads (``read_sources``: the same rows, columns and JDBC partitions), in one
    Spark job as the main pass reads them, every column fetched and hashed."""
    from pyspark.sql import functions as F

    reads = read_sources(spark, config)
    hashed = [df.select(F.hash(*df.columns).alias("h")) for df in (reads.outbox, reads.inbox)]
    row = hashed[0].unionByName(hashed[1]).select(F.count(F.lit(1)), F.sum("h")).collect()[0]
    return int(row[0])


def _core(spark: Any, config: JobConfig) -> int:
    """(e): the job's classified rows on its own reads, counted per row kind, class and flags."""
    with co_partitioned(spark):  # as reconcile plans it
        rows = classified_rows(config, read_sources(spark, config))
        counts = rows.groupBy("row", "class", "duplicate", "out_of_order").count().collect()
    return sum(int(r["count"]) for r in counts)


def _shuffles(spark: Any, config: JobConfig) -> int:
    """Shuffles (Exchange nodes) in the physical plan of the job's main pass: the classified
    rows counted by ``outcome_groups``, as ``reconcile`` runs them (planned, not executed)."""
    from spark_ingest._job import LATENCY_BUCKETS
    from spark_ingest._outcomes import outcome_groups

    with co_partitioned(spark):
        rows = classified_rows(config, read_sources(spark, config))
        plan = str(outcome_groups(rows, LATENCY_BUCKETS)._jdf.queryExecution().executedPlan())
    return sum(1 for line in plan.splitlines() if "Exchange " in line)


def _exists(name: str) -> bool:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return row is not None


def _databases(n: int, reuse: bool) -> tuple[dict[str, str], dict[str, str], float | None]:
    """Names, URLs and the seed time (None: reused) of the outbox and the two inbox databases."""
    tag = f"v3n{n}" if reuse else uuid.uuid4().hex[:6]
    names = {"outbox": f"bench_rec_{tag}", "billing": f"bench_rec_{tag}_b",
             "shipping": f"bench_rec_{tag}_s"}  # fmt: skip
    url = ADMIN.rsplit("/", 1)[0] + "/"
    # The marker is the last database seeded: if it exists, the seed completed.
    if reuse and all(_exists(v) for v in names.values()) and _exists(names["outbox"] + "_ok"):
        return names, {k: url + v for k, v in names.items()}, None
    for name in (*names.values(), names["outbox"] + "_ok"):
        _drop(name)
    urls = {k: _db(v) for k, v in names.items()}
    seed_s = _seed(n, urls["outbox"], {"billing": urls["billing"], "shipping": urls["shipping"]})
    if reuse:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{names["outbox"]}_ok"')
    return names, urls, seed_s


def configs(urls: dict[str, str]) -> tuple[JobConfig, JobConfig]:
    """The full reconcile of the seeded window and the nightly one (its last day)."""
    full = JobConfig(
        outbox=Source("outbox", urls["outbox"]),
        inboxes=(Source("billing", urls["billing"]), Source("shipping", urls["shipping"])),
        subscriptions={"orders": ("billing", "shipping")},
        window=Window(T0, T0 + dt.timedelta(days=DAYS)),
        partitions=2,
    )
    last_day = Window(T0 + dt.timedelta(days=DAYS - 1), T0 + dt.timedelta(days=DAYS))
    return full, JobConfig(**{**full.__dict__, "window": last_day})


def run_size(spark: Any, n: int, out: Path, *, reuse: bool = False) -> dict[str, Any]:
    names, urls, seed_s = _databases(n, reuse)
    try:
        full, night = configs(urls)
        shuffles = _shuffles(spark, full)
        read_s, rows = _timed(lambda: _read_floor(spark, full))
        full_s, result = _timed(lambda: reconcile(spark, full, out))
        core_s, _ = _timed(lambda: _core(spark, full))
        night_s, night_result = _timed(lambda: reconcile(spark, night, out))
        with psycopg.connect(urls["outbox"]) as conn:
            sql_s, sql_rows = _timed(lambda: conn.execute(_SQL_CLASSIFY, {
                "lo": full.window.start, "hi": full.window.end}).fetchall())  # fmt: skip
        counts = result.summary["counts"]
        return {
            "messages": n,
            "rows_read": rows,
            "main_pass_shuffles": shuffles,
            "seed_s": None if seed_s is None else round(seed_s, 1),
            "a_read_floor_s": round(read_s, 2),
            "b_full_reconcile_s": round(full_s, 2),
            "c_sql_in_postgres_s": round(sql_s, 2),
            "d_night_1_of_10_s": round(night_s, 2),
            "e_core_window_join_count_s": round(core_s, 2),
            "ratio_full_over_read": round(full_s / read_s, 2),
            "ratio_night_over_full": round(night_s / full_s, 3),
            "ratio_full_over_sql": round(full_s / sql_s, 2),
            "ratio_core_over_read": round(core_s / read_s, 2),
            "rows_per_s_full": round(rows / full_s),
            "counts": {
                k: counts[k]
                for k in (
                    "pairs",
                    "delivered",
                    "lost",
                    "dead",
                    "phantom",
                    "duplicate",
                    "out_of_order",
                )
            },
            "night_counts": {k: night_result.summary["counts"][k] for k in ("pairs", "lost")},
            "sql_counts": {r[0]: [r[1], r[2]] for r in sql_rows},
        }
    finally:
        if not reuse:
            for name in names.values():
                _drop(name)


def _write(name: str, session_s: float, results: list[dict[str, Any]]) -> Path:
    done = [r for r in results if "error" not in r]
    linear = None
    if len(done) >= 2:
        a, b = done[0], done[-1]
        linear = round((b["b_full_reconcile_s"] / a["b_full_reconcile_s"])
                       / (b["messages"] / a["messages"]), 2)  # fmt: skip
    return write_result(name, {
        "setup": "local[2], driver 8g, spark.sql.shuffle.partitions 16 (AQE coalesces), 2 JDBC "
                 "partitions per source, PostgreSQL on the same 2-core box; two consumers in two "
                 "inbox databases; window = 10 days, night = last day; latencies vary "
                 "(publish 20-80 ms, process up to 400 ms)",
        "spark_session_start_s": round(session_s, 1),
        "sizes": results,
        "linearity_full_cost_per_message_ratio_largest_over_smallest": linear,
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--reuse", action="store_true", help="keep seeded databases")
    parser.add_argument("--drop", action="store_true", help="drop kept databases at the end")
    parser.add_argument("--event-log", help="directory for Spark's event log")
    parser.add_argument("--name", default="reconcile", help="results file bench/results/NAME")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    start = time.perf_counter()
    conf = {"spark.driver.memory": "8g", "spark.sql.shuffle.partitions": "16"}
    if args.event_log:
        Path(args.event_log).mkdir(parents=True, exist_ok=True)
        conf |= {"spark.eventLog.enabled": "true", "spark.eventLog.dir": args.event_log,
                 "spark.eventLog.compress": "false"}  # fmt: skip
    spark = spark_session(master="local[2]", extra_conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - start
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-reconcile-") as out:
        # Warm the JVM (JIT, JDBC classes) on 200k messages so the first size is not penalised
        # (a cold first run at 1M took twice as long as the next ones).
        run_size(spark, 200_000, Path(out))
        for n in sizes:
            try:
                results.append(run_size(spark, n, Path(out), reuse=args.reuse))
            except Exception as exc:  # a size that does not fit is a result too
                results.append({"messages": n, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            print(results[-1], flush=True)
            _write(args.name, session_s, results)
    spark.stop()
    if args.drop:
        for n in sizes:
            for suffix in ("", "_b", "_s", "_ok"):
                _drop(f"bench_rec_v3n{n}{suffix}")
    print(f"wrote {_write(args.name, session_s, results)}")


if __name__ == "__main__":
    main()
