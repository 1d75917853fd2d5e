"""Consumers at pipeline speed: batched ordered consumers with the inbox against the relay
alone and against the batched consumer a user would write by hand, at 1 and 4 workers.

    python bench/consumer_batch.py [--messages 20000] [--keys 200] [--rounds 5] [--io-ms 5]

One run, NATS JetStream on 127.0.0.1:4222, PostgreSQL on 127.0.0.1:5432, one consumer process
(this one), every variant in each round on a fresh database and stream:

(a) relay alone: 20,000 committed messages over 200 keys published by ``outbox relay``
    (default settings, its own process, as in production); rate = messages / (last
    published_at - start).
(b) pipeline: the same backlog, the relay process and, in this process, an ordered
    ``NatsConsumer`` with ``Batching(size=100)`` and the inbox running together (a batch
    handler writes the effect rows in the inbox's transaction); rate = messages / (last
    effect committed - start), the commit seen by the consumer's ``on_result``.
Then drains of the stream (b) left, each with its own durable consumer:
(c) naive batched consumer: fetch 100, one transaction that inserts the effects and the ids
    ``ON CONFLICT DO NOTHING`` (no order guard), commit, ack.
(d) our batched ordered consumer, ``Batching(size=100, workers=1)``, and (d4) the same with
    ``workers=4``.
(e) the I/O-bound case: the same three, with a batch handler that also waits ``--io-ms``
    milliseconds per batch (an HTTP call): (e-naive) the hand-written one waits as long per
    fetch, (e1) ours with one worker, (e4) with four.
The drains are timed as a user would: from the start of the consumer (``run()``, or the naive
loop's subscription) to its last commit, with nothing polling the database meanwhile. Their
order rotates from round to round.

The bench checks in every run that each message was applied once and each key in seq order.
Writes bench/results/consumer_batch.json with medians and the ratios.
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


def _slow(io_seconds: float) -> Any:
    """A batch handler that writes the effects and then waits on I/O (an HTTP call)."""

    async def apply(conn: psycopg.AsyncConnection[Any], messages: list[Any]) -> None:
        await _apply(conn, messages)
        await asyncio.sleep(io_seconds)

    return apply


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
    pool: AsyncConnectionPool,
    stream: str,
    durable: str,
    consumer: str,
    settled: _Settled,
    workers: int = 1,
    io_seconds: float = 0.0,
) -> NatsConsumer:
    handler = _slow(io_seconds) if io_seconds else _apply
    runner = AsyncHandlerRunner(pool, batch_handler=handler, consumer=consumer, ordered=True)
    settled.consumer = NatsConsumer(
        runner, stream=stream, durable=durable, servers=NATS, batch=100, fetch_timeout=0.2,
        batching=Batching(size=100, wait=0.005, workers=workers), on_result=settled,
    )  # fmt: skip
    return settled.consumer


#: the drains of (c), (d) and (e): name -> (ours?, workers, I/O-bound?)
DRAINS: dict[str, tuple[bool, int, bool]] = {
    "naive_batched": (False, 1, False),
    "ours_batched": (True, 1, False),
    "ours_batched_w4": (True, 4, False),
    "naive_batched_io": (False, 1, True),
    "ours_batched_io": (True, 1, True),
    "ours_batched_io_w4": (True, 4, True),
}


async def _pipeline(
    url: str, n: int, keys: int, topic: str, turn: int, io_seconds: float
) -> tuple[float, dict[str, float], list[Any]]:
    """(b), then the drains on the stream it filled, in an order rotated by ``turn``: the
    rate of (b), each drain's rate and the checks of (b) and of our drains."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(NATS)
    js = nc.jetstream()
    stream = await _stream(js, topic)
    for durable in ("ours", *DRAINS):
        config = ConsumerConfig(
            durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=60, max_ack_pending=20_000
        )
        await js.add_consumer(stream, config)
    try:
        async with AsyncConnectionPool(url, min_size=2, max_size=6) as pool:
            settled = _Settled(n)
            consumer = _ours(pool, stream, "ours", "bench", settled)
            started = time.time()
            relay = await _relay(url)
            await asyncio.wait_for(consumer.run(), 600)  # returns once all n are settled
            assert settled.at is not None
            pipeline = n / (settled.at - started)
            await _stop(relay)
            checks = [await asyncio.to_thread(_check, url, n, keys)]

            async def ours(durable: str, workers: int, io: bool) -> float:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    await conn.execute("TRUNCATE effects")
                settled = _Settled(n)
                drain = _ours(pool, stream, durable, f"bench-{durable}", settled, workers,
                              io_seconds if io else 0.0)  # fmt: skip
                began = time.time()  # as a user times it: from run()
                await asyncio.wait_for(drain.run(), 600)
                assert settled.at is not None
                checks.append(await asyncio.to_thread(_check, url, n, keys))
                return n / (settled.at - began)

            names = list(DRAINS)
            names = names[turn % len(names) :] + names[: turn % len(names)]
            rates: dict[str, float] = {}
            for name in names:
                is_ours, workers, io = DRAINS[name]
                if is_ours:
                    rates[name] = await ours(name, workers, io)
                else:
                    rates[name] = n / await _naive(url, js, stream, n, name,
                                                   io_seconds if io else 0.0)  # fmt: skip
        return pipeline, rates, checks
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def _naive(url: str, js: Any, stream: str, n: int, durable: str, io_seconds: float) -> float:
    """The batched consumer a user writes by hand; returns its seconds for ``n`` messages."""
    from nats.errors import TimeoutError as NatsTimeout

    started = committed = time.monotonic()
    sub = await js.pull_subscribe("", durable=durable, stream=stream)
    done = 0
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("TRUNCATE naive_inbox, naive_effects")
        await conn.commit()
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
                if io_seconds:
                    await asyncio.sleep(io_seconds)
            done += len(msgs)
            committed = time.monotonic()  # the clock stops at the last commit, as for ours
            for m in msgs:
                await m.ack()
    await sub.unsubscribe()
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


