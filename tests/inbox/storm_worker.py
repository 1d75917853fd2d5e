"""One consumer process of the cross-process duplicate storm (tests/inbox/test_inbox_brokers.py).

    python storm_worker.py '<json: broker spec, url, instance, fail_once>'

Attaches a runner to the broker resources the test process created, prints ``ready`` once it is
subscribed and ``settled <outcome>`` after each delivery, consumes until SIGTERM (then stops
gracefully: the message in hand is committed and acknowledged), and prints one JSON line with
the outcomes it saw.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections import Counter
from typing import Any

import psycopg
from broker_fixtures import Broker
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Result
from outbox.envelope import Envelope


class FailOnce:
    """The effect: one row in ``effects``; the first delivery of ``fail_once`` in this process
    fails after writing it (so the effect is rolled back)."""

    def __init__(self, fail_once: set[uuid.UUID]) -> None:
        self.pending_failures = fail_once

    async def __call__(self, conn: psycopg.AsyncConnection[Any], env: Envelope) -> None:
        await conn.execute(
            "INSERT INTO effects (consumer, message_id, key, seq) VALUES ('svc', %s, %s, %s)",
            (env.id, env.key, env.seq),
        )
        if env.id in self.pending_failures:
            self.pending_failures.discard(env.id)
            raise RuntimeError("first attempt fails")


async def main(args: dict[str, Any]) -> None:
    broker = Broker.attach(args["broker"])
    outcomes: Counter[str] = Counter()

    def seen(_env: Envelope, result: Result) -> None:
        outcomes[result.outcome.value] += 1
        print("settled", result.outcome.value, flush=True)  # the test waits on these lines

    handler = FailOnce({uuid.UUID(i) for i in args["fail_once"]})
    async with AsyncConnectionPool(args["url"], min_size=1, max_size=4, open=False) as pool:
        runner = AsyncHandlerRunner(pool, handler, consumer="svc")
        consumer = broker.consumer(runner, seen, args["instance"])
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
        task = asyncio.create_task(consumer.run())
        ready = asyncio.create_task(consumer.ready.wait())
        await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            print("ready", flush=True)
        await task
    report = {
        "instance": args["instance"],
        "outcomes": dict(outcomes),
        "failures_raised": len(args["fail_once"]) - len(handler.pending_failures),
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
