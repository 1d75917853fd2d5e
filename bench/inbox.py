"""The inbox's cost, side by side in one run: (a) a consumer transaction with and without
``receive``, at 1 and 8 concurrent consumers; (b) the end-to-end pipeline outbox -> relay ->
NATS JetStream -> consumer runner, with and without the inbox.

(a) Each consumer is an OS process (consumers are separate processes in production; threads
would share one GIL) with its own psycopg connection. Per message it builds the envelope (the
decoded broker message, UUIDv7 id as the outbox assigns), then runs one transaction:
[``receive``] + one UPDATE of a business row + COMMIT. Variants, interleaved in rounds (each round
starting one variant later, so each runs in every position) so that drift and the neighbours'
load affect all alike; medians reported:

* ``without_inbox``: BEGIN, UPDATE, COMMIT;
* ``extra_round_trip``: the same plus ``SELECT 1``: what any one extra statement costs, the
  ceiling for an inbox that records with one statement;
* ``bare_insert``: the same plus a plain INSERT of (consumer, message id) into a two-column
  table with only its primary key: the floor for any inbox that keeps one durable row per
  message (no conflict handling, no status, nothing for retention or reconciliation);
* ``naive_inbox``: the inbox a user would write by hand: ``INSERT ... ON CONFLICT DO NOTHING``
  of (consumer, message id) into that table, the effect applied when a row was inserted;
* ``naive_same_row``: the naive inbox keeping what ours keeps: the same ``INSERT ... ON
  CONFLICT DO NOTHING`` of (consumer, message id, topic, key, seq, processed_at, status) into a
  copy of ``inbox_messages`` with its columns, constraints and indexes (``LIKE ... INCLUDING
  ALL``): what the row itself costs, whoever writes it;
* ``checked_same_row``: ``naive_same_row`` into a copy that also has the two CHECK
  constraints ``inbox_messages`` had before migration outbox_0013: what they cost;
* ``with_inbox``: the same plus ``receive(conn, consumer=..., message=envelope)``.

(b) N messages are committed to the outbox first; then the relay (this process) and one
consumer process (NatsConsumer + runner, batch 50) start together; msgs/s = N / time until the
consumer has settled all N (after one short run that is not counted). ``without_inbox`` runs
the same NatsConsumer with a runner that opens the transaction, applies the effect and
commits, without recording.

Run: python bench/inbox.py [--url postgresql://postgres@127.0.0.1:5432/postgres]
     [--seconds 3] [--rounds 7] [--messages 4000] [--pipeline-rounds 4] [--no-save]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import make_url

# This file is named like the package it measures: take the script's folder off sys.path so
# `import inbox` finds the package, and load bench/common.py by path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from inbox import AsyncHandlerRunner, NatsConsumer, Outcome, Result, receive  # noqa: E402
from outbox import Message, new_message_id, publish_batch  # noqa: E402
from outbox._migrate import upgrade  # noqa: E402
from outbox.envelope import Envelope  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_common", _HERE / "common.py")
assert _spec is not None
assert _spec.loader is not None
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)
write_result = _common.write_result

ROWS_PER_CONSUMER = 100
MAX_CONSUMERS = 8
VARIANTS = (
    "without_inbox", "extra_round_trip", "bare_insert", "naive_inbox", "naive_same_row",
    "checked_same_row", "with_inbox",
)  # fmt: skip
#: The CHECK constraints inbox_messages had before outbox_0013, for ``checked_same_row``.
OLD_CHECKS = (
    "CHECK (consumer <> '')",
    "CHECK (status IN ('processing', 'processed', 'stale', 'dead', 'parked'))",
)
NATS = "nats://127.0.0.1:4222"


# ---- (a) the consumer transaction ----------------------------------------------------------


def _consumer(url: str, worker: int, commands: Any, go: Any, stop: Any, counts: Any) -> None:
    """One consumer process: for each command (a variant), run transactions from go to stop."""
    with psycopg.connect(url) as conn:
        while (variant := commands.get()) is not None:
            counts.put(("armed", 0))
            go.wait()
            done = 0
            while not stop.is_set():
                row = worker * ROWS_PER_CONSUMER + done % ROWS_PER_CONSUMER
                msg = Envelope(new_message_id(), "bench", f"k{row}", done + 1, b"{}")
                if variant == "with_inbox":
                    if not receive(conn, consumer="bench", message=msg):
                        raise AssertionError("a fresh id was taken for a duplicate")
                elif variant == "extra_round_trip":
                    conn.execute("SELECT 1").fetchone()
                elif variant == "bare_insert":
                    conn.execute(
                        "INSERT INTO bare_inbox (consumer, message_id) VALUES (%s, %s)",
                        ("bench", msg.id),
                    )
                elif variant in ("naive_same_row", "checked_same_row"):
                    cur = conn.execute(
                        f"INSERT INTO {variant} (consumer, message_id, topic, key, seq, "
                        "processed_at, status) VALUES (%s, %s, %s, %s, %s, clock_timestamp(), "
                        "'processed') ON CONFLICT DO NOTHING",
                        ("bench", msg.id, msg.topic, msg.key, msg.seq),
                    )
                    if cur.rowcount != 1:
                        raise AssertionError("a fresh id was taken for a duplicate")
                elif variant == "naive_inbox":
                    cur = conn.execute(
                        "INSERT INTO naive_inbox (consumer, message_id) VALUES (%s, %s) "
                        "ON CONFLICT DO NOTHING",
                        ("bench", msg.id),
                    )
                    if cur.rowcount != 1:
                        raise AssertionError("a fresh id was taken for a duplicate")
                conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (row,))
                conn.commit()
                done += 1
            counts.put(("done", done))


def _measure(ctx: Any, url: str, consumers: int, rounds: int, seconds: float) -> dict[str, Any]:
    commands = [ctx.Queue() for _ in range(consumers)]
    go, stop, counts = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_consumer, args=(url, w, commands[w], go, stop, counts))
        for w in range(consumers)
    ]
    for p in procs:
        p.start()
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        for round_no in range(rounds):
            for variant in rotated(VARIANTS, round_no):
                go.clear()
                stop.clear()
                for q in commands:
                    q.put(variant)
                for _ in range(consumers):  # every consumer connected and waiting on `go`
                    assert counts.get(timeout=60)[0] == "armed"
                began = time.perf_counter()
                go.set()
                time.sleep(seconds)  # the measurement window itself
                stop.set()
                elapsed = time.perf_counter() - began
                total = sum(counts.get(timeout=60)[1] for _ in range(consumers))
                runs[variant].append(round(total / elapsed, 1))
    finally:
        for q in commands:
            q.put(None)
        for p in procs:
            p.join(timeout=30)
    return _summary(runs, "tx_per_s")


def rotated(variants: tuple[str, ...], round_no: int) -> tuple[str, ...]:
    """The variants in the order round ``round_no`` runs them: each round starts one later, so
    that over as many rounds as variants each variant runs once in every position. (The machine
    slows down over a run, as tables and WAL grow; a fixed order would charge the variant that
    always runs last with that drift.)"""
    shift = round_no % len(variants)
    return variants[shift:] + variants[:shift]


def _summary(runs: dict[str, list[float]], unit: str) -> dict[str, Any]:
    medians = {v: statistics.median(r) for v, r in runs.items()}
    base = medians["without_inbox"]
    out: dict[str, Any] = {f"{v}_{unit}_median": round(m, 1) for v, m in medians.items()}
    for variant in runs:
        if variant != "without_inbox":
            out[f"ratio_{variant}_over_without"] = round(medians[variant] / base, 3)
            # per round: both variants measured back to back, under the same neighbours' load
            per_round = [a / b for a, b in zip(runs[variant], runs["without_inbox"], strict=True)]
            out[f"ratio_{variant}_per_round"] = [round(r, 3) for r in per_round]
    if "naive_inbox" in runs:
        # the target: ours against the inbox a user would otherwise write
        out["ratio_with_inbox_over_naive_inbox"] = round(
            medians["with_inbox"] / medians["naive_inbox"], 3
        )
        out["ratio_with_inbox_over_naive_inbox_per_round"] = [
            round(a / b, 3) for a, b in zip(runs["with_inbox"], runs["naive_inbox"], strict=True)
        ]
    if "naive_same_row" in runs:
        # what bounds it: the naive statement writing the row ours keeps
        out["ratio_naive_same_row_over_naive_inbox"] = round(
            medians["naive_same_row"] / medians["naive_inbox"], 3
        )
        out["ratio_with_inbox_over_naive_same_row"] = round(
            medians["with_inbox"] / medians["naive_same_row"], 3
        )
    if "checked_same_row" in runs:
        # what the CHECK constraints dropped by outbox_0013 cost the same statement
        out["ratio_checked_same_row_over_naive_same_row"] = round(
            medians["checked_same_row"] / medians["naive_same_row"], 3
        )
        out["ratio_checked_same_row_over_naive_inbox"] = round(
            medians["checked_same_row"] / medians["naive_inbox"], 3
        )
    out["runs"] = runs
    return out


# ---- (b) the end-to-end pipeline -----------------------------------------------------------


class _NoInboxRunner(AsyncHandlerRunner):
    """The baseline consumer: transaction, effect, commit; nothing recorded."""

    async def handle(self, message: Any, *, also: Any = None) -> Result:
        async with self.transactions() as conn:
            await self._handler(conn, message)
        return Result(Outcome.PROCESSED, message.id)


async def _apply(conn: psycopg.AsyncConnection[Any], env: Envelope) -> None:
    await conn.execute(
        "UPDATE accounts SET balance = balance + 1 WHERE id = %s", (int(env.key[1:]),)
    )


async def _consume(url: str, stream: str, with_inbox: bool, expected: int, ready: Any) -> None:
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(url, min_size=1, max_size=2, open=False) as pool:
        kind = AsyncHandlerRunner if with_inbox else _NoInboxRunner
        runner = kind(pool, _apply, consumer="bench-e2e")
        settled = 0

        def seen(_env: Envelope, result: Result) -> None:
            nonlocal settled
            if result.outcome is not Outcome.PROCESSED:
                raise AssertionError(f"unexpected outcome {result}")
            settled += 1
            if settled >= expected:
                consumer.stop()

        consumer = NatsConsumer(
            runner, stream=stream, durable="bench", servers=NATS, batch=50, on_result=seen
        )
        task = asyncio.create_task(consumer.run())
        await consumer.ready.wait()
        ready.set()
        await task


def _consumer_process(url: str, stream: str, with_inbox: bool, expected: int, ready: Any) -> None:
    asyncio.run(_consume(url, stream, with_inbox, expected, ready))


def _fill_outbox(url: str, topic: str, count: int) -> None:
    """``count`` messages over 100 keys, committed in transactions of 100, before the run."""
    with psycopg.connect(url) as conn:
        for start in range(0, count, 100):
            publish_batch(
                conn,
                [
                    Message(topic, f"k{i % 100}", {"n": i})
                    for i in range(start, min(start + 100, count))
                ],
            )
            conn.commit()


async def _pipeline_run(ctx: Any, url: str, with_inbox: bool, count: int) -> float:
    import nats
    from nats.js.api import ConsumerConfig, StreamConfig

    from relay import Relay, RelayConfig
    from relay.brokers import publisher_for_url

    tag = uuid.uuid4().hex[:8]
    topic, subject, stream = f"bench_{tag}", f"bench.e2e.{tag}", f"BENCH_E2E_{tag}"
    await asyncio.to_thread(_fill_outbox, url, topic, count)
    nc = await nats.connect(NATS)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await js.add_consumer(stream, ConsumerConfig(durable_name="bench", ack_policy="explicit"))
    ready = ctx.Event()
    proc = ctx.Process(target=_consumer_process, args=(url, stream, with_inbox, count, ready))
    proc.start()
    try:
        if not await asyncio.to_thread(ready.wait, 60):
            raise RuntimeError("the consumer process did not subscribe within 60 s")
        relay = Relay(
            RelayConfig(database_url=url, poll_interval=0.2),
            publisher_for_url(NATS, destinations={topic: subject}),
        )
        began = time.perf_counter()
        relay_task = asyncio.create_task(relay.run())
        await asyncio.to_thread(proc.join, 300)  # the consumer exits once it settled `count`
        elapsed = time.perf_counter() - began
        relay.stop()
        await relay_task
        if proc.exitcode != 0:
            raise RuntimeError(f"the consumer process failed (exit code {proc.exitcode})")
    finally:
        if proc.is_alive():
            proc.kill()
        await js.delete_stream(stream)
        await nc.close()
    return count / elapsed


def _pipeline(ctx: Any, url: str, rounds: int, count: int) -> dict[str, Any]:
    runs: dict[str, list[float]] = {"without_inbox": [], "with_inbox": []}
    # One short run first, not counted: the first run in a process pays for imports, the first
    # connections and the broker's first stream (it measured 3-4x slower than the rest).
    asyncio.run(_pipeline_run(ctx, url, False, min(count, 500)))
    for round_no in range(rounds):
        for variant in rotated(tuple(runs), round_no):
            rate = asyncio.run(_pipeline_run(ctx, url, variant == "with_inbox", count))
            runs[variant].append(round(rate, 1))
            print("pipeline", variant, runs[variant][-1], flush=True)
    return _summary(runs, "msgs_per_s")


# ---- the run -------------------------------------------------------------------------------


def _database(admin_url: str) -> tuple[str, str]:
    name = f"outbox_bench_inbox_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        for table in ("bare_inbox", "naive_inbox"):
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (consumer text, message_id uuid, "
                    "PRIMARY KEY (consumer, message_id))"
                ).format(sql.Identifier(table))
            )
        conn.execute("CREATE TABLE naive_same_row (LIKE inbox_messages INCLUDING ALL)")
        conn.execute(
            "CREATE TABLE checked_same_row (LIKE inbox_messages INCLUDING ALL, "
            + ", ".join(OLD_CHECKS)
            + ")"
        )
        conn.execute(
            "INSERT INTO accounts SELECT g, 0 FROM generate_series(0, %s) g",
            (MAX_CONSUMERS * ROWS_PER_CONSUMER,),
        )
    return name, url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=len(VARIANTS))
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--pipeline-rounds", type=int, default=4, help="0: skip part (b)")
    parser.add_argument(
        "--no-save", action="store_true", help="print only; leave bench/results/inbox.json"
    )
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    name, url = _database(args.url)
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    try:
        for consumers in (1, MAX_CONSUMERS):
            key = f"{consumers}_consumers"
            results[key] = _measure(ctx, url, consumers, args.rounds, args.seconds)
            print(key, {k: v for k, v in results[key].items() if k != "runs"}, flush=True)
        pipeline = (
            _pipeline(ctx, url, args.pipeline_rounds, args.messages) if args.pipeline_rounds else {}
        )
        print("pipeline", {k: v for k, v in pipeline.items() if k != "runs"}, flush=True)
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    if args.no_save:
        return
    path = write_result(
        "inbox",
        {
            "what": "consumer transaction: [inbox receive +] one UPDATE of a business row, commit",
            "consumers_are": "OS processes (spawn), one psycopg connection each",
            "message_ids": "UUIDv7, as the outbox assigns them",
            "seconds_per_run": args.seconds,
            "rounds": args.rounds,
            "order": "rotated: each round starts one variant later",
            "target": "with_inbox >= 0.9 x naive_inbox at 1 and 8 consumers",
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "results": results,
            "pipeline": {
                "what": "outbox -> relay -> NATS JetStream -> NatsConsumer (1 process, batch "
                "50), effect = one UPDATE; N messages committed first, over 100 keys",
                "messages_per_run": args.messages,
                "rounds": args.pipeline_rounds,
                **pipeline,
            },
        },
    )
    print(path)


if __name__ == "__main__":
    main()
