"""One process of a partitioned consumer (tests/inbox/test_inbox_partitioned.py).

    python -m tests.inbox.partition_worker '<json: url, member, partitions, consumer, settings>'

Runs an ``inbox.PartitionedConsumer`` over ``partitions`` partitions, each with the broker
consumer ``settings["class"]`` built by ``inbox.per_partition`` from ``settings["options"]``.
The handler records each message it applies in the ``applied`` table, with the database's
clock when the handler started and ended and the member that applied it (in the message's own
transaction: a message rolled back leaves no row). Prints ``owned [..]`` each time the
partitions it holds change, stops on SIGTERM (leaving gracefully), then prints one JSON line
with the outcomes it saw.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter
from typing import Any

from psycopg_pool import AsyncConnectionPool

import inbox
from inbox import (
    PARTITION,
    AsyncHandlerRunner,
    Batching,
    Lease,
    PartitionedConsumer,
    Result,
    per_partition,
)
from outbox.envelope import Envelope

APPLIED_DDL = """
CREATE TABLE IF NOT EXISTS applied (
    key text NOT NULL, seq bigint NOT NULL, member text NOT NULL,
    started timestamptz NOT NULL, ended timestamptz NOT NULL
)
"""


def handler_for(member: str, delay: float) -> Any:
    async def handler(conn: Any, env: Envelope) -> None:
        started = (await (await conn.execute("SELECT clock_timestamp() AS t")).fetchone())[0]
        if delay:
            await asyncio.sleep(delay)
        await conn.execute(
            "INSERT INTO applied (key, seq, member, started, ended) "
            "VALUES (%s, %s, %s, %s, clock_timestamp())",
            (env.key, env.seq, member, started),
        )

    return handler


async def watch(consumer: PartitionedConsumer) -> None:
    last: list[int] | None = None
    while True:
        owned = sorted(consumer.owned)
        if owned != last:
            print("owned", json.dumps(owned), flush=True)
            last = owned
        await asyncio.sleep(0.05)


async def main(args: dict[str, Any]) -> None:
    outcomes: Counter[str] = Counter()

    def seen(_env: Envelope, result: Result) -> None:
        outcomes[result.outcome.value] += 1

    settings = args["settings"]
    options = dict(settings["options"])
    options["on_result"] = seen
    batching = settings.get("batching") or args.get("batching") or {"size": 20, "workers": 2}
    options["batching"] = Batching(**batching)
    # JSON has no inbox.PARTITION: the text "PARTITION" in a list setting stands for it
    for name, value in options.items():
        if isinstance(value, list) and "PARTITION" in value:
            options[name] = [PARTITION if v == "PARTITION" else v for v in value]
    factory = per_partition(getattr(inbox, settings["class"]), **options)
    member = args["member"]
    async with (
        AsyncConnectionPool(args["url"], min_size=1, max_size=6, open=False) as pool,
        AsyncConnectionPool(args["url"], min_size=1, max_size=1, open=False) as leases,
    ):
        handler = handler_for(member, args.get("delay", 0.0))
        runner = AsyncHandlerRunner(pool, handler, consumer=args["consumer"], ordered=True)
        consumer = PartitionedConsumer(
            runner,
            partitions=args["partitions"],
            factory=factory,
            lease=Lease(**args.get("lease", {})),
            member=member,
            leases=leases,
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
        watcher = asyncio.create_task(watch(consumer))
        try:
            await consumer.run()
        finally:
            watcher.cancel()
    print(json.dumps({"member": member, "outcomes": dict(outcomes)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
