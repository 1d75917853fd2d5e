"""(b) The database side of the relay: claim + mark rate with a no-op publisher, 1 vs 2 relays.

No broker is involved: this is the ceiling the database puts on any broker. Sized for 2 cores.
Run: python bench/relay_db.py   (needs PostgreSQL on 127.0.0.1:5432 or $OUTBOX_TEST_DATABASE_URL)
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import psycopg

# The repository root, not bench/: bench/relay.py would otherwise shadow the relay package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import write_result
from bench.relay_e2e import NoopPublisher, create_db, drop_db, rate_row
from outbox import Message, publish_batch
from relay import Relay, RelayConfig

N = int(os.environ.get("BENCH_MESSAGES", "20000"))


def _fill(url: str, keys: int) -> None:
    with psycopg.connect(url) as conn:
        for start in range(0, N, 1000):
            msgs = [
                Message(topic="bench", key=f"k{i % keys}", payload={"i": i})
                for i in range(start, min(N, start + 1000))
            ]
            publish_batch(conn, msgs, wakeup=False)
            conn.commit()


def _remaining(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox_messages WHERE status = 'pending'"
        ).fetchone()
    return int(row[0]) if row else 0


async def _drain(url: str, relays: int) -> float:
    pubs = [NoopPublisher() for _ in range(relays)]
    cfg = {
        "database_url": url,
        "batch_size": 500,
        "per_key_batch": 100,
        "max_in_flight": 2,
        "poll_interval": 0.05,
        "heartbeat_interval": 30.0,
    }
    rs = [Relay(RelayConfig(**cfg), p) for p in pubs]  # type: ignore[arg-type]
    started = time.perf_counter()
    tasks = [asyncio.create_task(r.run()) for r in rs]
    while sum(p.count for p in pubs) < N or await asyncio.to_thread(_remaining, url):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    took = time.perf_counter() - started
    for r in rs:
        r.stop()
    await asyncio.gather(*tasks)
    return took


def scenario(keys: int, relays: int) -> dict[str, float | int]:
    name, url = create_db()
    try:
        _fill(url, keys)
        took = asyncio.run(_drain(url, relays))
    finally:
        drop_db(name)
    return rate_row(N, keys, took, relays=relays)


def main() -> None:
    runs = [scenario(k, r) for k in (1000, 1) for r in (1, 2)]
    for run in runs:
        print(run)
    by = {(r["keys"], r["relays"]): r["msg_per_s"] for r in runs}
    write_result(
        "relay_db",
        {
            "what": "(b) claim + mark, no-op publisher (no broker), batch 500, per-key run 100",
            "note": "(c)-(e) with real brokers: bench/relay.py, results/relay.json",
            "runs": runs,
            "ratio_2_relays_vs_1_many_keys": round(by[(1000, 2)] / by[(1000, 1)], 2),
            "ratio_2_relays_vs_1_one_hot_key": round(by[(1, 2)] / by[(1, 1)], 2),
        },
    )


if __name__ == "__main__":
    main()
