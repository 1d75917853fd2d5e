"""Consumers at pipeline speed: batched ordered consumers with the inbox against the relay
alone and against the batched consumer a user would write by hand.

    python bench/consumer_batch.py [--messages 20000] [--keys 200] [--rounds 5]

One run, NATS JetStream on 127.0.0.1:4222, PostgreSQL on 127.0.0.1:5432, one consumer process
(this one), every variant in each round on a fresh database and stream:

(a) relay alone: 20,000 committed messages over 200 keys published by ``outbox relay``
    (default settings, its own process, as in production); rate = messages / (last
    published_at - start).
(b) pipeline: the same backlog, the relay process and, in this process, an ordered
    ``NatsConsumer`` with ``Batching(size=100)`` and the inbox running together (a batch
    handler writes the effect rows in the inbox's transaction); rate = messages / (last
    effect committed - start), the commit seen by the consumer's ``on_result``.
(c) naive batched consumer draining the stream (b) left: fetch 100, one transaction that
    inserts the effects and the ids ``ON CONFLICT DO NOTHING`` (no order guard), commit, ack.
(d) our batched consumer draining the same stream on its own (no relay beside it).
(c) and (d) are timed alike: from the consumer's subscription to its last commit, with
nothing polling the database meanwhile.
(c) goes first in even rounds, (d) in odd ones.

The bench checks in every run that each message was applied once and each key in seq order.
Writes bench/results/consumer_batch.json with medians and the ratios (b)/(a) and (d)/(c).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.common import write_result
from bench.relay_e2e import create_db, drop_db, fill
from inbox import AsyncHandlerRunner, Batching, NatsConsumer

NATS = "nats://127.0.0.1:4222"
EFFECTS = """
CREATE TABLE effects (message_id uuid PRIMARY KEY, key text NOT NULL, seq bigint,
                      at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE naive_inbox (message_id uuid PRIMARY KEY);
CREATE TABLE naive_effects (message_id uuid NOT NULL, key text NOT NULL, seq bigint);
"""


async def _apply(conn: psycopg.AsyncConnection[Any], messages: list[Any]) -> None:
    """The batch handler: the effects of the whole batch in one statement."""
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO effects (message_id, key, seq) VALUES (%s, %s, %s)",
            [(m.id, m.key, m.seq) for m in messages],
        )


async def _stream(js: Any, subject: str) -> str:
    name = f"CB_{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=name, subjects=[subject], duplicate_window=120)
    return name


async def _relay(url: str) -> asyncio.subprocess.Process:
    """``outbox relay`` with default settings in its own process, as it runs in production
    (the topic is the subject)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "outbox.cli", "relay", "--url", url, "--broker", NATS,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def _stop(proc: asyncio.subprocess.Process) -> None:
    proc.terminate()
    await proc.wait()


async def _relay_alone(url: str, n: int, topic: str) -> float:
    import nats

    nc = await nats.connect(NATS)
    js = nc.jetstream()
    stream = await _stream(js, topic)
    try:
        started = time.time()
        relay = await _relay(url)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FILTER (WHERE status <> 'published'), "
                    "extract(epoch FROM max(published_at)) FROM outbox_messages"
                )
                row = await cur.fetchone()
                assert row is not None
                if row[0] == 0:
                    break
                await asyncio.sleep(0.05)
        await _stop(relay)
        return n / (float(row[1]) - started)
    finally:
        await js.delete_stream(stream)
        await nc.close()


class _Settled:
    """``on_result`` for our consumer: counts the messages it settled, notes the time the n-th
    one was committed, and stops the consumer then (it acks what it holds before it stops)."""

    def __init__(self, n: int) -> None:
        self.n, self.count = n, 0
        self.at: float | None = None
        self.consumer: NatsConsumer | None = None

    def __call__(self, _envelope: Any, _result: Any) -> None:
        self.count += 1
        if self.count == self.n:
            self.at = time.time()
            assert self.consumer is not None
            self.consumer.stop()


def _ours(
    pool: AsyncConnectionPool, stream: str, durable: str, consumer: str, settled: _Settled
) -> NatsConsumer:
    runner = AsyncHandlerRunner(pool, batch_handler=_apply, consumer=consumer, ordered=True)
    settled.consumer = NatsConsumer(
        runner, stream=stream, durable=durable, servers=NATS, batch=100, fetch_timeout=0.2,
        batching=Batching(size=100, wait=0.005), on_result=settled,
    )  # fmt: skip
    return settled.consumer


