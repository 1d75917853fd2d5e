"""What does writing one outbox message cost a business transaction, in each capture mode?

Side by side in one run, through the same client stack (psycopg 3, one connection per client
thread), on a private PostgreSQL cluster with wal_level = logical and the server's default
durability (fsync on, synchronous_commit on), started by this script (bench/common.py), at 1,
4 and 16 clients:

* ``baseline``: INSERT one ~300-byte business row, COMMIT.
* ``naive``: the same plus a naive outbox: one plain INSERT of one row (id, topic, key,
  payload, created_at) into a table with a primary key and nothing else (the id a client-made
  UUIDv7, the payload jsonb, created_at DEFAULT now()): no per-key sequence, no idempotency,
  no wake-up. The reference the issue's targets are stated against.
* ``polling`` / ``wal``: the business row plus ``publish(...)`` with its defaults, in a
  database in 'polling' mode and one in 'wal' mode (a slot of its own). The writer does the
  same in both (one row of the ledger, outbox_wal_pending); no relay runs, so the ledger rows
  stay, as the naive table's do, and the slot keeps the WAL.
* ``sql_polling`` / ``sql_wal``: the same through the SQL function ``outbox_publish(...)``.
* ``sql_floor``: the same call to a PL/pgSQL function of the same signature that only inserts
  one ledger row (no rule, no UUIDv7, no record): the least any PL/pgSQL writer costs, so the
  room ``outbox_publish`` has is measured in the same run.

Variants are interleaved in rounds (every other round in reverse order) so drift on a shared
machine hits all of them alike. A ratio is the median over the rounds of each round's ratio
(the variant against the naive outbox of the same round); the medians of transactions per
second are reported too, with every round's figure and the load average of the machine, and
what bounds them: per variant, the client process's CPU per transaction and in cores (its
client threads share one GIL) and the machine's busy cores (the server's backends and the
client share them), medians over the rounds.
Run: ``python bench/write_overhead.py [--seconds S] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import make_url

_HERE = Path(__file__).resolve().parent
# bench/relay.py would shadow the relay package: import it before bench/ joins sys.path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
from outbox import publish  # noqa: E402
from outbox._ids import new_message_id  # noqa: E402
from outbox._migrate import upgrade  # noqa: E402
from relay._admin import enable_capture  # noqa: E402

sys.path.insert(0, str(_HERE))
from common import logical_cluster, write_result  # noqa: E402

ROW = "x" * 260  # with the other columns, about 300 bytes per business row
Txn = Callable[[psycopg.Connection[Any], random.Random], None]


#: a PL/pgSQL function of outbox_publish's signature that only inserts one ledger row: no rule,
#: no UUIDv7, no record (what any PL/pgSQL writer costs at least; bench/write_floor.py too)
FLOOR = "bench_plpgsql_floor"
FLOOR_SQL = f"""
CREATE FUNCTION {FLOOR}(topic text, key text, payload jsonb, headers jsonb DEFAULT '{{}}',
    idempotency_key text DEFAULT NULL, deliver_after interval DEFAULT NULL,
    traceparent text DEFAULT NULL, max_payload_bytes integer DEFAULT 1048576,
    wakeup boolean DEFAULT false) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $body$
DECLARE
    v_id uuid := gen_random_uuid();
BEGIN
    INSERT INTO outbox_wal_pending (id, record) VALUES (v_id, convert_to(payload::text, 'UTF8'));
    RETURN v_id;
END
$body$
"""


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


def _naive_insert(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    order_id = _business(conn, rnd)
    conn.execute(
        "INSERT INTO bench_naive_outbox (id, topic, key, payload) VALUES (%s, %s, %s, %s)",
        [
            new_message_id(),
            "orders",
            order_id,
            json.dumps({"order_id": order_id, "total": "12.50"}),
        ],
    )


def naive(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    _naive_insert(conn, rnd)
    conn.commit()


def with_sql_function(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    order_id = _business(conn, rnd)
    conn.execute(
        "SELECT outbox_publish('orders', %s, %s::jsonb, headers => %s::jsonb)",
        [
            order_id,
            json.dumps({"order_id": order_id, "total": "12.50"}),
            '{"type": "OrderCreated"}',
        ],
    )
    conn.commit()


def with_plpgsql_floor(conn: psycopg.Connection[Any], rnd: random.Random) -> None:
    order_id = _business(conn, rnd)
    conn.execute(
        f"SELECT {FLOOR}('orders', %s, %s::jsonb, headers => %s::jsonb)",
        [
            order_id,
            json.dumps({"order_id": order_id, "total": "12.50"}),
            '{"type": "OrderCreated"}',
        ],
    )
    conn.commit()


def _machine_busy() -> tuple[float, float]:
    """Busy and total CPU time of the whole machine so far, in clock ticks (/proc/stat)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


