"""A Kafka consumer group on a real Kafka-protocol broker (tansu): members joining and leaving
while messages flow. Every message is applied exactly once, each key in order, whichever member
held its partition, with the offsets committed to Kafka or stored in the effect's transaction."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Outcome
from inbox.testing import ResultLog, wait_until_processed
from outbox.envelope import Envelope
from tests.inbox.broker_fixtures import Kafka
from tests.inbox.inbox_helpers import FailOnce, effects, make_envelope

KEYS = 12


def _wave(first_seq: int, per_key: int) -> list[Envelope]:
    return [
        make_envelope(key=f"k{k}", seq=seq, payload=b'{"seq": %d}' % seq)
        for seq in range(first_seq, first_seq + per_key)
        for k in range(KEYS)
    ]


async def _run(broker: Kafka, url: str) -> tuple[list[Envelope], ResultLog, ResultLog]:
    waves = [_wave(1, 5), _wave(6, 5), _wave(11, 5)]
    await broker.setup()
    try:
        async with AsyncConnectionPool(url, min_size=1, max_size=4, open=False) as pool:
            runner = AsyncHandlerRunner(pool, FailOnce(), consumer="svc", ordered=True)
            log_a, log_b = ResultLog(), ResultLog()
            member_a = broker.consumer(runner, log_a, 0)
            task_a = asyncio.create_task(member_a.run())
            async with asyncio.timeout(30):
                await member_a.ready.wait()
            await broker.publish(waves[0])
            await log_a.wait_processed([m.id for m in waves[0][:KEYS]], within=30)
            # a second member joins: the group rebalances while the first wave is applied
            member_b = broker.consumer(runner, log_b, 1)
            task_b = asyncio.create_task(member_b.run())
            async with asyncio.timeout(60):
                await member_b.ready.wait()
            await broker.publish(waves[1])
            await asyncio.to_thread(
                wait_until_processed, url, consumer="svc", ids=[m.id for m in waves[1]],
                timeout=60,
            )  # fmt: skip
            # the first member leaves: the second one takes every partition over
            member_a.stop()
            await task_a
            await broker.publish(waves[2])
            every = [m.id for wave in waves for m in wave]
            await asyncio.to_thread(
                wait_until_processed, url, consumer="svc", ids=every, timeout=60
            )
            member_b.stop()
            await task_b
    finally:
        await broker.teardown()
    return [m for wave in waves for m in wave], log_a, log_b


@pytest.mark.parametrize("offsets_in_db", [False, True], ids=["kafka-offsets", "db-offsets"])
def test_members_join_and_leave_every_message_once_in_key_order(
    effects_url: str, offsets_in_db: bool
) -> None:
    broker = Kafka()
    broker.offsets_in_db = offsets_in_db
    sent, log_a, log_b = asyncio.run(_run(broker, effects_url))
    rows = effects(effects_url, "svc")
    assert sorted(r[1] for r in rows) == sorted(m.id for m in sent)  # each exactly once
    applied: dict[str, list[int]] = defaultdict(list)
    for _, _, key, seq in rows:  # in the order they were applied
        applied[key].append(seq)
    assert applied == {f"k{k}": list(range(1, 16)) for k in range(KEYS)}
    assert log_a.outcomes(Outcome.PROCESSED), "the first member applied nothing"
    assert log_b.outcomes(Outcome.PROCESSED), "the second member never got a partition"
