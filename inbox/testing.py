"""Testing help for your own handlers: an in-memory broker, and waiting without sleeping.

::

    broker = InMemoryBroker()
    log = ResultLog()
    consumer = broker.consumer(AsyncHandlerRunner(pool, handle_order, consumer="billing"),
                               on_result=log)
    task = asyncio.create_task(consumer.run())
    await broker.publish_batch([envelope])
    await log.wait_processed([envelope.id], within=5)   # returns as soon as it is settled
    consumer.stop(); await task
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from inbox._consumer import BrokerConsumer, ResultCallback
from inbox._runner import AsyncHandlerRunner, Outcome, Result
from inbox._statements import inbox_statements
from outbox.envelope import Envelope

__all__ = ["InMemoryBroker", "InMemoryConsumer", "ResultLog", "wait_until_processed"]


class ResultLog:
    """An ``on_result`` callback that keeps every (envelope, result) and lets you await them."""

    def __init__(self) -> None:
        self.results: list[tuple[Envelope, Result]] = []
        self._changed = asyncio.Event()

    def __call__(self, envelope: Envelope, result: Result) -> None:
        self.results.append((envelope, result))
        self._changed.set()

    def settled_ids(self) -> set[uuid.UUID]:
        """Ids whose delivery was settled (acknowledged) at least once."""
        return {env.id for env, res in self.results if res.outcome.ack}

    def outcomes(self, outcome: Outcome) -> list[uuid.UUID]:
        return [env.id for env, res in self.results if res.outcome is outcome]

    async def wait_for(self, predicate: Any, within: float = 10.0) -> None:
        """Wait until ``predicate(self)`` is true; TimeoutError after ``within`` seconds."""
        async with asyncio.timeout(within):
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()

    async def wait_processed(self, ids: Iterable[uuid.UUID], within: float = 10.0) -> None:
        """Wait until every message in ``ids`` was settled (processed, duplicate, stale, dead)."""
        wanted = set(ids)
        await self.wait_for(lambda log: wanted <= log.settled_ids(), within)

    async def wait_count(self, n: int, within: float = 10.0) -> None:
        """Wait until ``n`` deliveries were handled, whatever their outcome."""
        await self.wait_for(lambda log: len(log.results) >= n, within)


class InMemoryBroker:
    """An at-least-once broker in memory with the relay's publisher shape (``publish_batch``).

    Each envelope goes to every consumer made by :meth:`consumer`; a delivery that is not
    acknowledged is delivered again after the consumer's ``redeliver_delay``.
    """

    def __init__(self) -> None:
        self._queues: list[asyncio.Queue[Envelope]] = []
        self.published: list[Envelope] = []

    async def start(self) -> None:
        """Nothing to connect (kept for the shape of a publisher)."""

    async def close(self) -> None:
        """Nothing to close."""

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        for envelope in envelopes:
            self.published.append(envelope)
            for queue in self._queues:
                queue.put_nowait(envelope)
        return [None] * len(envelopes)

    def deliver_again(self, envelope: Envelope) -> None:
        """Deliver ``envelope`` once more to every consumer (a broker duplicate)."""
        for queue in self._queues:
            queue.put_nowait(envelope)

    def consumer(
        self,
        runner: AsyncHandlerRunner,
        *,
        redeliver_delay: float = 0.05,
        on_result: ResultCallback | None = None,
    ) -> InMemoryConsumer:
        queue: asyncio.Queue[Envelope] = asyncio.Queue()
        self._queues.append(queue)
        return InMemoryConsumer(runner, queue, redeliver_delay=redeliver_delay, on_result=on_result)


class InMemoryConsumer(BrokerConsumer):
    """Consumes one queue of an :class:`InMemoryBroker`; made by ``InMemoryBroker.consumer``."""

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        queue: asyncio.Queue[Envelope],
        *,
        redeliver_delay: float,
        on_result: ResultCallback | None,
    ) -> None:
        super().__init__(runner, redeliver_delay=redeliver_delay, on_result=on_result)
        self._queue = queue

    async def _consume(self) -> None:
        self.ready.set()
        loop = asyncio.get_running_loop()
        while not self.stopping:
            try:
                envelope = await asyncio.wait_for(self._queue.get(), 0.1)
            except TimeoutError:
                continue
            result = await self._dispatch(lambda e=envelope: e)  # type: ignore[misc]
            if result is not None and not result.outcome.ack:
                loop.call_later(self.redeliver_delay, self._queue.put_nowait, envelope)


def wait_until_processed(
    url: str,
    *,
    consumer: str,
    ids: Iterable[uuid.UUID],
    timeout: float = 10.0,
    schema: str | None = None,
) -> None:
    """Block until ``consumer`` has finished every message in ``ids`` according to the inbox
    table (for consumers running in another process); TimeoutError names the missing ids."""
    wanted = set(ids)
    stmt = inbox_statements(schema).finished
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            with conn.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(stmt, {"consumer": consumer, "ids": list(wanted)}).fetchall()
            missing = wanted - {r["message_id"] for r in rows}
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(missing)} message(s) not processed: {sorted(missing)}")
            time.sleep(0.02)  # polling the database: nothing to be woken by across processes