@dataclass(frozen=True)
class Sample:
    """One measurement: transactions per second, and where the CPU went meanwhile."""

    tps: float
    #: this (client) process's CPU per transaction, microseconds: its threads share one GIL
    client_cpu_us_per_tx: float
    #: the client process's CPU in cores (1.0: one core all along)
    client_cores: float
    #: the machine's busy CPU in cores (the server's backends, the client, anything else)
    machine_cores: float


def run_measured(url: str, txn: Txn, clients: int, seconds: float) -> Sample:
    """``clients`` threads run ``txn`` for ``seconds``: transactions per second, with the CPU
    the client process and the whole machine used meanwhile (what bounds the figure)."""
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
    t0, cpu0, (busy0, total0) = time.perf_counter(), time.process_time(), _machine_busy()
    time.sleep(seconds)  # the measurement window itself, not synchronization
    stop.set()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    busy1, total1 = _machine_busy()
    for t in threads:
        t.join()
    done = sum(counts)
    cores = os.cpu_count() or 1
    return Sample(
        tps=done / elapsed,
        client_cpu_us_per_tx=cpu / max(done, 1) * 1e6,
        client_cores=cpu / elapsed,
        machine_cores=(busy1 - busy0) / max(total1 - total0, 1.0) * cores,
    )


def run(url: str, txn: Txn, clients: int, seconds: float) -> float:
    """Transactions per second of ``clients`` threads running ``txn`` for ``seconds``."""
    return run_measured(url, txn, clients, seconds).tps


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
            "CREATE TABLE bench_naive_outbox (id uuid PRIMARY KEY, topic text NOT NULL, "
            "key text NOT NULL, payload jsonb NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(FLOOR_SQL)
        conn.commit()
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    with logical_cluster("outbox-write-overhead-") as server:
        polling = _with_db(server.admin_url, prepare_database(server.admin_url))
        wal = _with_db(server.admin_url, prepare_database(server.admin_url))
        enable_capture(wal)
        variants: dict[str, tuple[str, Txn]] = {
            "baseline": (polling, baseline),
            "naive": (polling, naive),
            "polling": (polling, with_outbox),
            "wal": (wal, with_outbox),
            "sql_polling": (polling, with_sql_function),
            "sql_wal": (wal, with_sql_function),
            "sql_floor": (polling, with_plpgsql_floor),
        }
        results: dict[str, Any] = {}
        for clients in (1, 4, 16):
            samples: dict[str, list[float]] = {v: [] for v in variants}
            cpu: dict[str, list[Sample]] = {v: [] for v in variants}
            names = list(variants)
            for r in range(args.rounds):
                # every other round in reverse order: no variant always follows the same one
                for vname in names if r % 2 == 0 else names[::-1]:
                    url, txn = variants[vname]
                    sample = run_measured(url, txn, clients, args.seconds)
                    samples[vname].append(sample.tps)
                    cpu[vname].append(sample)
            tps = {v: statistics.median(s) for v, s in samples.items()}
            compared = ("polling", "wal", "sql_polling", "sql_wal", "sql_floor")
            # The ratio of each round (the variant against the naive outbox of the same round,
            # seconds apart), then the median of the rounds: drift between rounds on a shared
            # machine cancels out of each ratio.
            naive_tps = samples["naive"]
            paired = {
                v: statistics.median(a / b for a, b in zip(samples[v], naive_tps, strict=True))
                for v in compared
            }
            results[f"clients_{clients}"] = {
                "tps": {v: round(x, 1) for v, x in tps.items()},
                "samples": {v: [round(x, 1) for x in s] for v, s in samples.items()},
                # what bounds the figure: the client process's threads share one GIL, and
                # the server's backends and the client share the machine's cores
                "client_cpu_us_per_tx_median": {
                    v: round(statistics.median(s.client_cpu_us_per_tx for s in c), 1)
                    for v, c in cpu.items()
                },
                "client_cores_median": {
                    v: round(statistics.median(s.client_cores for s in c), 2)
                    for v, c in cpu.items()
                },
                "machine_cores_busy_median": {
                    v: round(statistics.median(s.machine_cores for s in c), 2)
                    for v, c in cpu.items()
                },
                **{f"ratio_{v}_vs_naive": round(paired[v], 3) for v in compared},
                "ratio_naive_vs_baseline": round(
                    statistics.median(
                        a / b for a, b in zip(samples["naive"], samples["baseline"], strict=True)
                    ),
                    3,
                ),
            }
            print(clients, results[f"clients_{clients}"]["tps"], flush=True)
        with psycopg.connect(server.admin_url) as conn:
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', "
                    "'synchronous_commit', 'server_version', 'shared_buffers', 'wal_level')"
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
            "target": "publish() >= 0.95x naive at 1/4/16 clients in 'wal' mode (recommended), "
            ">= 0.90x in 'polling' mode; outbox_publish() alike (sql_floor: a PL/pgSQL function "
            "that only inserts one row, the floor of any PL/pgSQL writer)",
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
