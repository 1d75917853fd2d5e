"""What does ``publish()`` cost a business transaction in each capture mode?

Side by side in one run, on one private PostgreSQL 15 cluster with wal_level = logical and the
server's default durability (fsync on), started by this script on a free port (the machine's
own server is never reconfigured), at 1, 4 and 16 client threads (psycopg 3, one connection
each), in two databases of that cluster: one in 'polling' mode, one in 'wal' mode.

* ``baseline``: INSERT one ~300-byte business row, COMMIT.
* ``naive``: the same plus one plain INSERT into a bigserial outbox table (what a user would
  write by hand: no per-key sequence, no idempotency, no wake-up).
* ``polling``: the same plus ``publish(...)`` in polling mode, with its defaults. The relay's
  commit watch runs meanwhile (only during these runs), reading every 2 ms as it does while
  writers are active: its server time is charged to this variant.
* ``wal``: the same plus ``publish(...)`` in 'wal' mode (a transactional logical message).
* ``wal_floor``: what bounds ``wal``: the same business row plus one transactional logical
  message of the same size emitted by hand (``pg_logical_emit_message`` with a record encoded
  once, under a prefix no relay reads), so neither ``publish()``'s Python (validation, id,
  encoding) nor its mode check is in it: the server's and the driver's share of 'wal' mode.

The transactions are bench/write_overhead.py's. Variants are interleaved in rounds, the median
reported, with ratios against ``naive``. No relay publishes: the slot keeps the WAL meanwhile.
Run: ``python bench/capture_write.py [--seconds S] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
# bench/relay.py would shadow the relay package: import it before bench/ joins sys.path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
from outbox._message import Message, prepare  # noqa: E402
from outbox._publish import _record as wal_record  # noqa: E402
from relay._state import RunState  # noqa: E402
from relay._statements import relay_statements  # noqa: E402
from relay._watch import CommitWatch  # noqa: E402
from relay.admin import enable_capture  # noqa: E402

sys.path.insert(0, str(_HERE))
from common import load_file, logical_cluster, write_result  # noqa: E402

overhead = load_file("bench_write_overhead", _HERE / "write_overhead.py")

CLIENTS = (1, 4, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with logical_cluster("outbox-bench-logical-") as server:
        results = _measure(server.admin_url, args.seconds, args.rounds)
    path = write_result(
        "capture_write",
        {
            "what": "business transaction: INSERT one ~300-byte row [+ message], COMMIT",
            "server": "private PostgreSQL 15 cluster, wal_level = logical, fsync on",
            "clients_are": "threads, one psycopg connection each",
            "seconds_per_run": args.seconds,
            "rounds": args.rounds,
            "targets": "wal >= 1.0 x naive at 1/4/16 clients; polling >= 0.85 x naive at 16",
            "floor": "wal_floor: the same transaction with the message emitted by hand",
            "results": results,
        },
    )
    print(path)


def _measure(admin_url: str, seconds: float, rounds: int) -> dict[str, Any]:
    polling_url = overhead._with_db(admin_url, overhead.prepare_database(admin_url))
    wal_url = overhead._with_db(admin_url, overhead.prepare_database(admin_url))
    enable_capture(wal_url, slot="bench_capture")
    variants = {
        "baseline": (polling_url, overhead.baseline),
        "naive": (polling_url, overhead.naive),
        "polling": (polling_url, overhead.with_outbox),
        "wal": (wal_url, overhead.with_outbox),
        "wal_floor": (wal_url, _emit_by_hand),
    }
    out: dict[str, Any] = {}
    for clients in CLIENTS:
        runs: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(rounds):
            for name, (url, txn) in variants.items():
                with _watching(polling_url) if name == "polling" else contextlib.nullcontext():
                    runs[name].append(round(overhead.run(url, txn, clients, seconds), 1))
        medians = {v: statistics.median(r) for v, r in runs.items()}
        out[f"{clients}_clients"] = {
            **{f"{v}_tx_per_s_median": round(m, 1) for v, m in medians.items()},
            "ratio_wal_over_naive": round(medians["wal"] / medians["naive"], 3),
            "ratio_polling_over_naive": round(medians["polling"] / medians["naive"], 3),
            "ratio_naive_over_baseline": round(medians["naive"] / medians["baseline"], 3),
            "ratio_wal_floor_over_naive": round(medians["wal_floor"] / medians["naive"], 3),
            "ratio_wal_over_wal_floor": round(medians["wal"] / medians["wal_floor"], 3),
            "runs": runs,
        }
        print(
            clients, {k: v for k, v in out[f"{clients}_clients"].items() if k != "runs"}, flush=True
        )
    return out


def _floor_record() -> bytes:
    """A record of the size ``wal`` emits for the same message (fixed id and key)."""
    order_id = "00000000-0000-4000-8000-000000000000"
    payload = {"order_id": order_id, "total": "12.50"}
    return wal_record(prepare(Message("orders", order_id, payload, {"type": "OrderCreated"})))


_FLOOR_RECORD = _floor_record()


def _emit_by_hand(conn: Any, rnd: Any) -> None:
    overhead._business(conn, rnd)
    conn.execute("SELECT pg_logical_emit_message(true, 'bench.floor', %b::bytea)", (_FLOOR_RECORD,))
    conn.commit()


@contextlib.contextmanager
def _watching(url: str) -> Iterator[None]:
    """The relay's commit watch on ``url``, in a process of its own (as the relay is), while
    the block runs."""
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=_watch_process, args=(url, stop))
    proc.start()
    try:
        yield
    finally:
        stop.set()
        proc.join(30)


def _watch_process(url: str, stop: Any) -> None:
    async def main() -> None:
        state = RunState()
        watch = CommitWatch(
            url, relay_statements(None), state, interval=0.002, idle_interval=0.05, bound=5.0
        )
        task = asyncio.create_task(watch.run())
        await asyncio.to_thread(stop.wait)
        state.stop()
        await task

    asyncio.run(main())


if __name__ == "__main__":
    main()
