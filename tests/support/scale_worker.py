"""One ordered consumer process of several sharing one consumer name (scale-out tests, the
fault suite's consumer-group scenarios, bench/scale_out.py).

    python -m tests.support.scale_worker URL BROKER BROKER_URL SOURCE CONSUMER
        [--delay-ms MS] [--session-ms MS] [--pool N] [--idle-ms MS]
        [--partitions P --subject SUBJECT --lease S]

``BROKER``: ``kafka`` (BROKER_URL: bootstrap servers; SOURCE: the topic; the group is
CONSUMER), ``sqs`` (BROKER_URL: the endpoint; SOURCE: a FIFO queue), ``nats`` (today's
non-partitioned NatsConsumer: SOURCE is the stream, CONSUMER the durable), ``nats-partitioned``
(an inbox.PartitionedConsumer of ``--partitions`` NatsConsumers on the stream SOURCE, one per
partition, on ``--subject`` with ``{partition}`` in it; leases of ``--lease`` seconds),
``kafka-partitioned`` (an inbox.PartitionedConsumer of ``--partitions`` KafkaConsumers, each
assigned one partition of the topic SOURCE, offsets in the database; the same leases).

The handler is I/O-bound on purpose: it notes its start, awaits ``--delay-ms`` (a stand-in
for a call to another service), and writes one ``applies`` row in the inbox's transaction
(``scale_out.SCHEMA``): the message, its key and seq, this process's pid and the handler's
start and end (wall clock, seconds). Only committed applies leave a row. Every second it also
writes to ``scale_procs`` its count of out-of-order refusals and whether it is ready (joined:
the broker's or the lease's first assignment done). Exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from typing import Any

from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Outcome, Result
from outbox.envelope import Envelope


def _consumer(
    runner: AsyncHandlerRunner, args: argparse.Namespace, on_result: Any, side: Any
) -> Any:
    if args.broker in ("nats-partitioned", "kafka-partitioned"):
        from inbox import Lease, PartitionedConsumer

        factory = _partition_factory(args, on_result)
        lease = Lease(duration=args.lease, heartbeat=args.lease / 5, stop_timeout=args.lease / 4,
                      stall=args.lease / 2)  # fmt: skip
        return PartitionedConsumer(runner, partitions=args.partitions, factory=factory,
                                   lease=lease, leases=side)  # fmt: skip
    if args.broker == "kafka":
        from inbox import KafkaConsumer

        config = {
            "bootstrap.servers": args.broker_url, "group.id": args.consumer,
            "session.timeout.ms": args.session_ms,
            "heartbeat.interval.ms": max(100, args.session_ms // 10),
        }  # fmt: skip
        return KafkaConsumer(
            runner, config=config, topics=[args.source], poll_timeout=0.2, redeliver_delay=0.2,
            on_result=on_result,
        )  # fmt: skip
    if args.broker == "sqs":
        from inbox import SqsConsumer

        return SqsConsumer(
            runner, queue=args.source, endpoint_url=args.broker_url, wait_seconds=1,
            visibility_timeout=10, redeliver_delay=0.2, on_result=on_result,
        )  # fmt: skip
    if args.broker == "nats":
        from inbox import NatsConsumer

        return NatsConsumer(
            runner, stream=args.source, durable=args.consumer, servers=args.broker_url,
            batch=20, fetch_timeout=0.5, redeliver_delay=0.2, on_result=on_result,
        )  # fmt: skip
    raise SystemExit(f"unknown broker {args.broker!r}")


def _partition_factory(args: argparse.Namespace, on_result: Any) -> Any:
    from inbox import PARTITION, KafkaConsumer, NatsConsumer, per_partition

    if args.broker == "kafka-partitioned":
        config = {"bootstrap.servers": args.broker_url, "group.id": args.consumer}
        return per_partition(
            KafkaConsumer, config=config, topics=[args.source], partitions=[PARTITION],
            offsets_in_db=True, poll_timeout=0.2, redeliver_delay=0.2, on_result=on_result,
        )  # fmt: skip
    return per_partition(
        NatsConsumer, stream=args.source, subject=args.subject, servers=args.broker_url,
        durable=f"{args.consumer}-p{{partition}}", batch=20, fetch_timeout=0.5,
        redeliver_delay=0.2, on_result=on_result,
    )  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    pid, delay = os.getpid(), args.delay_ms / 1000.0
    refused = 0

    async def handler(conn: Any, env: Envelope) -> None:
        started = time.time()
        if delay:
            await asyncio.sleep(delay)  # the remote call
        await conn.execute(
            "INSERT INTO applies (consumer, message_id, key, seq, pid, started, ended) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (args.consumer, env.id, env.key, env.seq, pid, started, time.time()),
        )

    def on_result(_env: Envelope, result: Result) -> None:
        nonlocal refused
        refused += result.outcome is Outcome.OUT_OF_ORDER

    async def report(pool: AsyncConnectionPool[Any], consumer: Any) -> None:
        since = time.time()  # imports done, pools open: the process starts to join now
        while True:
            async with pool.connection() as conn:
                await conn.execute(
                    "INSERT INTO scale_procs (pid, consumer, refused, ready, since) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (pid) DO UPDATE "
                    "SET refused = excluded.refused, ready = excluded.ready",
                    (pid, args.consumer, refused, consumer.ready.is_set(), since),
                )
            await asyncio.sleep(1.0)

    # a process frozen inside a transaction holds its message's inbox row (and so its key)
    # until the database ends its session: idle_in_transaction_session_timeout bounds that
    options = {"options": f"-c idle_in_transaction_session_timeout={args.idle_ms}"}
    # the handlers' pool, and one for the bookkeeping (the partitioned consumer's leases, the
    # reports), so that a lease renewal never waits behind the handlers' transactions
    async with (
        AsyncConnectionPool(
            args.url, min_size=1, max_size=args.pool, open=False, kwargs=options
        ) as pool,
        AsyncConnectionPool(args.url, min_size=1, max_size=2, open=False) as side,
    ):
        runner = AsyncHandlerRunner(pool, handler, consumer=args.consumer, ordered=True)
        consumer = _consumer(runner, args, on_result, side)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
        reporter = asyncio.create_task(report(side, consumer))
        try:
            await consumer.run()
        finally:
            reporter.cancel()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("url", "broker", "broker_url", "source", "consumer"):
        parser.add_argument(name)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--session-ms", type=int, default=6000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--subject", default=None)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--pool", type=int, default=3, help="database connections at most")
    parser.add_argument("--idle-ms", type=int, default=0, help="0: no idle-in-transaction limit")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
