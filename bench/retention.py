"""Retention after millions of messages: table size and claim speed before and after.

    python bench/retention.py            # writes bench/results/retention.json
    BENCH_RETENTION_MESSAGES=3000000 python bench/retention.py   # ~6.5 min per million on 2 cores

1. ``BENCH_RETENTION_MESSAGES`` (default 1,000,000) messages over 1,000 keys pass through the
   outbox: committed in rounds of 200,000 and each round drained by a relay (no-op publisher,
   so the database does all the work: claim and mark, two row versions per message).
2. Measured: table and index sizes, dead tuples, the time of one claim (EXPLAIN ANALYZE,
   median of 5, rolled back) and the relay's claim + mark rate over a fresh 20,000-row backlog.
3. ``outbox retention --older-than 0`` (the real command, a subprocess) deletes the published
   rows while a producer keeps committing one message every 20 ms and a sampler records the
   longest open transaction of the retention process and the producer's commit latency.
4. The measurements again, after retention and after a plain VACUUM (autovacuum may be off).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result
from bench.relay_e2e import PAYLOAD, NoopPublisher, create_db, drop_db
from outbox import Message, publish, publish_batch
from relay import Relay, RelayConfig
from relay._statements import relay_statements

N = int(os.environ.get("BENCH_RETENTION_MESSAGES", "1000000"))
ROUND = 200_000
KEYS = 1000
BACKLOG = 20_000
OUTBOX = Path(sys.executable).with_name("outbox")


def fill(url: str, n: int, topic: str = "orders") -> None:
    with psycopg.connect(url) as conn:
        for start in range(0, n, 1000):
            msgs = [Message(topic, f"k{i % KEYS}", PAYLOAD) for i in range(start, start + 1000)]
            publish_batch(conn, msgs[: n - start], wakeup=False)
            conn.commit()


def _pending(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox_messages WHERE status = 'pending'"
        ).fetchone()
    return int(row[0]) if row else 0


async def _drain(url: str) -> float:
    """Run a relay (no-op publisher) until nothing is pending; seconds taken."""
    config = RelayConfig(database_url=url, poll_interval=0.05, heartbeat_interval=30.0)
    relay = Relay(config, NoopPublisher())
    started = time.perf_counter()
    task = asyncio.create_task(relay.run())
    while await asyncio.to_thread(_pending, url):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    took = time.perf_counter() - started
    relay.stop()
    await task
    return took


def drain(url: str) -> float:
    return asyncio.run(_drain(url))


def sizes(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE outbox_messages")
        row = conn.execute(
            """SELECT pg_total_relation_size('outbox_messages'),
                      pg_relation_size('outbox_messages'),
                      pg_indexes_size('outbox_messages'),
                      (SELECT count(*) FROM outbox_messages),
                      n_dead_tup
               FROM pg_stat_user_tables WHERE relname = 'outbox_messages'"""
        ).fetchone()
        indexes = conn.execute(
            """SELECT indexrelid::regclass::text, pg_relation_size(indexrelid)
               FROM pg_index WHERE indrelid = 'outbox_messages'::regclass ORDER BY 1"""
        ).fetchall()
    assert row is not None
    mib = 1024 * 1024
    return {
        "rows": row[3],
        "dead_tuples": row[4],
        "total_mib": round(row[0] / mib, 1),
        "heap_mib": round(row[1] / mib, 1),
        "indexes_mib": round(row[2] / mib, 1),
        "index_mib": {name: round(size / mib, 2) for name, size in indexes},
    }


def claim_ms(url: str) -> float:
    """Median execution time of one 500-row claim over the current backlog (rolled back)."""
    params = {
        "after_topic": "",
        "after_key": "",
        "limit": 500,
        "per_key": 100,
        "owner": "bench",
        "token": uuid.uuid4(),
        "lease_seconds": 30,
        "paused": [],
        **RelayConfig(database_url=url).dead_policy_params(),
    }
    times = []
    with psycopg.connect(url) as conn:
        for _ in range(5):
            plan = conn.execute(
                b"EXPLAIN (ANALYZE, FORMAT JSON) " + relay_statements(None).claim, params
            ).fetchone()
            conn.rollback()
            assert plan is not None
            times.append(float(plan[0][0]["Execution Time"]))
    return round(statistics.median(times), 2)


def claim_speed(url: str) -> dict[str, Any]:
    """A fresh backlog over KEYS keys: one claim's time, then the relay's drain rate."""
    fill(url, BACKLOG, topic="probe")
    one = claim_ms(url)
    took = drain(url)
    return {"claim_500_ms": one, "backlog": BACKLOG, "drain_msg_per_s": round(BACKLOG / took)}


def measure(url: str) -> dict[str, Any]:
    return {"table": sizes(url), "claim": claim_speed(url)}


class Probe:
    """While retention runs: its longest open transaction, and a producer's commit latency."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.longest_xact_ms = 0.0
        self.commit_ms: list[float] = []
        self._threads = [
            threading.Thread(target=self._sample),
            threading.Thread(target=self._produce),
        ]

    def __enter__(self) -> Probe:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join()

    def _sample(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(
                    """SELECT extract(epoch FROM max(clock_timestamp() - xact_start)) * 1000
                       FROM pg_stat_activity
                       WHERE datname = current_database() AND pid <> pg_backend_pid()
                         AND state <> 'idle' AND query LIKE '%%DELETE FROM%%'"""
                ).fetchone()
                if row and row[0] is not None:
                    self.longest_xact_ms = max(self.longest_xact_ms, float(row[0]))
                time.sleep(0.005)

    def _produce(self) -> None:
        with psycopg.connect(self.url) as conn:
            i = 0
            while not self.stop.is_set():
                began = time.perf_counter()
                publish(conn, topic="live", key=f"k{i % 10}", payload=PAYLOAD, wakeup=False)
                conn.commit()
                self.commit_ms.append((time.perf_counter() - began) * 1000)
                i += 1
                time.sleep(0.02)


def retention(url: str) -> dict[str, Any]:
    with Probe(url) as probe:
        began = time.perf_counter()
        out = subprocess.run(
            [str(OUTBOX), "retention", "--url", url, "--older-than", "0", "--batch", "1000"],
            capture_output=True,
            text=True,
            check=True,
        )
        took = time.perf_counter() - began
    deleted = int(out.stdout.split()[1])
    commits = sorted(probe.commit_ms)
    return {
        "command": "outbox retention --older-than 0 --batch 1000",
        "output": out.stdout.strip(),
        "deleted": deleted,
        "seconds": round(took, 1),
        "rows_per_s": round(deleted / took),
        "longest_retention_transaction_ms": round(probe.longest_xact_ms, 1),
        "concurrent_producer_commits": len(commits),
        "concurrent_commit_p50_ms": round(commits[len(commits) // 2], 2),
        "concurrent_commit_p99_ms": round(commits[int(len(commits) * 0.99)], 2),
        "concurrent_commit_max_ms": round(commits[-1], 2),
    }


def main() -> None:
    name, url = create_db()
    try:
        with psycopg.connect(url) as conn:
            row = conn.execute("SHOW autovacuum").fetchone()
        autovacuum = row[0] if row else None
        began = time.perf_counter()
        passed = 0
        while passed < N:
            size = min(ROUND, N - passed)
            fill(url, size)
            drain(url)
            passed += size
            print(f"{passed} messages passed through ({time.perf_counter() - began:.0f}s)")
        through = time.perf_counter() - began
        before = measure(url)
        print("before", before, flush=True)
        ret = retention(url)
        print("retention", ret, flush=True)
        after = measure(url)
        print("after retention", after, flush=True)
        with psycopg.connect(url, autocommit=True) as conn:
            vac_began = time.perf_counter()
            conn.execute("VACUUM outbox_messages")
            vacuum_s = time.perf_counter() - vac_began
        after_vacuum = measure(url)
        print("after vacuum", after_vacuum, flush=True)
    finally:
        drop_db(name)
    path = write_result(
        "retention",
        {
            "what": f"{N:,} messages over {KEYS} keys passed through the outbox (committed, "
            "claimed and marked by a relay with a no-op publisher), then `outbox retention`",
            "server_autovacuum": autovacuum,
            "pass_through_seconds": round(through, 1),
            "before_retention": before,
            "retention": ret,
            "after_retention": after,
            "vacuum_seconds": round(vacuum_s, 1),
            "after_retention_and_vacuum": after_vacuum,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
