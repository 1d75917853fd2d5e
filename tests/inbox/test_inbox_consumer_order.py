"""Regressions of the push consumers' own delivery order and of their shutdown, on live brokers.

* RabbitMQ's client starts a task per delivery; those tasks handed their messages to the
  consumer's bounded worker buffer in whatever order the event loop woke them, so a queue
  holding every key in order was applied with OUT_OF_ORDER refusals (each one a redelivery).
  An in-order backlog must be applied with none.
* A consumer stopped in the middle of a backlog returns from ``run()`` promptly: its workers
  are stopped even when a delivery reaches a worker in the instant it is cancelled.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Batching, Outcome
from inbox.testing import ResultLog
from tests.inbox.broker_fixtures import BROKERS, Broker, RabbitMQ
from tests.inbox.inbox_helpers import effects, make_envelope
from tests.support.services import require_port

KEYS, PER_KEY = 40, 25


async def _apply(conn: Any, msg: Any) -> None:
    await conn.execute(
        "INSERT INTO effects (consumer, message_id, key, seq) VALUES ('svc', %s, %s, %s)",
        (msg.id, msg.key, msg.seq),
    )


def _backlog() -> list[Any]:
    """Every key's messages in seq order, the keys interleaved (the relay's layout)."""
    return [make_envelope(key=f"k{k}", seq=n) for n in range(1, PER_KEY + 1) for k in range(KEYS)]


class _WidePrefetch(RabbitMQ):
    """RabbitMQ with a window wide enough for many deliveries to wait on a full buffer."""

    def consumer(self, runner: Any, on_result: Any, instance: int) -> Any:
        consumer = super().consumer(runner, on_result, instance)
        consumer.prefetch = 200
        return consumer


async def _drain(
    broker: Broker, url: str, batching: Batching | None
) -> tuple[list[Any], ResultLog]:
    broker.batching = batching
    log = ResultLog()
    stream = _backlog()
    await broker.setup()
    try:
        await broker.publish(stream)  # a backlog: the consumer starts with the queue full
        async with AsyncConnectionPool(url, min_size=1, max_size=4, open=False) as pool:
            runner = AsyncHandlerRunner(pool, _apply, consumer="svc", ordered=True)
            consumer = broker.consumer(runner, log, 0)
            task = asyncio.create_task(consumer.run())
            await log.wait_processed([m.id for m in stream], within=120)
            consumer.stop()
            async with asyncio.timeout(10):
                await task
    finally:
        await broker.teardown()
    return stream, log


@pytest.mark.parametrize(
    "batching", [None, Batching(size=20, wait=0.005, workers=4)], ids=["single", "batched"]
)
def test_rabbitmq_in_order_backlog_is_applied_without_out_of_order_refusals(
    effects_url: str, batching: Batching | None
) -> None:
    require_port(RabbitMQ.port, "rabbitmq")
    stream, log = asyncio.run(_drain(_WidePrefetch(), effects_url, batching))
    assert log.outcomes(Outcome.OUT_OF_ORDER) == []
    assert sorted(log.outcomes(Outcome.PROCESSED)) == sorted(m.id for m in stream)
    applied: dict[str, list[int]] = {}
    for _, _, key, seq in effects(effects_url, "svc"):
        applied.setdefault(key, []).append(seq)
    assert applied == {f"k{k}": list(range(1, PER_KEY + 1)) for k in range(KEYS)}


async def _stop_mid_backlog(broker: Broker, url: str, rounds: int) -> list[float]:
    """Stop a consumer a few messages into a backlog, ``rounds`` times; how long each took."""
    broker.batching = Batching(size=5, wait=0.002, workers=3)
    stream = _backlog()
    took = []
    await broker.setup()
    try:
        await broker.publish(stream)
        async with AsyncConnectionPool(url, min_size=1, max_size=4, open=False) as pool:
            runner = AsyncHandlerRunner(pool, _apply, consumer="svc", ordered=True)
            for round_ in range(rounds):
                log = ResultLog()
                consumer = broker.consumer(runner, log, round_)
                task = asyncio.create_task(consumer.run())
                await log.wait_count(10 + round_, within=60)
                loop = asyncio.get_running_loop()
                started = loop.time()
                consumer.stop()
                done, _ = await asyncio.wait([task], timeout=10)
                took.append(loop.time() - started)
                if not done:  # hung: end it, and fail below with the figures
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    break
                task.result()
    finally:
        await broker.teardown()
    return took


@pytest.mark.parametrize("name", ["rabbitmq", "nats", "redis"])
def test_consumer_stopped_mid_backlog_returns_within_its_shutdown(
    effects_url: str, name: str
) -> None:
    broker = BROKERS[name]() if name != "rabbitmq" else _WidePrefetch()
    require_port(broker.port, name)
    took = asyncio.run(_stop_mid_backlog(broker, effects_url, rounds=8))
    assert len(took) == 8, took  # one round hung: ended after 10 s
    assert max(took) < 5, took
