"""The durable record stays bounded: a soak with the relay and retention running.

    python bench/soak.py                      # 30 minutes, 'wal'; writes bench/results/soak.json
    python bench/soak.py --mode polling       # writes bench/results/soak_polling.json
    python bench/soak.py --minutes 5 --clients 4

On a private PostgreSQL cluster (wal_level = logical, the server's default durability and
autovacuum; bench/common.py), in the ``--mode`` capture mode: ``--clients`` writer threads
commit one message per transaction as fast as they can (the machine's sustained write rate)
while one relay (a no-op publisher, so the database does all the work) streams the slot (in
'polling' mode: reads the ledger), records and sends each message and deletes its
``outbox_wal_pending`` row, and deletes published rows older than
``--retention-seconds`` every ``--retention-interval`` seconds. Every ``--sample-seconds`` it
records the write rate, the sizes (with TOAST and indexes) and live and dead tuples of
``outbox_wal_pending`` and ``outbox_messages``, and how many messages wait in the pending
table. The result is the curve; the summary compares the last third of the run with the
middle third (flat: the table size and dead tuples stop growing once retention has started).
The server logs every autovacuum run (``log_autovacuum_min_duration = 0`` on the private
cluster), and the result lists each run on the two tables: what it removed, what it had to
leave as dead but not yet removable, how old its cutoff was and how long it took.
SIGTERM or SIGINT ends a run early, in order (writers, relay, then the cluster), and writes
what it sampled to ``soak*_interrupted.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

_HERE = Path(__file__).resolve().parent
# bench/relay.py would shadow the relay package: import it before bench/ joins sys.path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
from outbox import publish  # noqa: E402
from outbox._migrate import upgrade  # noqa: E402
from relay import Relay, RelayConfig  # noqa: E402
from relay._admin import enable_capture  # noqa: E402
from relay.brokers.base import BrokerFeatures  # noqa: E402

sys.path.insert(0, str(_HERE))
from common import logical_cluster, write_result  # noqa: E402

_TABLES = ("outbox_wal_pending", "outbox_messages")


class _NoopPublisher:
    """Takes every message at once: the soak measures the database, not a broker."""

    features = BrokerFeatures("noop", 0.0, True, True, 0)

    async def start(self) -> None:
        return None

    async def publish_batch(self, envelopes: Any) -> list[BaseException | None]:
        return [None] * len(envelopes)

    async def close(self) -> None:
        return None


def _writer(
    url: str, stop: threading.Event, room: threading.Event, counts: list[int], i: int
) -> None:
    with psycopg.connect(url) as conn:
        n = 0
        while not stop.is_set():
            room.wait(1.0)  # held back while the relay is --max-waiting messages behind
            if not room.is_set():
                continue
            publish(conn, topic="soak", key=f"k{(i * 7919 + n) % 1000}", payload={"n": n})
            conn.commit()
            n += 1
            counts[i] = n


def _gate(url: str, stop: threading.Event, room: threading.Event, limit: int) -> float:
    """Hold the writers back while more than ``limit`` messages wait for the relay, until half
    of them are recorded: the writers then commit at the rate the relay sustains. Returns the
    seconds they were held back."""
    held = 0.0
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.wait(0.25):
            row = conn.execute("SELECT count(*) FROM outbox_wal_pending").fetchone()
            waiting = int(row[0]) if row else 0
            if waiting > limit:
                room.clear()
            elif waiting <= limit // 2:
                room.set()
            if not room.is_set():
                held += 0.25
    return held


def _sample(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        out: dict[str, Any] = {}
        for table in _TABLES:
            row = conn.execute(
                "SELECT pg_total_relation_size(c.oid), s.n_live_tup, s.n_dead_tup, "
                "s.autovacuum_count FROM pg_class AS c JOIN pg_stat_user_tables AS s "
                "ON s.relid = c.oid WHERE c.relname = %s",
                (table,),
            ).fetchone()
            assert row is not None
            out[table] = {
                "bytes": int(row[0]), "live": int(row[1]), "dead": int(row[2]),
                "autovacuums": int(row[3]),
            }  # fmt: skip
        pending = conn.execute("SELECT count(*) FROM outbox_wal_pending").fetchone()
        out["pending_messages"] = int(pending[0]) if pending else 0
    return out


async def _soak(url: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], float, bool]:
    """The samples, how long the writers were held back, and whether a signal ended it early."""
    config = RelayConfig(
        database_url=url,
        retention_seconds=args.retention_seconds,
        retention_interval=args.retention_interval,
        heartbeat_interval=5.0,
    )
    relay = Relay(config, _NoopPublisher())
    task = asyncio.create_task(relay.run())
    stop, room = threading.Event(), threading.Event()
    room.set()
    counts = [0] * args.clients
    writers = [
        threading.Thread(target=_writer, args=(url, stop, room, counts, i))
        for i in range(args.clients)
    ]
    for t in writers:
        t.start()
    gate = None
    if args.max_waiting:
        gate = asyncio.create_task(asyncio.to_thread(_gate, url, stop, room, args.max_waiting))
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    last_total, last_at = 0, started
    # SIGTERM or SIGINT (even where the shell started it with SIGINT ignored) ends the soak
    # early but in order: the writers and the relay stop, the cluster shuts down, and the
    # samples so far are written (to soak*_interrupted.json: a full run's file stays)
    ending = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ending.set)
    try:
        while time.monotonic() - started < args.minutes * 60 and not ending.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ending.wait(), args.sample_seconds)
            now, total = time.monotonic(), sum(counts)
            sample = await asyncio.to_thread(_sample, url)
            sample["t_seconds"] = round(now - started, 1)
            sample["writes_per_second"] = round((total - last_total) / (now - last_at), 1)
            last_total, last_at = total, now
            samples.append(sample)
            print(sample, flush=True)
    finally:
        stop.set()
        room.set()
        for t in writers:
            await asyncio.to_thread(t.join)
        held = await gate if gate is not None else 0.0
        relay.stop()
        await task
    return samples, held, ending.is_set()


_VACUUM = re.compile(
    r'automatic vacuum of table "[^"]*\.(?P<table>\w+)": index scans: (?P<scans>\d+).*?'
    r"tuples: (?P<removed>\d+) removed, (?P<remain>\d+) remain, "
    r"(?P<not_yet>\d+) are dead but not yet removable.*?"
    r"(?:removable cutoff: \d+, which was (?P<xids_old>\d+) XIDs old.*?)?"
    r"elapsed: (?P<elapsed>[0-9.]+) s",
    re.S,
)


def _log_vacuums(admin_url: str) -> None:
    """Have the server log every autovacuum run (a private cluster: ours to configure)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_autovacuum_min_duration = 0")
        conn.execute("SELECT pg_reload_conf()")


