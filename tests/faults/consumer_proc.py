"""One ordered consumer process of the fault suite.

    python consumer_proc.py DATABASE_URL NATS_URL STREAM NAME CRASH_PROBABILITY

Pulls from the durable ``NAME`` on ``STREAM`` with NatsConsumer and an AsyncHandlerRunner
(ordered=True, max_attempts=3, on_dead="skip"). The handler writes one ``effects`` row per
message in the inbox's transaction, and raises for a poison message. With a crash probability,
the process kills itself (SIGKILL, no cleanup) right after a delivery's commit and before its
ack, the worst moment for a consumer to die. Exits on SIGTERM after the message in hand.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
from typing import Any

from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, NatsConsumer, Result
from outbox.envelope import Envelope


async def main(url: str, nats_url: str, stream: str, name: str, crash: float) -> None:
    async def handler(conn: Any, env: Envelope) -> None:
        if json.loads(env.payload).get("poison"):
            raise ValueError(f"poison message {env.id}")
        await conn.execute(
            "INSERT INTO effects (consumer, message_id, topic, key, seq) "
            "VALUES (%s, %s, %s, %s, %s)",
            (name, env.id, env.topic, env.key, env.seq),
        )

    def after_commit(_env: Envelope, _result: Result) -> None:
        if crash and random.random() < crash:
            os.kill(os.getpid(), signal.SIGKILL)  # committed, never acknowledged

    async with AsyncConnectionPool(url, min_size=1, max_size=2, open=False) as pool:
        runner = AsyncHandlerRunner(
            pool, handler, consumer=name, ordered=True, max_attempts=3, on_dead="skip"
        )
        consumer = NatsConsumer(
            runner, stream=stream, durable=name, servers=nats_url, batch=20,
            fetch_timeout=0.5, redeliver_delay=0.2, on_result=after_commit,
        )  # fmt: skip
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
        await consumer.run()


if __name__ == "__main__":
    url, nats_url, stream, name, crash = sys.argv[1:6]
    asyncio.run(main(url, nats_url, stream, name, float(crash)))
