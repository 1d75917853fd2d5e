"""The workers of a batched consumer: a key's messages go to one worker while any of them is in
flight (their order holds); a key with none in flight goes to the least loaded worker, so the
workers' batches stay full instead of a hash's uneven split leaving small ones."""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from typing import Any

from inbox import AsyncHandlerRunner, Batching, NatsConsumer
from inbox._consumer import Chunk, topic_key
from outbox.envelope import Envelope


def _consumer(workers: int) -> NatsConsumer:
    def transactions() -> AbstractAsyncContextManager[Any]:
        raise AssertionError("not opened: nothing is consumed here")

    async def handler(target: Any, message: Any) -> None:
        return None

    runner = AsyncHandlerRunner(transactions, handler, consumer="svc", ordered=True)
    consumer = NatsConsumer(runner, stream="s", durable="d",
                            batching=Batching(size=10, workers=workers))  # fmt: skip
    consumer._owners, consumer._loads = {}, [0] * workers
    return consumer


def _envelope(key: str, seq: int) -> Envelope:
    return Envelope(uuid.uuid4(), "orders", key, seq, b"{}")


def _chunk(envelopes: list[Envelope]) -> Chunk:
    return [(e, None, None) for e in envelopes]  # type: ignore[misc]  # no broker delivery here


def test_new_keys_spread_evenly_over_the_workers() -> None:
    consumer = _consumer(4)
    routes = [consumer._route(topic_key(_envelope(f"k{k}", 1))) for k in range(8)]
    assert sorted(routes) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert consumer._loads == [2, 2, 2, 2]


def test_a_key_in_flight_stays_with_its_worker_however_loaded() -> None:
    consumer = _consumer(2)
    first = [_envelope("hot", n) for n in range(1, 6)]
    routes = {consumer._route(topic_key(e)) for e in first}
    assert len(routes) == 1  # all five on one worker, though the other is idle
    (worker,) = routes
    assert consumer._loads[worker] == 5
    # four of them settled: the fifth is still in flight, so the key's next one follows it
    consumer._settled_keys(_chunk(first[:4]), worker)
    assert consumer._route(topic_key(_envelope("hot", 6))) == worker
    assert consumer._owners[topic_key(first[0])] == [worker, 2]


def test_a_settled_key_moves_to_the_least_loaded_worker() -> None:
    consumer = _consumer(2)
    hot = [_envelope("hot", n) for n in range(1, 4)]
    worker = {consumer._route(topic_key(e)) for e in hot}.pop()
    other = 1 - worker
    busy = [_envelope("busy", n) for n in range(1, 6)]
    assert {consumer._route(topic_key(e)) for e in busy} == {other}
    consumer._settled_keys(_chunk(hot), worker)
    assert topic_key(hot[0]) not in consumer._owners  # nothing of it in flight: forgotten
    assert consumer._loads == [5 if w == other else 0 for w in range(2)]
    # its next message goes where there is room, not back to its old worker by habit
    assert consumer._route(topic_key(_envelope("hot", 4))) == worker
    consumer._settled_keys(_chunk(busy), other)
    assert consumer._route(topic_key(_envelope("hot", 5))) == worker  # still in flight there
