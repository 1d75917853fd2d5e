"""Our write path side by side with faststream-outbox, the best-known Python peer, on the
same driver (SQLAlchemy AsyncSession on asyncpg), in one run. Writes
bench/results/faststream_outbox.json.

    pip install 'faststream-outbox[asyncpg]==0.19.*'   # the peer; not a dependency of ours
    python bench/peer_faststream.py [--clients 4] [--seconds 3] [--rounds 3]

Each client is an OS process with one AsyncSession on its own asyncpg connection. A transaction
is one UPDATE of a business row plus, per variant: nothing (``bare``), our ``publish_async`` in
'polling' capture mode (the default; ``ours``) and in 'wal' mode (``ours_wal``), or
faststream-outbox's ``broker.publish`` (its recommended set-up: an ``OutboxBroker`` on its own
table, the caller's session). Everything runs on one private PostgreSQL 15 cluster this script
starts on a free port (wal_level = logical, fsync on), in two databases of it: 'wal' mode in
one, the other variants in the other. Variants are interleaved in rounds; medians are reported
with the ratios ours / peer.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from bench.common import logical_cluster, write_result

VARIANTS = ("bare", "ours", "ours_wal", "faststream_outbox")
ROWS_PER_CLIENT = 50


def _client(url: str, variant: str, worker: int, seconds: float, out: Any) -> None:
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    from outbox import publish_async

    async def main() -> int:
        engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://"),
                                     pool_size=1, max_overflow=0)  # fmt: skip
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        broker: Any = None
        if variant == "faststream_outbox":
            from faststream_outbox import OutboxBroker, make_outbox_table

            broker = OutboxBroker(outbox_table=make_outbox_table(MetaData(), "fs_outbox"))
        update = text("UPDATE accounts SET balance = balance + 1 WHERE id = :id")
        done = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            row = worker * ROWS_PER_CLIENT + done % ROWS_PER_CLIENT
            async with sessions() as session, session.begin():
                await session.execute(update, {"id": row})
                if variant in ("ours", "ours_wal"):
                    await publish_async(session, topic="orders", key=f"k{row}",
                                        payload={"order": done})  # fmt: skip
                elif variant == "faststream_outbox":
                    await broker.publish({"order": done}, queue="orders", session=session)
            done += 1
        await engine.dispose()
        return done

    out.put(asyncio.run(main()) / seconds)


def _measure(url: str, variant: str, clients: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(url, variant, w, seconds, out))
             for w in range(clients)]  # fmt: skip
    for p in procs:
        p.start()
    rates = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


def _database(admin_url: str) -> tuple[str, str]:
    from faststream_outbox import make_outbox_table
    from sqlalchemy import MetaData, create_engine

    from outbox._migrate import upgrade

    name = f"outbox_bench_fso_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    metadata = MetaData()
    make_outbox_table(metadata, "fs_outbox")
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    metadata.create_all(engine)
    engine.dispose()
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        conn.execute("INSERT INTO accounts SELECT g, 0 FROM generate_series(0, 10000) g")
        conn.commit()
    return name, url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import faststream_outbox  # noqa: F401 - fail early with ImportError when it is missing

    from relay.admin import enable_capture

    with logical_cluster("outbox-bench-peer-") as server:
        _, url = _database(server.admin_url)
        _, wal_url = _database(server.admin_url)
        enable_capture(wal_url, slot="bench_peer")
        urls = {v: wal_url if v == "ours_wal" else url for v in VARIANTS}
        runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
        _measure(url, "ours", args.clients, 1.0)  # warm-up, not counted
        _measure(wal_url, "ours_wal", args.clients, 1.0)
        for _ in range(args.rounds):
            for variant in VARIANTS:
                rate = _measure(urls[variant], variant, args.clients, args.seconds)
                runs[variant].append(round(rate, 1))
                print(variant, runs[variant][-1], flush=True)
    medians = {v: statistics.median(r) for v, r in runs.items()}
    from importlib import metadata

    result = {
        "what": "one UPDATE of a business row + the variant's publish, one transaction, "
        "SQLAlchemy AsyncSession on asyncpg; clients are OS processes",
        "driver": "asyncpg " + metadata.version("asyncpg"),
        "peer": "faststream-outbox " + metadata.version("faststream-outbox"),
        "server": "private PostgreSQL 15 cluster, wal_level = logical, fsync on",
        "capture_modes": "ours: 'polling' (the default); ours_wal: 'wal'",
        "clients": args.clients,
        "seconds_per_run": args.seconds,
        "rounds": args.rounds,
        "runs_tx_per_s": runs,
        "medians_tx_per_s": {v: round(m, 1) for v, m in medians.items()},
        "ratio_ours_over_peer": round(medians["ours"] / medians["faststream_outbox"], 3),
        "ratio_ours_wal_over_peer": round(medians["ours_wal"] / medians["faststream_outbox"], 3),
        "ratio_ours_over_bare": round(medians["ours"] / medians["bare"], 3),
        "ratio_peer_over_bare": round(medians["faststream_outbox"] / medians["bare"], 3),
    }
    print(result)
    print(write_result("faststream_outbox", result))


if __name__ == "__main__":
    main()