async def _pipeline(
    url: str, n: int, keys: int, topic: str, ours_first: bool
) -> tuple[float, float, float, list[Any]]:
    """(b), then (c) and (d) on the stream it filled: their three rates and the checks of
    (b) and (d)."""
    import nats
    from nats.js.api import ConsumerConfig

    nc = await nats.connect(NATS)
    js = nc.jetstream()
    stream = await _stream(js, topic)
    for durable in ("ours", "naive", "ours_alone"):
        config = ConsumerConfig(
            durable_name=durable, ack_policy="explicit", ack_wait=60, max_ack_pending=20_000
        )
        await js.add_consumer(stream, config)
    try:
        async with AsyncConnectionPool(url, min_size=2, max_size=4) as pool:
            settled = _Settled(n)
            consumer = _ours(pool, stream, "ours", "bench", settled)
            started = time.time()
            relay = await _relay(url)
            await asyncio.wait_for(consumer.run(), 600)  # returns once all n are settled
            assert settled.at is not None
            pipeline = n / (settled.at - started)
            await _stop(relay)
            checks = [await asyncio.to_thread(_check, url, n, keys)]

            async def ours_alone() -> float:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    await conn.execute("TRUNCATE effects")
                settled = _Settled(n)
                alone = _ours(pool, stream, "ours_alone", "bench-alone", settled)
                task = asyncio.create_task(alone.run())
                # from its subscription, as the naive consumer's clock starts after its own
                await asyncio.wait_for(alone.ready.wait(), 60)
                began = time.time()
                await asyncio.wait_for(task, 600)
                assert settled.at is not None
                rate = n / (settled.at - began)
                checks.append(await asyncio.to_thread(_check, url, n, keys))
                return rate

            # (c) and (d) take turns at going first, so neither always meets the other's
            # leftovers (autovacuum, dirty pages) or the machine's drift within a round
            if ours_first:
                ours = await ours_alone()
                naive = n / await _naive(url, js, stream, n)
            else:
                naive = n / await _naive(url, js, stream, n)
                ours = await ours_alone()
        return pipeline, naive, ours, checks
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def _naive(url: str, js: Any, stream: str, n: int) -> float:
    """The batched consumer a user writes by hand; returns its seconds for ``n`` messages."""
    from nats.errors import TimeoutError as NatsTimeout

    sub = await js.pull_subscribe("", durable="naive", stream=stream)
    done = 0
    started = committed = time.monotonic()
    async with await psycopg.AsyncConnection.connect(url) as conn:
        while done < n:
            try:
                msgs = await sub.fetch(100, timeout=0.2)
            except (NatsTimeout, TimeoutError):
                continue
            rows = [(uuid.UUID(m.headers["outbox-id"]), m.headers["outbox-key"],
                     int(m.headers["outbox-seq"])) for m in msgs]  # fmt: skip
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO naive_inbox (message_id) VALUES (%s) ON CONFLICT DO NOTHING",
                    [(r[0],) for r in rows],
                )
                await cur.executemany(
                    "INSERT INTO naive_effects (message_id, key, seq) VALUES (%s, %s, %s)", rows
                )
            done += len(msgs)
            committed = time.monotonic()  # the clock stops at the last commit, as for ours
            for m in msgs:
                await m.ack()
    return committed - started


def _check(url: str, n: int, keys: int) -> dict[str, Any]:
    """Each message once, each key in seq order (by commit time of its effect)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT key, seq FROM effects ORDER BY at").fetchall()
    seqs: dict[str, list[int]] = {}
    for key, seq in rows:
        seqs.setdefault(key, []).append(seq)
    in_order = all(s == list(range(1, len(s) + 1)) for s in seqs.values())
    return {"applied": len(rows), "expected": n, "keys": len(seqs), "in_order": in_order,
            "once_each": len(rows) == n and len(seqs) == keys}  # fmt: skip


async def _round(n: int, keys: int, ours_first: bool) -> dict[str, Any]:
    name, url = create_db()
    try:
        topic = f"cb{uuid.uuid4().hex[:8]}"
        await asyncio.to_thread(fill, url, topic, n, keys)
        relay_alone = await _relay_alone(url, n, topic)
    finally:
        drop_db(name)
    name, url = create_db()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(EFFECTS)
        topic = f"cb{uuid.uuid4().hex[:8]}"
        await asyncio.to_thread(fill, url, topic, n, keys)
        pipeline, naive, ours, checks = await _pipeline(url, n, keys, topic, ours_first)
    finally:
        drop_db(name)
    return {"relay_alone": relay_alone, "pipeline": pipeline, "naive_batched": naive,
            "ours_batched": ours, "checks": checks}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds = [
        asyncio.run(_round(args.messages, args.keys, ours_first=i % 2 == 1))
        for i in range(args.rounds)
    ]
    for r in rounds:
        print({k: (round(v) if isinstance(v, float) else v) for k, v in r.items()})
    med = {k: statistics.median(r[k] for r in rounds)
           for k in ("relay_alone", "pipeline", "naive_batched", "ours_batched")}  # fmt: skip
    result = {
        "order": "(c) before (d) in even rounds, (d) before (c) in odd ones",
        "messages": args.messages,
        "keys": args.keys,
        "rounds": rounds,
        "median_msg_per_s": {k: round(v) for k, v in med.items()},
        "ratio_pipeline_to_relay_alone": round(med["pipeline"] / med["relay_alone"], 3),
        "ratio_ours_to_naive_batched": round(med["ours_batched"] / med["naive_batched"], 3),
        "every_run_once_each_and_in_order": all(
            c["once_each"] and c["in_order"] for r in rounds for c in r["checks"]
        ),
    }
    print(write_result("consumer_batch", result))
    print(result["median_msg_per_s"], result["ratio_pipeline_to_relay_alone"],
          result["ratio_ours_to_naive_batched"])  # fmt: skip


if __name__ == "__main__":
    main()
