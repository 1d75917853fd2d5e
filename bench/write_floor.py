"""The server's floor of the write path: the same transactions as
bench/write_overhead.py, driven by pgbench (a C client) instead of Python, so the client costs
next to nothing and what is left is the server's work.

Side by side in one run, on the machine's PostgreSQL, at 1, 4 and 16 clients, in rounds:

* ``baseline``: BEGIN, INSERT one ~300-byte business row, COMMIT;
* ``naive``: the same plus one plain INSERT of a row of the naive outbox (a random id);
* ``ledger``: the same plus the statement ``publish()`` runs for one message in both capture
  modes (outbox/statements.sql, outbox_ledger_insert_one: one row of outbox_wal_pending, the
  message's id and its record, as ``publish()`` encodes it for the bench's message);
* ``sql``: the same transaction through the SQL function ``outbox_publish(...)`` (the same
  message, its headers included): the server validates, makes the id and builds the record;
* ``sql_0024``: the same through ``outbox_publish`` as migration outbox_0024 wrote it (one
  statement per rule and per field), installed beside it as ``bench_outbox_publish_0024``;
* ``plpgsql_floor``: the same call to ``bench_plpgsql_floor``, a PL/pgSQL function of the same
  signature that only inserts one ledger row (a random id, the payload's text as its record):
  no rule, no UUIDv7, no record. What any PL/pgSQL writer costs at least.

Reported: transactions per second (medians) and each variant / naive. A ratio below 1 here is
the design's own cost on the server, whatever the client.
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
from write_overhead import FLOOR, _with_db, prepare_database  # it creates FLOOR

from outbox._message import DEFAULT_MAX_PAYLOAD_BYTES, prepare_fields
from outbox._publish_common import Batch
from outbox._statements import producer_statements
from outbox_migrations import function_sql, schema_names

_BUSINESS = (
    "INSERT INTO bench_orders (id, customer, total, notes) VALUES "
    "(gen_random_uuid(), 'customer-' || (random() * 10000)::int, 12.50, repeat('x', 260));"
)
_NAIVE = (
    "INSERT INTO bench_naive_outbox (id, topic, key, payload) VALUES (gen_random_uuid(), "
    "'orders', md5(:k::text), '{\"order_id\": \"x\", \"total\": \"12.50\"}');"
)


def _ledger() -> str:
    """outbox_ledger_insert_one for the bench's message, on one line: a fresh id per row, the
    record of write_overhead's message (its own id inside: the server does not read it)."""
    text = producer_statements(None).ledger_insert_one.decode()
    fields = ("orders", "order-x", None, {"type": "OrderCreated"}, None, None, None, None)
    message = prepare_fields(*fields[:2], {"order_id": "x", "total": "12.50"}, *fields[3:],
                             DEFAULT_MAX_PAYLOAD_BYTES)  # fmt: skip
    record = Batch.one(message).statement(producer_statements(None))[1]["record"]
    values = {"id": "gen_random_uuid()", "record": f"'\\x{record.hex()}'"}
    text = re.sub(r"%\((\w+)\)b?s?", lambda m: values[m.group(1)], text)
    return " ".join(text.split()) + ";"


def _script(*statements: str) -> str:
    return "\n".join(["\\set k random(1, 2000000000)", "BEGIN;", *statements, "COMMIT;", ""])


def _sql(function: str) -> str:
    return (
        f"SELECT {function}('orders', md5(:k::text), '{{\"order_id\": \"x\", "
        "\"total\": \"12.50\"}', headers => '{\"type\": \"OrderCreated\"}');"
    )


#: outbox_0024's text of outbox_publish, under another name: the same run measures both
_PREVIOUS = "bench_outbox_publish_0024"
SCRIPTS = {
    "baseline": _script(_BUSINESS),
    "naive": _script(_BUSINESS, _NAIVE),
    "ledger": _script(_BUSINESS, _ledger()),
    "sql": _script(_BUSINESS, _sql("outbox_publish")),
    "sql_0024": _script(_BUSINESS, _sql(_PREVIOUS)),
    "plpgsql_floor": _script(_BUSINESS, _sql(FLOOR)),
}


def _install_comparisons(url: str) -> None:
    text = function_sql("outbox_publish", "outbox_0024", **schema_names(None))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(text.replace("FUNCTION outbox_publish(", f"FUNCTION {_PREVIOUS}(", 1))


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
    _install_comparisons(url)
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
                    **{
                        f"ratio_{v}_over_naive": round(med[v] / med["naive"], 3)
                        for v in ("ledger", "sql", "sql_0024", "plpgsql_floor")
                    },
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
                "what": "the write path's server work (both modes), driven by pgbench (C client)",
                "seconds_per_run": args.seconds,
                "rounds": args.rounds,
                "scripts": SCRIPTS,
                "results": results,
            },
        )
    )


if __name__ == "__main__":
    main()
