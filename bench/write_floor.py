"""The server's floor of the polling write path: the same transactions as
bench/write_overhead.py, driven by pgbench (a C client) instead of Python, so the client costs
next to nothing and what is left is the server's work.

Side by side in one run, on the machine's PostgreSQL, at 1, 4 and 16 clients, in rounds:

* ``baseline``: BEGIN, INSERT one ~300-byte business row, COMMIT;
* ``naive``: the same plus one plain INSERT into a bigserial outbox table;
* ``polling``: the same plus the statement ``publish()`` runs in 'polling' mode for one message
  (outbox/_statements.py, outbox_messages_insert_one: the per-key counter row, the message row,
  the write counter), with a new key per transaction, as in write_overhead.

Reported: transactions per second (medians) and polling / naive. A ratio below 1 here is the
design's own cost on the server, whatever the client.
Run: ``python bench/write_floor.py [--url URL] [--seconds S] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).parent))
from common import write_result
from write_overhead import _with_db, prepare_database

from outbox._statements import producer_statements

_BUSINESS = (
    "INSERT INTO bench_orders (id, customer, total, notes) VALUES "
    "(gen_random_uuid(), 'customer-' || (random() * 10000)::int, 12.50, repeat('x', 260));"
)
_NAIVE = (
    "INSERT INTO bench_naive_outbox (topic, key, payload) VALUES "
    "('orders', md5(:k::text), '{\"order_id\": \"x\", \"total\": \"12.50\"}');"
)


def _polling() -> str:
    """outbox_messages_insert_one with pgbench variables for its parameters, on one line."""
    text = producer_statements(None).insert_one.decode()
    values = {
        "id": "gen_random_uuid()",
        "topic": "'orders'",
        "key": "md5(:k::text)",
        "headers": "'{\"type\": \"OrderCreated\"}'",
        "payload": "convert_to('{\"order_id\": \"x\", \"total\": \"12.50\"}', 'UTF8')",
        "content_type": "'application/json'",
        "traceparent": "NULL",
        "available_at": "NULL",
    }
    text = re.sub(r"%\((\w+)\)s", lambda m: values[m.group(1)], text)
    return " ".join(text.split()) + ";"


def _script(*statements: str) -> str:
    return "\n".join(["\\set k random(1, 2000000000)", "BEGIN;", *statements, "COMMIT;", ""])


SCRIPTS = {
    "baseline": _script(_BUSINESS),
    "naive": _script(_BUSINESS, _NAIVE),
    "polling": _script(_BUSINESS, _polling()),
}


def _tps(url: str, script: Path, clients: int, seconds: float) -> float:
    u = make_url(url)
    out = subprocess.run(
        ["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
         "-T", str(int(seconds)), "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432),
         "-U", u.username or "postgres", "-f", str(script), u.database or "postgres"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    found = re.search(r"tps = ([0-9.]+)", out.stdout)
    if found is None:
        raise RuntimeError(f"pgbench printed no tps:\n{out.stdout}\n{out.stderr}")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("pgbench") is None:
        sys.exit("pgbench is not installed (Debian: postgresql-client)")
    # the tables and migrations of bench/write_overhead.py, so both run the same transactions
    name = prepare_database(args.url)
    url = _with_db(args.url, name)
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            files = {}
            for variant, text in SCRIPTS.items():
                files[variant] = Path(tmp) / f"{variant}.sql"
                files[variant].write_text(text)
            for clients in (1, 4, 16):
                runs: dict[str, list[float]] = {v: [] for v in SCRIPTS}
                for _ in range(args.rounds):
                    for variant, path in files.items():
                        runs[variant].append(round(_tps(url, path, clients, args.seconds), 1))
                med = {v: statistics.median(r) for v, r in runs.items()}
                results[f"{clients}_clients"] = {
                    **{f"{v}_tx_per_s_median": m for v, m in med.items()},
                    "ratio_polling_over_naive": round(med["polling"] / med["naive"], 3),
                    "ratio_naive_over_baseline": round(med["naive"] / med["baseline"], 3),
                    "runs": runs,
                }
                print(clients, results[f"{clients}_clients"], flush=True)
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        write_result(
            "write_floor",
            {
                "what": "the polling write path's server work, driven by pgbench (C client)",
                "seconds_per_run": args.seconds,
                "rounds": args.rounds,
                "scripts": SCRIPTS,
                "results": results,
            },
        )
    )


if __name__ == "__main__":
    main()
