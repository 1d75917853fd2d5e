"""One relay process for many databases: memory and connections per database, and how the
connections are bounded.

What is simulated: N real databases (default 1,000), each cloned from one migrated template
and given its own origin, on a private PostgreSQL cluster started here (its max_connections
raised to fit; the machine's own server keeps its 100), each with M messages over a few keys;
plus one database that does not exist (paused, the others go on). The broker is the in-memory
one: the broker is not what is measured. One relay process (relay.fleet.Fleet, in this
process) serves them all, with the lean settings of a large list (`database_connections = 1`,
`listen = false`, `watch = false`). Side by side, for the naive layout, one relay process per
database: the resident memory of one `python -m relay` serving one database.

Measured: the process's resident memory before the fleet starts, once everything is delivered
and after it idles; the server's connections from the relay (pg_stat_activity) sampled through
the run (peak) and when idle; the time to deliver everything; the relay's CPU while idle.

Run: python bench/many_databases.py [--databases 1000] [--messages 10] [--max-concurrent 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pwd
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import write_result
from outbox import Message, publish_batch
from outbox._migrate import upgrade
from relay.brokers.memory import MemoryPublisher
from relay.fleet import Fleet, load_fleet

PG_BIN = Path("/usr/lib/postgresql/15/bin")
KEYS = 3


def rss_mb(pid: int | None = None) -> float:
    status = Path(f"/proc/{pid or os.getpid()}/status").read_text().splitlines()
    kb = int(next(line.split()[1] for line in status if line.startswith("VmRSS")))
    return kb / 1024


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the cluster below is stopped on the way out


@contextlib.contextmanager
def cluster(connections: int) -> Iterator[str]:
    """A private cluster (fsync off: the bench measures the relay, not the disk)."""
    with tempfile.TemporaryDirectory(prefix="many_db_") as work:
        user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if user is not None:
            os.chown(work, user.pw_uid, user.pw_gid)
        data = os.path.join(work, "data")
        who = "postgres" if user is not None else None
        subprocess.run([PG_BIN / "initdb", "-D", data, "-A", "trust", "-U", "postgres",
                        "--no-sync"], check=True, capture_output=True, user=who)  # fmt: skip
        with __import__("socket").socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        log = open(os.path.join(work, "log"), "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [PG_BIN / "postgres", "-D", data, "-p", str(port), "-k", work,
             "-c", "listen_addresses=127.0.0.1", "-c", f"max_connections={connections}",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "shared_buffers=128MB",
             "-c", "full_page_writes=off"],
            stdout=log, stderr=subprocess.STDOUT, user=who,
        )  # fmt: skip
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(url).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        try:
            yield url
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
            log.close()


def make_databases(admin: str, n: int, messages: int) -> list[tuple[str, str]]:
    base = admin.rsplit("/", 1)[0]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE tmpl")
    upgrade(f"{base}/tmpl")

    def one(i: int) -> tuple[str, str]:
        name = f"tenant{i:04d}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE tmpl STRATEGY FILE_COPY").format(
                sql.Identifier(name)))  # fmt: skip
        url = f"{base}/{name}"
        with psycopg.connect(url) as conn:
            conn.execute("UPDATE outbox_identity SET origin = %s", (name,))
            msgs = [Message(topic="orders", key=f"k{j % KEYS}", payload={"j": j})
                    for j in range(messages)]  # fmt: skip
            publish_batch(conn, msgs, wakeup=False)
            conn.commit()
        return name, url

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(n)))


def relay_connections(admin: str) -> dict[str, int]:
    with psycopg.connect(admin) as conn:
        row = conn.execute(
            "SELECT count(*) AS total, count(*) FILTER (WHERE state = 'active') AS active "
            "FROM pg_stat_activity WHERE datname LIKE 'tenant%%' "
            "AND backend_type = 'client backend'"
        ).fetchone()
    assert row is not None
    return {"total": row[0], "active": row[1]}


def write_file(
    path: Path, dbs: list[tuple[str, str]], bad: str, concurrent: int, poll: float
) -> None:
    lines = ['broker = "memory:"', "listen = false", "watch = false", "max_in_flight = 1",
             f"poll_interval = {poll}", f"heartbeat_interval = {poll * 3}",
             "[fleet]", f"max_concurrent = {concurrent}", "database_connections = 1",
             "retry_max = 30"]  # fmt: skip
    for name, url in [*dbs, ("missing", bad)]:
        lines += ["[[databases]]", f'name = "{name}"', f'url = "{url}"']
    path.write_text("\n".join(lines) + "\n")


async def run_fleet(path: Path, admin: str, total: int, idle: float) -> dict[str, Any]:
    config = load_fleet(path)
    assert config is not None
    publisher = MemoryPublisher()
    before = rss_mb()
    fleet = Fleet(config, publisher, load=lambda: load_fleet(path))  # type: ignore[arg-type,return-value]
    started = time.monotonic()
    task = asyncio.create_task(fleet.run())
    peak = {"total": 0, "active": 0}
    while len(publisher.published()) < total:
        seen = await asyncio.to_thread(relay_connections, admin)
        peak = {k: max(peak[k], seen[k]) for k in peak}
        await asyncio.sleep(0.2)
        if time.monotonic() - started > 900:
            raise TimeoutError(f"{len(publisher.published())} of {total} delivered in 900 s")
    delivered = time.monotonic() - started
    after = rss_mb()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.sleep(idle)
    usage_idle = resource.getrusage(resource.RUSAGE_SELF)
    cpu_idle = usage_idle.ru_utime + usage_idle.ru_stime - usage.ru_utime - usage.ru_stime
    idle_conns = await asyncio.to_thread(relay_connections, admin)
    states = fleet.states()
    idle_rss = rss_mb()
    fleet.stop()
    await task
    n = len(config.databases) - 1
    once = len({e.id for e in publisher.published()}) == total
    return {
        "databases": n,
        "messages_delivered": len(publisher.published()),
        "each_delivered_once": once,
        "seconds_to_deliver_all": round(delivered, 1),
        "rss_mb_before": round(before, 1),
        "rss_mb_delivered": round(after, 1),
        "rss_mb_idle": round(idle_rss, 1),
        "rss_kb_per_database": round((idle_rss - before) * 1024 / n, 1),
        "server_connections_peak": peak,
        "server_connections_idle": idle_conns,
        "connections_per_database_idle": round(idle_conns["total"] / n, 3),
        "relay_cpu_share_idle": round(cpu_idle / idle, 3),
        "states": _count(states),
        "missing_database": states["missing"],
    }


def _count(states: dict[str, dict[str, Any]]) -> dict[str, int]:
    kinds = ("running", "waiting", "starting", "paused")
    return {k: sum(1 for v in states.values() if v["state"] == k) for k in kinds}


def one_relay_rss(url: str, idle: float) -> float:
    """The naive layout's cost per database: one `python -m relay` for one database."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay", "--url", url, "--broker", "memory:"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(idle)
        return rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--databases", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--max-concurrent", type=int, default=16)
    parser.add_argument("--idle", type=float, default=15.0)
    parser.add_argument("--result", default="many_databases", help="bench/results/NAME.json")
    # every idle database is claimed once per poll_interval (no LISTEN): 1,000 databases at 1 s
    # is 1,000 claims a second, more than this 2-core machine's server serves beside the rest
    parser.add_argument("--poll-interval", type=float, default=5.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _terminated)
    with cluster(args.databases + 60) as admin:
        t0 = time.monotonic()
        dbs = make_databases(admin, args.databases, args.messages)
        made = time.monotonic() - t0
        print(f"{len(dbs)} databases made in {made:.0f}s", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "fleet.toml"
            bad = admin.rsplit("/", 1)[0] + "/no_such_database"
            write_file(path, dbs, bad, args.max_concurrent, args.poll_interval)
            fleet = asyncio.run(run_fleet(path, admin, len(dbs) * args.messages, args.idle))
        single = one_relay_rss(dbs[0][1], args.idle)
    result = {
        "simulated": (
            f"{args.databases} real databases on a private PostgreSQL 15 cluster (fsync off; "
            "cloned from a migrated template, each given its own origin) plus one that does not "
            "exist; the in-memory broker; one relay process (relay.fleet.Fleet) with "
            "database_connections = 1, listen = false, watch = false, max_in_flight = 1, "
            f"poll_interval = {args.poll_interval}, heartbeat_interval = "
            f"{args.poll_interval * 3}, [fleet] max_concurrent = {args.max_concurrent}"
        ),
        "messages_per_database": args.messages,
        "seconds_to_make_databases": round(made, 1),
        "fleet": fleet,
        "naive_one_process_per_database": {
            "rss_mb_of_one_relay_process": round(single, 1),
            "rss_mb_for_all": round(single * args.databases, 1),
        },
        "fleet_memory_vs_naive": round(fleet["rss_mb_idle"] / (single * args.databases), 4),
    }
    print(write_result(args.result, result).read_text())


if __name__ == "__main__":
    main()
