"""What does writing one outbox message cost a business transaction?

Side by side in one run, through the same client stack (psycopg 3, one connection per client
thread, the machine's PostgreSQL with its default durability settings), at 1, 4 and 16 clients:

* ``baseline``: INSERT one ~300-byte business row, COMMIT.
* ``outbox``: the same plus ``publish(...)`` with its defaults (no wake-up from the writer: a
  polling relay's commit watch sees the commit; no relay runs here).
* ``outbox_doorbell``: ``publish(..., wakeup=True)``: the opt-in doorbell, and what it costs.
* ``naive``: a naive outbox for reference: one plain INSERT into a bigserial table (no per-key
  sequence, no idempotency, no wake-up).
* ``naive_notify``: the naive insert plus ``pg_notify`` inside the business transaction, as
  naive outboxes do: every commit then takes PostgreSQL's cluster-wide notify lock.

Variants are interleaved in rounds so drift on a shared machine hits all of them alike; the
median round is reported. Also: the per-key sequence under contention, 16 writers on 1 key vs
1000 keys. Run: ``python bench/write_overhead.py [--url URL] [--seconds S] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).parent))
from common import write_result

from outbox import publish
from outbox._migrate import upgrade

ROW = "x" * 260  # with the other columns, about 300 bytes per business row
Txn = Callable[[psycopg.Connection[Any], random.Random], None]


def _business(conn: psycopg.Connection[Any], rnd: random.Random) -> str:
    order_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO bench_orders (id, customer, total, notes) VALUES (%s, %s, %s, %s)",
        [order_id, f"customer-{rnd.randrange(10_000)}", "12.50", ROW],
    )
    return order_id


def baseline(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    _business(conn, rnd)
    conn.commit()


def _order_with_message(conn: psycopg.Connection[Any], rnd: random.Random, wakeup: bool) -> None:
    order_id = _business(conn, rnd)
    payload = {"order_id": order_id, "total": "12.50"}
    headers = {"type": "OrderCreated"}
    publish(conn, topic="orders", key=order_id, payload=payload, headers=headers, wakeup=wakeup)


def with_outbox(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    _order_with_message(conn, rnd, wakeup=False)
    conn.commit()


def with_outbox_doorbell(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    _order_with_message(conn, rnd, wakeup=True)
    conn.commit()


def _naive_insert(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    order_id = _business(conn, rnd)
    conn.execute(
        "INSERT INTO bench_naive_outbox (topic, key, payload) VALUES (%s, %s, %s)",
        ["orders", order_id, json.dumps({"order_id": order_id, "total": "12.50"})],
    )


def naive(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    _naive_insert(conn, rnd)
    conn.commit()


def naive_notify(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    _naive_insert(conn, rnd)
    conn.execute("SELECT pg_notify('outbox_wakeup_v1', '')")  # inside the business transaction
    conn.commit()


def keyed(keys: int) -> Txn:
    def txn(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
        publish(
            conn, topic="contention", key=f"k{rnd.randrange(keys)}", payload={"n": 1}, wakeup=False
        )
        conn.commit()

    return txn


def run(url: str, txn: Txn, clients: int, seconds: float) -> float:
    """Transactions per second of ``clients`` threads running ``txn`` for ``seconds``."""
    counts = [0] * clients
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client(i: int) -> None:
        rnd = random.Random(i)
        with psycopg.connect(url) as conn:
            for _ in range(20):  # warm up: prepared statements, caches
                txn(conn, rnd)
            start.wait()
            n = 0
            while not stop.is_set():
                txn(conn, rnd)
                n += 1
            counts[i] = n

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)  # the measurement window itself, not synchronization
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def _with_db(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def prepare_database(admin_url: str) -> str:
    name = f"outbox_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _with_db(admin_url, name)
    upgrade(url)
    with psycopg.connect(url) as conn:
        conn.execute(
            "CREATE TABLE bench_orders (id uuid PRIMARY KEY, customer text NOT NULL, "
            "total numeric NOT NULL, notes text NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(
            "CREATE TABLE bench_naive_outbox (id bigserial PRIMARY KEY, topic text NOT NULL, "
            "key text NOT NULL, payload jsonb NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.commit()
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    name = prepare_database(args.url)
    url = _with_db(args.url, name)
    variants: dict[str, Txn] = {
        "baseline": baseline,
        "outbox": with_outbox,
        "outbox_doorbell": with_outbox_doorbell,
        "naive": naive,
        "naive_notify": naive_notify,
    }
    results: dict[str, Any] = {}
    try:
        for clients in (1, 4, 16):
            samples: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(args.rounds):
                for vname, txn in variants.items():
                    samples[vname].append(run(url, txn, clients, args.seconds))
            tps = {v: statistics.median(s) for v, s in samples.items()}
            results[f"clients_{clients}"] = {
                "tps": {v: round(x, 1) for v, x in tps.items()},
                "samples": {v: [round(x, 1) for x in s] for v, s in samples.items()},
                "ratio_outbox_vs_baseline": round(tps["outbox"] / tps["baseline"], 3),
                "ratio_outbox_doorbell_vs_baseline": round(
                    tps["outbox_doorbell"] / tps["baseline"], 3
                ),
                "ratio_naive_vs_baseline": round(tps["naive"] / tps["baseline"], 3),
                "ratio_naive_notify_vs_baseline": round(tps["naive_notify"] / tps["baseline"], 3),
                "ratio_outbox_vs_naive": round(tps["outbox"] / tps["naive"], 3),
            }
            print(
                clients,
                results[f"clients_{clients}"]["tps"],
                results[f"clients_{clients}"]["ratio_outbox_vs_baseline"],
                flush=True,
            )
        one = statistics.median(run(url, keyed(1), 16, args.seconds) for _ in range(args.rounds))
        many = statistics.median(
            run(url, keyed(1000), 16, args.seconds) for _ in range(args.rounds)
        )
        results["sequence_contention_16_writers"] = {
            "tps_1_key": round(one, 1),
            "tps_1000_keys": round(many, 1),
            "ratio_1_key_vs_1000_keys": round(one / many, 3),
        }
        print(results["sequence_contention_16_writers"], flush=True)
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    with psycopg.connect(args.url) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'server_version', 'shared_buffers', 'wal_level')"
            ).fetchall()
        )
    path = write_result(
        "write_overhead",
        {
            "config": {
                "seconds_per_sample": args.seconds,
                "rounds": args.rounds,
                "postgres": settings,
            },
            "target": "outbox >= 0.85x baseline at 16 clients",
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
