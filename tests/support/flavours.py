"""The same scenario on both flavours of the calls generated from async code: ``publish`` /
``publish_async``, ``receive`` / ``receive_async`` (and ``record``), ``HandlerRunner`` /
``AsyncHandlerRunner``.

A test takes the ``flavour`` fixture (``sync`` or ``async``) and calls through it: each call
runs in its flavour (the async ones on the test's event loop) and hands back its plain result,
so the scenario reads the same for both.
"""

from __future__ import annotations

import asyncio
import contextvars
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from inbox import (
    AsyncHandlerRunner,
    HandlerRunner,
    Result,
    Verdict,
    receive,
    receive_async,
    record,
    record_async,
)
from outbox import Message, publish, publish_async, publish_batch, publish_batch_async

FLAVOURS = ["sync", "async"]

#: the effect the runners' handlers apply: one row per application (duplicates are visible)
EFFECT = "INSERT INTO effects (consumer, message_id, key, seq) VALUES (%s, %s, %s, %s)"


class Conn:
    """A psycopg connection of the flavour (``raw``), in a transaction until commit/rollback."""

    def __init__(self, flavour: Flavour, raw: Any) -> None:
        self.flavour, self.raw = flavour, raw

    def execute(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run ``query``; its rows (none for a statement without)."""
        if not self.flavour.is_async:
            cur = self.raw.execute(query, params)
            return cur.fetchall() if cur.description else []

        async def go() -> list[tuple[Any, ...]]:
            cur = await self.raw.execute(query, params)
            return await cur.fetchall() if cur.description else []

        return self.flavour.call(go())  # type: ignore[no-any-return]

    def commit(self) -> None:
        self.flavour.call(self.raw.commit())

    def rollback(self) -> None:
        self.flavour.call(self.raw.rollback())


class Runner:
    """A handler runner of the flavour; each call returns its plain result."""

    def __init__(self, flavour: Flavour, runner: HandlerRunner | AsyncHandlerRunner) -> None:
        self.flavour, self.runner = flavour, runner

    def handle(self, message: Any, **options: Any) -> Result:
        return self.flavour.call(self.runner.handle(message, **options))  # type: ignore[no-any-return]

    def handle_batch(self, messages: list[Any], **options: Any) -> list[Result]:
        return self.flavour.call(self.runner.handle_batch(messages, **options))  # type: ignore[no-any-return]

    def resolve_held(self, **options: Any) -> list[Result]:
        return self.flavour.call(self.runner.resolve_held(**options))  # type: ignore[no-any-return]


class Flavour:
    """``sync`` or ``async``: the calls of that flavour, run to their result."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop = asyncio.Runner() if name == "async" else None
        self._cleanups: list[Callable[[], object]] = []

    def __repr__(self) -> str:
        return self.name

    @property
    def is_async(self) -> bool:
        return self._loop is not None

    def call(self, value: Any) -> Any:
        """The value a call of this flavour returned: the async flavour's coroutine, run."""
        if self._loop is None:
            return value
        # in the caller's context (an active span, say), as an awaiting caller would see it
        return self._loop.run(value, context=contextvars.copy_context())

    def close(self) -> None:
        for cleanup in reversed(self._cleanups):
            cleanup()
        if self._loop is not None:
            self._loop.close()

    # -- connections -------------------------------------------------------------------

    def connect(self, url: str, **options: Any) -> Conn:
        """A psycopg connection of this flavour on ``url``, closed when the test ends."""
        if not self.is_async:
            raw: Any = psycopg.connect(url, **options)
            self._cleanups.append(raw.close)
        else:
            raw = self.call(psycopg.AsyncConnection.connect(url, **options))
            self._cleanups.append(lambda: self.call(raw.close()))
        return Conn(self, raw)

    def pool(self, url: str) -> ConnectionPool | AsyncConnectionPool:
        """A small pool of this flavour on ``url``, closed when the test ends."""
        if not self.is_async:
            pool = ConnectionPool(url, min_size=1, max_size=2, open=True)
            self._cleanups.append(pool.close)
            return pool

        async def opened() -> AsyncConnectionPool:
            apool = AsyncConnectionPool(url, min_size=1, max_size=2, open=False)
            await apool.open()
            return apool

        apool: AsyncConnectionPool = self.call(opened())
        self._cleanups.append(lambda: self.call(apool.close()))
        return apool

    # -- the calls under test ------------------------------------------------------------

    def publish(self, conn: Conn, **fields: Any) -> uuid.UUID:
        call = publish_async if self.is_async else publish
        return self.call(call(conn.raw, **fields))  # type: ignore[no-any-return]

    def publish_batch(self, conn: Conn, messages: Iterable[Message], **options: Any) -> Any:
        call = publish_batch_async if self.is_async else publish_batch
        return self.call(call(conn.raw, messages, **options))

    def receive(self, conn: Conn, **options: Any) -> bool:
        call = receive_async if self.is_async else receive
        return self.call(call(conn.raw, **options))  # type: ignore[no-any-return]

    def record(self, conn: Conn, **options: Any) -> Verdict:
        call = record_async if self.is_async else record
        return self.call(call(conn.raw, **options))  # type: ignore[no-any-return]

    def runner(
        self,
        url: str,
        *,
        consumer: str = "c",
        before: Callable[[Any], Iterable[str]] = lambda message: (),
        fail: Callable[[Any], object] = lambda message: None,
        **options: Any,
    ) -> Runner:
        """A handler runner of this flavour on a pool of ``url``. Its handler runs the
        statements ``before(message)`` gives, writes the effect row (:data:`EFFECT`), then calls
        ``fail(message)``, which raises to fail the delivery (its effect rolls back)."""
        pool = self.pool(url)

        def params(message: Any) -> tuple[Any, ...]:
            return (consumer, message.id, message.key, message.seq)

        if not self.is_async:

            def handler(conn: psycopg.Connection[Any], message: Any) -> None:
                for statement in before(message):
                    conn.execute(statement)
                conn.execute(EFFECT, params(message))
                fail(message)

            return Runner(self, HandlerRunner(pool, handler, consumer=consumer, **options))

        async def async_handler(conn: psycopg.AsyncConnection[Any], message: Any) -> None:
            for statement in before(message):
                await conn.execute(statement)
            await conn.execute(EFFECT, params(message))
            fail(message)

        runner = AsyncHandlerRunner(pool, async_handler, consumer=consumer, **options)
        return Runner(self, runner)


@contextmanager
def flavour_of(name: str) -> Iterator[Flavour]:
    """The flavour ``name``, closed (its connections, pools and event loop) on exit."""
    flavour = Flavour(name)
    try:
        yield flavour
    finally:
        flavour.close()
