"""One consumer process of the cross-process duplicate storm (tests/inbox/test_inbox_brokers.py).

    python -m tests.inbox.storm_worker '<json: broker spec, url, instance, fail_once>'

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

from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Result
from outbox.envelope import Envelope
from tests.inbox.broker_fixtures import Broker
from tests.inbox.inbox_helpers import FailOnce


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
