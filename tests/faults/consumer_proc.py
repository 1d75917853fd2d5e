"""One ordered consumer process of the fault suite.

    python consumer_proc.py DATABASE_URL BROKER BROKER_URL SOURCE NAME CRASH_PROBABILITY

``BROKER`` is ``nats`` (SOURCE: the stream; the durable consumer is ``NAME``), ``sqs``
(BROKER_URL: the endpoint; SOURCE: the queue) or ``amqp1`` (SOURCE: the address). The consumer
(NatsConsumer, SqsConsumer, Amqp1Consumer) feeds an AsyncHandlerRunner (ordered=True,
max_attempts=3, on_dead="skip"). The handler writes one ``effects`` row per message in the
inbox's transaction, and raises for a poison message. With a crash probability, the process
kills itself (SIGKILL, no cleanup) right after a delivery's commit and before its ack, the worst
moment for a consumer to die. Exits on SIGTERM after the message in hand.
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

from inbox import (
    Amqp1Consumer,
    AsyncHandlerRunner,
    BrokerConsumer,
    NatsConsumer,
    Result,
    SqsConsumer,
)
from outbox.envelope import Envelope


def _consumer(
    runner: AsyncHandlerRunner, broker: str, broker_url: str, source: str, name: str,
    on_result: Any,
) -> BrokerConsumer:  # fmt: skip
    if broker == "nats":
        return NatsConsumer(
            runner, stream=source, durable=name, servers=broker_url, batch=20,
            fetch_timeout=0.5, redeliver_delay=0.2, on_result=on_result,
        )  # fmt: skip
    if broker == "sqs":  # a crashed consumer's messages come back after the visibility timeout
        return SqsConsumer(
            runner, queue=source, endpoint_url=broker_url, wait_seconds=1,
            visibility_timeout=4, redeliver_delay=0.2, on_result=on_result,
        )  # fmt: skip
    if broker == "amqp1":
        return Amqp1Consumer(
            runner, address=source, url=broker_url, credit=20, redeliver_delay=0.2,
            connect_timeout=2, on_result=on_result,
        )  # fmt: skip
    raise SystemExit(f"unknown broker {broker!r}")


async def main(url: str, broker: str, broker_url: str, source: str, name: str,
               crash: float) -> None:  # fmt: skip
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
        consumer = _consumer(runner, broker, broker_url, source, name, after_commit)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
        await consumer.run()


if __name__ == "__main__":
    url, broker, broker_url, source, name, crash = sys.argv[1:7]
    asyncio.run(main(url, broker, broker_url, source, name, float(crash)))