async def _round(n: int, keys: int, turn: int, io_seconds: float) -> dict[str, Any]:
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
        pipeline, rates, checks = await _pipeline(url, n, keys, topic, turn, io_seconds)
    finally:
        drop_db(name)
    return {"relay_alone": relay_alone, "pipeline": pipeline, **rates, "checks": checks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--io-ms", type=float, default=5.0,
                        help="the I/O-bound batch handler's wait per batch (ms)")  # fmt: skip
    parser.add_argument("--name", default="consumer_batch",
                        help="the results file: bench/results/NAME.json")  # fmt: skip
    args = parser.parse_args()
    rounds = []
    for i in range(args.rounds):
        rounds.append(asyncio.run(_round(args.messages, args.keys, i, args.io_ms / 1000)))
        print({k: (round(v) if isinstance(v, float) else v) for k, v in rounds[-1].items()
               if k != "checks"}, flush=True)  # fmt: skip
    names = ("relay_alone", "pipeline", *DRAINS)
    med = {k: statistics.median(r[k] for r in rounds) for k in names}
    result = {
        "order": "the drains' order rotates by one each round",
        "messages": args.messages,
        "keys": args.keys,
        "io_ms_per_batch": args.io_ms,
        "timed": "drains: from the consumer's start (run(), or the naive loop's subscription) "
        "to its last commit",
        "rounds": rounds,
        "median_msg_per_s": {k: round(v) for k, v in med.items()},
        "ratio_pipeline_to_relay_alone": round(med["pipeline"] / med["relay_alone"], 3),
        "ratio_ours_to_naive_batched": round(med["ours_batched"] / med["naive_batched"], 3),
        "ratio_ours_w4_to_naive_batched": round(
            med["ours_batched_w4"] / med["naive_batched"], 3
        ),
        "ratio_ours_w4_to_w1": round(med["ours_batched_w4"] / med["ours_batched"], 3),
        "ratio_io_ours_w4_to_w1": round(med["ours_batched_io_w4"] / med["ours_batched_io"], 3),
        "ratio_io_ours_w1_to_naive": round(
            med["ours_batched_io"] / med["naive_batched_io"], 3
        ),
        "every_run_once_each_and_in_order": all(
            c["once_each"] and c["in_order"] for r in rounds for c in r["checks"]
        ),
    }
    print(write_result(args.name, result))
    print({k: v for k, v in result.items() if k.startswith(("median", "ratio", "every"))})


if __name__ == "__main__":
    main()