def _server_log(admin_url: str) -> Path:
    """The private cluster's log file (bench/common.py: beside its data directory)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return Path(str(row[0])).parent / "postgres.log"


def _vacuums(log: str) -> list[dict[str, Any]]:
    """Each autovacuum run of the soak's tables, as the server logged it: what it removed,
    what it had to leave (dead but not yet removable), how old its cutoff was, how long."""
    runs = []
    for block in log.split("automatic vacuum of table")[1:]:
        found = _VACUUM.search("automatic vacuum of table" + block)
        if found is None or found["table"] not in _TABLES:
            continue
        runs.append(
            {
                "table": found["table"],
                "index_scans": int(found["scans"]),
                "removed": int(found["removed"]),
                "remain": int(found["remain"]),
                "dead_not_yet_removable": int(found["not_yet"]),
                "cutoff_xids_old": int(found["xids_old"]) if found["xids_old"] else None,
                "elapsed_s": float(found["elapsed"]),
            }
        )
    return runs


def _third(samples: list[dict[str, Any]], which: int, table: str, field: str) -> float:
    n = len(samples)
    part = samples[which * n // 3 : (which + 1) * n // 3] or samples[-1:]
    return float(statistics.median(s[table][field] for s in part))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("wal", "polling"), default="wal")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--retention-seconds", type=float, default=120.0)
    parser.add_argument("--retention-interval", type=float, default=30.0)
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=0,
        help="hold the writers back while more messages than this wait for the relay (0: never)",
    )
    args = parser.parse_args()
    with logical_cluster("outbox-soak-") as server:
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE soak")
        url = server.url("soak")
        upgrade(url)
        if args.mode == "wal":
            enable_capture(url)
        _log_vacuums(server.admin_url)
        log = _server_log(server.admin_url)
        samples, held, interrupted = asyncio.run(_soak(url, args))
        vacuums = _vacuums(log.read_text(errors="replace"))
    summary = {
        table: {
            field: {
                "middle_third_median": _third(samples, 1, table, field),
                "last_third_median": _third(samples, 2, table, field),
            }
            for field in ("bytes", "dead")
        }
        for table in _TABLES
    }
    name = "soak" if args.mode == "wal" else f"soak_{args.mode}"
    path = write_result(
        f"{name}_interrupted" if interrupted else name,
        {
            "config": vars(args),
            "summary": summary,
            "writers_held_back_seconds": held,
            "writes_per_second_median": statistics.median(s["writes_per_second"] for s in samples),
            "samples": samples,
            "autovacuum_runs": vacuums,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
