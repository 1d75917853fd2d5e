"""What does the writer's slot check cost a transaction in 'wal' mode?

``publish()`` in 'wal' mode emits only while the slot the mode row names can decode the
message (outbox/_statements.py); that check reads the server's slot array. Three ways of
making it, on one private PostgreSQL 15 cluster with wal_level = logical, at 1 and 4 client
threads (psycopg 3, one connection each), each transaction one ~300-byte business row plus
``publish()``:

* ``mode_only``: no slot check (the emit checks the mode only: what a writer did before);
* ``every_100ms``: the check on a connection's first emit, then at most every
  ``SLOT_CHECK_SECONDS`` (what ``publish()`` does);
* ``every_emit``: the check in every emit.

The clients run throughout; the variant is switched under them every ``--slice`` seconds, in
rotating order, so that the machine's drift (it is shared) hits every variant alike. Reported:
each variant's median rate over ``--rounds`` rotations, and the median (and quartiles) of its
rate over ``mode_only``'s in the same rotation. The cluster runs with fsync off unless
``--durable``: a transaction bound by CPU rather than by the disk, where the check shows most.
Run: ``python bench/capture_slot_check.py [--rounds R] [--slice S] [--durable]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
# bench/relay.py would shadow the relay package: import it before bench/ joins sys.path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
import psycopg  # noqa: E402

import outbox._publish_sync as publish_module  # noqa: E402
from outbox import publish  # noqa: E402
from outbox._migrate import upgrade  # noqa: E402
from outbox._statements import ProducerStatements, producer_statements  # noqa: E402
from relay.admin import enable_capture  # noqa: E402

sys.path.insert(0, str(_HERE))
from common import load_file, write_result  # noqa: E402

CLIENTS = (1, 4)
BODY = "x" * 300


def _variants() -> dict[str, ProducerStatements]:
    ours = producer_statements(None)
    return {
        "mode_only": dataclasses.replace(
            ours, wal_emit_checked=ours.wal_emit, wal_emit_one_checked=ours.wal_emit_one
        ),
        "every_100ms": ours,
        "every_emit": dataclasses.replace(
            ours, wal_emit=ours.wal_emit_checked, wal_emit_one=ours.wal_emit_one_checked
        ),
    }


def _measure(url: str, clients: int, rounds: int, slice_s: float) -> dict[str, Any]:
    variants = _variants()
    current = {"stmts": variants["mode_only"]}
    # publish() looks its statements up per call: switching them here switches every client
    publish_module.producer_statements = lambda schema: current["stmts"]  # type: ignore[assignment]
    counts = [0] * clients
    stop = threading.Event()

    def client(i: int) -> None:
        with psycopg.connect(url) as conn:
            n = 0
            while not stop.is_set():
                conn.execute("INSERT INTO business (body) VALUES (%s)", (BODY,))
                publish(conn, topic="t", key=f"k{i}-{n % 20}", payload={"n": n, "b": BODY})
                conn.commit()
                counts[i] += 1
                n += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    rates: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    try:
        time.sleep(1.0)
        for r in range(rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                current["stmts"] = variants[name]
                time.sleep(0.05)  # the transactions in flight finish on the old statements
                before, started = sum(counts), time.perf_counter()
                time.sleep(slice_s)
                rates[name].append((sum(counts) - before) / (time.perf_counter() - started))
    finally:
        stop.set()
        for t in threads:
            t.join()
    medians = {name: statistics.median(r) for name, r in rates.items()}
    out: dict[str, Any] = {f"{n}_tx_per_s_median": round(m, 1) for n, m in medians.items()}
    for name in ("every_100ms", "every_emit"):
        # paired: each round's rate against mode_only's in the same round, a second apart
        ratios = [a / b for a, b in zip(rates[name], rates["mode_only"], strict=True)]
        quartiles = statistics.quantiles(ratios, n=4)
        out[f"ratio_{name}_over_mode_only_median"] = round(quartiles[1], 3)
        out[f"ratio_{name}_over_mode_only_quartiles"] = [
            round(quartiles[0], 3),
            round(quartiles[2], 3),
        ]
    out["rates"] = {name: [round(x, 1) for x in r] for name, r in rates.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--slice", type=float, default=0.5)
    parser.add_argument("--durable", action="store_true", help="fsync on")
    args = parser.parse_args()
    harness = load_file("harness", _HERE.parent / "tests" / "harness.py")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="outbox-bench-slot-") as workdir:
        server = harness.logical_server(workdir, durable=args.durable)
        if server is None:
            sys.exit(harness.LOGICAL_HOW_TO)
        try:
            url = server.create_database("bench_slot_check")
            upgrade(url)
            enable_capture(url)
            with psycopg.connect(url) as conn:
                conn.execute("CREATE TABLE business (id bigserial PRIMARY KEY, body text)")
                conn.commit()
            for clients in CLIENTS:
                results[f"{clients}_clients"] = _measure(url, clients, args.rounds, args.slice)
                shown = {
                    k: v for k, v in results[f"{clients}_clients"].items() if k != "rates"
                }
                print(clients, shown, flush=True)
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM outbox_messages").fetchone()
            assert row == (0,), "a publish() wrote a row: the WAL path was not measured"
        finally:
            server.stop()
    path = write_result(
        "capture_slot_check",
        {
            "what": "business transaction: INSERT one ~300-byte row + publish() in 'wal' mode",
            "server": "private PostgreSQL 15 cluster, wal_level = logical, "
            + ("fsync on" if args.durable else "fsync off"),
            "clients_are": "threads, one psycopg connection each",
            "slice_seconds": args.slice,
            "rounds": args.rounds,
            "results": results,
        },
    )
    print(path)


if __name__ == "__main__":
    main()
