"""Consumer transaction throughput with and without the inbox, side by side, in one run.

Each consumer thread runs transactions of: [receive(...)] + one UPDATE of a business row, then
COMMIT, on its own psycopg connection, for a fixed time. Measured at 1 and 8 concurrent
consumers; the two variants alternate (twice each) so drift affects both alike.
The end-to-end pipeline (outbox -> relay -> NATS -> consumer) needs the relay, built in
another branch: not measured here.

Run: python bench/inbox.py [--url postgresql://postgres@127.0.0.1:5432/postgres] [--seconds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import make_url

# This file is named like the package it measures: take the script's folder off sys.path so
# `import inbox` finds the package, and load bench/common.py by path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from inbox import receive  # noqa: E402
from outbox._migrate import upgrade  # noqa: E402
from outbox.envelope import Envelope  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_common", _HERE / "common.py")
assert _spec is not None
assert _spec.loader is not None
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
write_result = _common.write_result

ROWS_PER_CONSUMER = 100


def _worker(url: str, worker: int, with_inbox: bool, stop: threading.Event, out: list[int]) -> None:
    done = 0
    with psycopg.connect(url) as conn:
        while not stop.is_set():
            row = worker * ROWS_PER_CONSUMER + done % ROWS_PER_CONSUMER
            if with_inbox:
                msg = Envelope(uuid.uuid4(), "bench", f"k{row}", done + 1, b"{}")
                if not receive(conn, consumer="bench", message=msg):
                    raise AssertionError("a fresh id was taken for a duplicate")
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (row,))
            conn.commit()
            done += 1
    out.append(done)


def _run(url: str, consumers: int, with_inbox: bool, seconds: float) -> float:
    stop, out = threading.Event(), []
    threads = [
        threading.Thread(target=_worker, args=(url, w, with_inbox, stop, out))
        for w in range(consumers)
    ]
    for t in threads:
        t.start()
    time.sleep(seconds)  # the measurement window itself
    stop.set()
    for t in threads:
        t.join()
    return sum(out) / seconds


def _database(admin_url: str) -> tuple[str, str]:
    name = f"outbox_bench_inbox_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        conn.execute(
            "INSERT INTO accounts SELECT g, 0 FROM generate_series(0, %s) g",
            (8 * ROWS_PER_CONSUMER,),
        )
    return name, url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    name, url = _database(args.url)
    results: dict[str, Any] = {}
    try:
        for consumers in (1, 8):
            runs: dict[str, list[float]] = {"without_inbox": [], "with_inbox": []}
            for _ in range(2):
                for variant in ("without_inbox", "with_inbox"):
                    tps = _run(url, consumers, variant == "with_inbox", args.seconds)
                    runs[variant].append(tps)
            without = sum(runs["without_inbox"]) / 2
            with_ = sum(runs["with_inbox"]) / 2
            results[f"{consumers}_consumers"] = {
                "without_inbox_tx_per_s": round(without, 1),
                "with_inbox_tx_per_s": round(with_, 1),
                "ratio_with_over_without": round(with_ / without, 3),
                "runs": runs,
            }
            print(consumers, results[f"{consumers}_consumers"])
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    path = write_result(
        "inbox",
        {
            "what": "consumer transaction: [inbox receive +] one UPDATE of a business row, commit",
            "seconds_per_run": args.seconds,
            "runs_per_variant": 2,
            "target": "with_inbox >= 0.85 x without_inbox",
            "not_measured": "end-to-end outbox -> relay -> NATS -> consumer (needs the relay)",
            "results": results,
        },
    )
    print(path)


if __name__ == "__main__":
    main()
