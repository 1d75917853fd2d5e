"""Consumer runners against the live brokers of this machine (Kafka: librdkafka mock cluster).

* duplicate storm: every message published 1-5 times, consumed concurrently by two runners
  (own broker connection, own database pool), one message failing once: exactly one effect per
  message, and the failed one redelivered and processed.
* crash between commit and ack: the delivery is redelivered to a fresh runner and found a
  duplicate: still one effect.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import psycopg
import pytest
from broker_fixtures import BROKERS, Broker, Kafka, reachable
from inbox_helpers import effects, make_envelope
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Outcome
from inbox.testing import ResultLog


class Crash(Exception):
    """Raised between the database commit and the broker ack."""


def _broker(name: str) -> Broker:
    broker = BROKERS[name]()
    if broker.port and not reachable(broker.port):
        pytest.skip(f"{name} is not reachable on 127.0.0.1:{broker.port}")
    return broker


class FailOnce:
    """The effect handler; it fails the first delivery of the ids in ``fail_once``."""

    def __init__(self, fail_once: set[uuid.UUID] = frozenset()) -> None:  # type: ignore[assignment]
        self.pending_failures = set(fail_once)

    async def __call__(self, conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        await conn.execute(
            "INSERT INTO effects (consumer, message_id, key, seq) VALUES ('svc', %s, %s, %s)",
            (env.id, env.key, env.seq),
        )
        if env.id in self.pending_failures:
            self.pending_failures.discard(env.id)
            raise RuntimeError("first attempt fails")


async def _run_storm(broker: Broker, url: str) -> ResultLog:
    rng = random.Random(11)
    messages = [make_envelope(key=f"k{i}", seq=1, payload=b'{"i": %d}' % i) for i in range(12)]
    copies = [m for m in messages for _ in range(rng.randint(1, 5))]
    rng.shuffle(copies)
    handler = FailOnce({messages[0].id})
    log = ResultLog()
    await broker.setup()
    pools = [AsyncConnectionPool(url, min_size=1, max_size=4, open=False) for _ in range(2)]
    try:
        for pool in pools:
            await pool.open()
        consumers = [
            broker.consumer(AsyncHandlerRunner(pool, handler, consumer="svc"), log, i)
            for i, pool in enumerate(pools)
        ]
        tasks = [asyncio.create_task(c.run()) for c in consumers]
        async with asyncio.timeout(20):
            await asyncio.gather(*(c.ready.wait() for c in consumers))
        await broker.publish(copies)
        # every copy handled, plus each failed attempt redelivered
        await log.wait_for(
            lambda lg: len(lg.results) >= len(copies) + len(lg.outcomes(Outcome.FAILED)), within=30
        )
        await log.wait_processed([m.id for m in messages], within=10)
        for c in consumers:
            c.stop()
        await asyncio.gather(*tasks)
    finally:
        for pool in pools:
            await pool.close()
        await broker.teardown()
    assert sorted(log.outcomes(Outcome.PROCESSED)) == sorted(m.id for m in messages)
    assert not handler.pending_failures  # the failure happened...
    # ...and was redelivered (FAILED), unless a concurrent copy processed the message meanwhile
    # (then the failed delivery is settled as a DUPLICATE)
    assert log.outcomes(Outcome.FAILED) in ([], [messages[0].id])
    return log


@pytest.mark.parametrize("name", list(BROKERS))
def test_duplicate_storm_one_effect_per_message(effects_url: str, name: str) -> None:
    broker = _broker(name)
    asyncio.run(_run_storm(broker, effects_url))
    applied = [row[1] for row in effects(effects_url, "svc")]
    assert len(applied) == len(set(applied)) == 12


async def _run_crash(broker: Broker, url: str) -> tuple[ResultLog, ResultLog]:
    first_msg, second_msg = make_envelope(), make_envelope(key="k2")
    handler = FailOnce()
    crashed, after = ResultLog(), ResultLog()

    def crash(env: Any, result: Any) -> None:
        crashed(env, result)
        raise Crash  # after the commit, before the ack

    await broker.setup()
    try:
        async with AsyncConnectionPool(url, min_size=1, max_size=2, open=False) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer="svc")
            doomed = broker.consumer(runner, crash, 0)
            task = asyncio.create_task(doomed.run())
            async with asyncio.timeout(20):
                await doomed.ready.wait()
            await broker.publish([first_msg])
            await crashed.wait_count(1, within=20)
            doomed.stop()  # the crashed runner goes away without acknowledging
            with pytest.raises(Crash):
                await task
            fresh = broker.consumer(runner, after, 0)
            task = asyncio.create_task(fresh.run())
            await broker.publish([second_msg])
            await after.wait_processed([second_msg.id], within=30)
            if not getattr(broker, "offsets_in_db", False):
                await after.wait_processed([first_msg.id], within=30)
            fresh.stop()
            await task
    finally:
        await broker.teardown()
    return crashed, after


@pytest.mark.parametrize("name", list(BROKERS))
def test_crash_between_commit_and_ack_redelivers_without_second_effect(
    effects_url: str, name: str
) -> None:
    broker = _broker(name)
    crashed, after = asyncio.run(_run_crash(broker, effects_url))
    first_id = crashed.results[0][0].id
    assert crashed.outcomes(Outcome.PROCESSED) == [first_id]
    assert first_id in after.outcomes(Outcome.DUPLICATE)  # redelivered, no second effect
    assert len(effects(effects_url, "svc")) == 2


def test_kafka_offsets_in_db_resume_after_crash_without_redelivery(effects_url: str) -> None:
    """Offsets stored with the effect: the crashed message is not even redelivered."""
    broker = Kafka()
    broker.offsets_in_db = True
    crashed, after = asyncio.run(_run_crash(broker, effects_url))
    assert [r.outcome for _, r in after.results] == [Outcome.PROCESSED]  # only the new one
    assert crashed.results[0][1].outcome is Outcome.PROCESSED
    with psycopg.connect(effects_url) as conn:
        rows = conn.execute("SELECT consumer, next_offset FROM inbox_kafka_offsets").fetchall()
    # the two messages' partitions, each resumed after its one message (or one partition: 2)
    assert sorted(rows) in ([("svc", 1), ("svc", 1)], [("svc", 2)])
    assert len(effects(effects_url, "svc")) == 2
