"""The ordered consumer on RabbitMQ against the same consumer on NATS JetStream, same backlog.

    python bench/consumer_order.py [--messages 10000] [--keys 200] [--rounds 3]

Each round, for each broker, on a fresh database, queue or stream: ``--messages`` messages over
``--keys`` keys, every key in seq order and the keys interleaved (seq 1 of every key, then seq
2, ...), published with the broker's own client as the relay encodes them (``outbox.wire``),
then drained by one ordered consumer (``ordered=True``, the handler inserting one effect row)
in this process, in two settings: the documented defaults (one message per transaction) and
``Batching(size=100, workers=4)``. Rate = messages / (last commit seen by ``on_result`` -
``run()`` started). Counted: OUT_OF_ORDER refusals (each one a redelivery). Each run is checked:
every message applied once and each key in seq order.

What bounds both brokers' rate at one message per transaction: a commit per message (the
consumer's own PostgreSQL round trips: record, position, effect, commit), not the broker;
batched, the broker's settle (RabbitMQ: an ack frame per message) and the decoding.

Writes bench/results/consumer_order.json with the medians and the RabbitMQ/NATS ratios.
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
from bench.relay_e2e import create_db, drop_db
from inbox import AsyncHandlerRunner, Batching, NatsConsumer, Outcome, RabbitMQConsumer
from outbox import wire
from outbox.envelope import Envelope

NATS_URL = "nats://127.0.0.1:4222"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
SETTINGS: dict[str, Batching | None] = {
    "single": None,
    "batched_100x4": Batching(size=100, wait=0.005, workers=4),
}


def backlog(n: int, keys: int) -> list[Envelope]:
    per_key = n // keys
    return [
        Envelope(id=uuid.uuid4(), topic="orders", key=f"k{k}", seq=s, payload=b'{"n": 1}')
        for s in range(1, per_key + 1)
        for k in range(keys)
    ]


async def _handle(conn: Any, msg: Envelope) -> None:
    await conn.execute(
        "INSERT INTO effects (message_id, key, seq) VALUES (%s, %s, %s)", (msg.id, msg.key, msg.seq)
    )


class Drain:
    """``on_result``: counts outcomes and notes the last commit."""

    def __init__(self, n: int) -> None:
        self.n, self.processed, self.refused, self.last = n, 0, 0, 0.0
        self.done = asyncio.Event()

    def __call__(self, envelope: Envelope, result: Any) -> None:
        if result.outcome is Outcome.PROCESSED:
            self.processed += 1
            self.last = time.perf_counter()
            if self.processed == self.n:
                self.done.set()
        elif result.outcome is Outcome.OUT_OF_ORDER:
            self.refused += 1


async def _publish_nats(messages: list[Envelope], tag: str) -> tuple[Any, str, str]:
    import nats
    from nats.js.api import ConsumerConfig, StreamConfig

    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    stream, subject = f"BENCH_ORDER_{tag}", f"bench.order.{tag}"
    await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await js.add_consumer(stream, ConsumerConfig(durable_name="svc", ack_policy="explicit"))
    for chunk in range(0, len(messages), 500):
        acks = []
        for env in messages[chunk : chunk + 500]:
            msg = wire.nats.encode(env)
            acks.append(js.publish(subject, msg.data, headers=msg.headers))
        await asyncio.gather(*acks)
    return nc, stream, subject


async def _publish_rabbitmq(messages: list[Envelope], tag: str) -> tuple[Any, str]:
    import aio_pika

    conn = await aio_pika.connect(AMQP_URL)
    channel = await conn.channel()
    queue = f"bench-order-{tag}"
    await channel.declare_queue(queue, durable=True)
    for chunk in range(0, len(messages), 500):
        sends = []
        for env in messages[chunk : chunk + 500]:
            msg = wire.rabbitmq.encode(env)
            message = aio_pika.Message(
                msg.body,
                message_id=msg.message_id,
                content_type=msg.content_type,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                headers=dict(msg.headers),
            )
            sends.append(channel.default_exchange.publish(message, queue))
        await asyncio.gather(*sends)  # confirmed, in publish order on the one channel
    return conn, queue


def _check(url: str, n: int) -> None:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT key, seq FROM effects ORDER BY at, ctid").fetchall()
    assert len(rows) == n, f"{len(rows)} effects for {n} messages"
    last: dict[str, int] = {}
    for key, seq in rows:
        assert seq == last.get(key, 0) + 1, f"key {key}: seq {seq} after {last.get(key)}"
        last[key] = seq


async def run_one(broker: str, setting: str, n: int, keys: int) -> dict[str, Any]:
    name, url = create_db()
    tag = uuid.uuid4().hex[:8]
    messages = backlog(n, keys)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE effects (message_id uuid PRIMARY KEY, key text, seq bigint,"
                " at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )
        drain = Drain(len(messages))
        async with AsyncConnectionPool(url, min_size=4, max_size=8, open=False) as pool:
            runner = AsyncHandlerRunner(pool, _handle, consumer="svc", ordered=True)
            consumer: NatsConsumer | RabbitMQConsumer
            if broker == "nats":
                nc, stream, subject = await _publish_nats(messages, tag)
                consumer = NatsConsumer(runner, stream=stream, durable="svc", subject=subject,
                                        on_result=drain, batching=SETTINGS[setting])  # fmt: skip
            else:
                conn, queue = await _publish_rabbitmq(messages, tag)
                consumer = RabbitMQConsumer(runner, queue=queue, on_result=drain,
                                            batching=SETTINGS[setting])  # fmt: skip
            started = time.perf_counter()
            task = asyncio.create_task(consumer.run())
            await asyncio.wait_for(drain.done.wait(), 600)
            consumer.stop()
            await task
            if broker == "nats":
                await nc.jetstream().delete_stream(stream)
                await nc.close()
            else:
                channel = await conn.channel()
                await channel.queue_delete(queue)
                await conn.close()
        _check(url, len(messages))
        took = drain.last - started
        return {"took_s": round(took, 3), "msg_per_s": round(len(messages) / took, 1),
                "out_of_order_refusals": drain.refused}  # fmt: skip
    finally:
        drop_db(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated")
    args = parser.parse_args()
    settings = args.settings.split(",")
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(args.rounds):
        for setting in settings:
            brokers = ["nats", "rabbitmq"] if round_ % 2 == 0 else ["rabbitmq", "nats"]
            for broker in brokers:
                row = asyncio.run(run_one(broker, setting, args.messages, args.keys))
                print(broker, setting, row, flush=True)
                runs.setdefault(f"{broker}/{setting}", []).append(row)
    medians = {
        name: {
            "msg_per_s": statistics.median(r["msg_per_s"] for r in rows),
            "out_of_order_refusals": max(r["out_of_order_refusals"] for r in rows),
        }
        for name, rows in runs.items()
    }
    ratios = {
        setting: round(
            medians[f"rabbitmq/{setting}"]["msg_per_s"] / medians[f"nats/{setting}"]["msg_per_s"], 2
        )
        for setting in settings
    }
    path = write_result(
        "consumer_order",
        {
            "messages": args.messages,
            "keys": args.keys,
            "rounds": args.rounds,
            "medians": medians,
            "rabbitmq_over_nats": ratios,
            "runs": runs,
        },
    )
    print(path, medians, ratios)


if __name__ == "__main__":
    main()
