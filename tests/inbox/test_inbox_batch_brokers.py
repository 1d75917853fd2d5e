"""Batched, parallel-by-key consumers on every live broker: one transaction per batch, each
message applied once, each key in seq order, a poison message isolated from its batch."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Batching, NatsConsumer, Outcome
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


def test_nats_workers_fill_their_batches_side_by_side(effects_url: str) -> None:
    """``workers=4`` with a batch handler that waits on I/O: the consumer fetches a batch for
    every worker, so four batches are applied at once, none larger than ``size``, and each
    message is applied once, each key in seq order."""
    require_port(4222, "nats")
    size, workers, keys, per_key = 25, 4, 16, 25
    broker = BROKERS["nats"]()
    broker.batching = Batching(size=size, wait=0.05, workers=workers)
    sizes: list[int] = []
    active, most = 0, 0
    overlapped = asyncio.Event()

    async def apply(conn: Any, messages: list[Any]) -> None:
        nonlocal active, most
        sizes.append(len(messages))
        active += 1
        most = max(most, active)
        if active == workers:
            overlapped.set()
        try:
            for msg in messages:
                await _apply(conn, msg)
            # an HTTP call: the other workers' batches go on meanwhile (until all overlapped)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(overlapped.wait(), 0.5)
        finally:
            active -= 1

    stream = [make_envelope(key=f"k{k}", seq=n) for n in range(1, per_key + 1) for k in range(keys)]

    async def run() -> None:
        log = ResultLog()
        await broker.setup()
        try:
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=workers + 1,
                                           open=False) as pool:  # fmt: skip
                runner = AsyncHandlerRunner(pool, batch_handler=apply, consumer="svc",
                                            ordered=True)  # fmt: skip
                await broker.publish(stream)  # a backlog: every fetch comes back full
                consumer = broker.consumer(runner, log, 0)
                assert isinstance(consumer, NatsConsumer)
                assert consumer.batch == size * workers
                task = asyncio.create_task(consumer.run())
                await log.wait_processed([m.id for m in stream], within=60)
                consumer.stop()
                await task
        finally:
            await broker.teardown()

    asyncio.run(run())
    assert most == workers
    assert max(sizes) <= size
    applied = effects(effects_url, "svc")
    assert sorted(e[1] for e in applied) == sorted(m.id for m in stream)
    for k in range(keys):
        assert [e[3] for e in applied if e[2] == f"k{k}"] == list(range(1, per_key + 1))
