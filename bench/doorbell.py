"""How soon after a producer's commit the doorbell wakes relays (commit -> NOTIFY arrival).

One producer on psycopg publishes one message per transaction and commits; a separate
connection LISTENs on the relays' channel and records when the notification arrives, against
the producer's clock right after ``commit()`` returns. Between transactions the producer idles
10 ms, so each transaction meets an idle doorbell (the common case at a trickle). Variants:

* ``sync_commit``: the default, the commit waits for the WAL flush;
* ``async_commit``: the producer's session has ``synchronous_commit = off``;
* ``open_5ms``: 5 ms of other work between ``publish`` and the commit.

Run: python bench/doorbell.py [--transactions N]   (writes bench/results/doorbell.json; the
server is $OUTBOX_TEST_DATABASE_URL, default postgresql://postgres@127.0.0.1:5432/postgres)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

# The repository root, not bench/: bench/relay.py would otherwise shadow the relay package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import write_result
from bench.relay_e2e import create_db, drop_db
from outbox import publish
from outbox._statements import WAKEUP_CHANNEL

VARIANTS = {
    "sync_commit": {"async": False, "open_s": 0.0},
    "async_commit": {"async": True, "open_s": 0.0},
    "open_5ms": {"async": False, "open_s": 0.005},
}


def measure(url: str, transactions: int, *, async_commit: bool, open_s: float) -> dict[str, Any]:
    """Commit -> NOTIFY arrival per transaction: median, p90, max in ms."""
    delays: list[float] = []
    missed = 0
    with (
        psycopg.connect(url, autocommit=True) as listener,
        psycopg.connect(url) as producer,
    ):
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(WAKEUP_CHANNEL)))
        if async_commit:
            producer.execute("SET synchronous_commit = off")
            producer.commit()
        for i in range(transactions + 20):  # the first 20 warm up (doorbell, statements)
            publish(producer, topic="bench", key=f"k{i % 10}", payload={"n": i})
            if open_s:
                time.sleep(open_s)  # the caller's own work inside the transaction
            producer.commit()
            committed = time.perf_counter()
            arrived = next(iter(listener.notifies(timeout=1.0, stop_after=1)), None)
            if arrived is None:
                missed += 1
            elif i >= 20:
                delays.append((time.perf_counter() - committed) * 1000)
            time.sleep(0.01)  # idle between transactions: the doorbell goes idle too
    delays.sort()
    return {
        "transactions": len(delays),
        "missed_within_1s": missed,
        "p50_ms": round(statistics.median(delays), 2),
        "p90_ms": round(delays[int(len(delays) * 0.9)], 2),
        "max_ms": round(delays[-1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=300)
    args = parser.parse_args()
    name, url = create_db()
    try:
        results = {
            variant: measure(url, args.transactions, async_commit=v["async"], open_s=v["open_s"])
            for variant, v in VARIANTS.items()
        }
    finally:
        drop_db(name)
    for variant, row in results.items():
        print(variant, row)
    path = write_result(
        "doorbell",
        {
            "what": "commit -> NOTIFY arrival, one psycopg producer, one message per "
            "transaction, 10 ms idle between transactions",
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
