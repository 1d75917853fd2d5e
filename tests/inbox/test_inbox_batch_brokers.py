"""Batched, parallel-by-key consumers on every live broker: one transaction per batch, each
message applied once, each key in seq order, a poison message isolated from its batch."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Batching, Outcome
from inbox.testing import ResultLog
from outbox import ConfigurationError
from tests.inbox.broker_fixtures import BROKERS, Broker
from tests.inbox.inbox_helpers import effects, inbox_rows, make_envelope
from tests.support.services import require_port

KEYS, PER_KEY = 8, 12


async def _apply(conn: Any, msg: Any) -> None:
    if msg.payload == b"poison":
        raise ValueError("cannot parse")
    await conn.execute(
        "INSERT INTO effects (consumer, message_id, key, seq) VALUES ('svc', %s, %s, %s)",
        (msg.id, msg.key, msg.seq),
    )


async def _run(broker: Broker, url: str) -> tuple[list[Any], ResultLog]:
    rng = random.Random(5)
    stream = [make_envelope(key=f"k{k}", seq=n) for n in range(1, PER_KEY + 1) for k in range(KEYS)]
    poison = make_envelope(key="k0", seq=PER_KEY + 1, payload=b"poison")
    after = make_envelope(key="k0", seq=PER_KEY + 2)
    stream += [poison, after]
    # redeliveries: some messages published twice, the copy a little later
    copies = list(stream)
    for m in rng.sample(stream, 15):
        copies.insert(min(len(copies), copies.index(m) + rng.randint(1, 10)), m)
    log = ResultLog()
    await broker.setup()
    try:
        async with AsyncConnectionPool(url, min_size=1, max_size=4, open=False) as pool:
            runner = AsyncHandlerRunner(pool, _apply, consumer="svc", ordered=True,
                                        max_attempts=2)  # fmt: skip
            consumer = broker.consumer(runner, log, 0)
            task = asyncio.create_task(consumer.run())
            async with asyncio.timeout(20):
                await consumer.ready.wait()
            await broker.publish(copies)
            await log.wait_processed([m.id for m in stream if m is not poison], within=60)
            consumer.stop()
            await task
    finally:
        await broker.teardown()
    return stream, log


@pytest.mark.parametrize("name", list(BROKERS))
def test_batched_ordered_consumer_on_live_broker(effects_url: str, name: str) -> None:
    broker = BROKERS[name]()
    if broker.port:
        require_port(broker.port, name)
    workers = 1 if name == "kafka" else 3
    broker.batching = Batching(size=20, wait=0.05, workers=workers)
    stream, log = asyncio.run(_run(broker, effects_url))
    applied = effects(effects_url, "svc")
    poison = stream[-2]
    assert sorted(e[1] for e in applied) == sorted(m.id for m in stream if m is not poison)
    for k in range(KEYS):
        seqs = [e[3] for e in applied if e[2] == f"k{k}"]
        # in seq order, once each; k0 moved on past its dead message (seq 13)
        assert seqs == list(range(1, PER_KEY + 1)) + ([PER_KEY + 2] if k == 0 else [])
    assert inbox_rows(effects_url, "svc")[poison.id][0] == "dead"
    assert log.outcomes(Outcome.DEAD) == [poison.id]
    with psycopg.connect(effects_url) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT xmin::text) FROM inbox_messages WHERE consumer = 'svc'"
        ).fetchone()
    assert row is not None
    assert row[0] < len(stream) / 2  # batches, not one transaction per message


def test_kafka_refuses_parallel_workers() -> None:
    broker = BROKERS["kafka"]()
    broker.batching = Batching(size=10, workers=2)
    with pytest.raises(ConfigurationError, match="workers=1"):
        broker.consumer(AsyncHandlerRunner(lambda: None, _apply, consumer="svc"), print, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 0}, "size must be 1..10000"),
        ({"workers": 0}, "workers must be 1..256"),
        ({"wait": -1}, "wait must be 0..10"),
    ],
)
def test_batching_is_validated(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Batching(**kwargs)
