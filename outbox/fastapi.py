"""FastAPI integration: one transaction per request, and consumers running beside the app.

Publish from an endpoint, in the request's transaction::

    Tx = Annotated[AsyncSession, transactional_session(async_sessionmaker(engine))]

    @app.post("/orders", status_code=201)
    async def place_order(order: OrderIn, session: Tx) -> dict[str, str]:
        session.add(Order(id=order.id))
        await publish_async(session, topic="orders", key=order.id, payload=order.model_dump())
        return {"id": order.id}  # commits here, before the response is sent

The endpoint returns: the transaction commits, then the response goes out (a failed commit is
a failed request). The endpoint raises, ``HTTPException`` included: the transaction rolls back,
and neither the rows nor the messages exist.

Run inbox consumers (or an in-process ``relay.Relay``) for as long as the app runs::

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with consumer_lifespan(consumer):
            yield

FastAPI is optional (``pip install 'outbox-inbox[fastapi]'``): this module imports it only
when :func:`transactional_session` is called, and :func:`consumer_lifespan` does not need it
(any ASGI lifespan, or plain asyncio code, may use it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from outbox._optional import loaded_class
from outbox.exceptions import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
    from sqlalchemy.orm import Session, sessionmaker

__all__ = ["Runnable", "consumer_lifespan", "transactional_session"]

log = logging.getLogger("outbox.fastapi")

#: The oldest FastAPI whose dependencies can end before the response is sent
#: (``Depends(..., scope="function")``, fixed for parameterless dependencies in 0.121.1). With
#: older versions the commit could run after the client already has its 2xx.
_MIN_FASTAPI = (0, 121, 1)


def _fastapi_depends() -> Any:
    try:
        import fastapi
    except ImportError as exc:
        raise ConfigurationError(
            "outbox.fastapi.transactional_session needs FastAPI: "
            "pip install 'outbox-inbox[fastapi]'"
        ) from exc
    found = tuple(int(part) for part in re.findall(r"\d+", fastapi.__version__)[:3])
    if found < _MIN_FASTAPI:
        raise ConfigurationError(
            f"FastAPI {fastapi.__version__} is too old for transactional_session: it needs "
            f"{'.'.join(map(str, _MIN_FASTAPI))} or later, where a dependency can end (commit) "
            "before the response is sent; older versions would commit after the client got "
            "its answer. pip install 'outbox-inbox[fastapi]'",
            fastapi_version=fastapi.__version__,
        )
    return fastapi.Depends


def transactional_session(maker: async_sessionmaker[Any] | sessionmaker[Any]) -> Any:
    """A FastAPI ``Depends`` marker giving the endpoint a session inside ``session.begin()``.

    Pass an ``async_sessionmaker`` for an ``AsyncSession`` (write with ``publish_async``) or a
    ``sessionmaker`` for a ``Session`` (write with ``publish``); the engine must use the
    psycopg driver (``postgresql+psycopg://``). Use it as a parameter's default or in
    ``Annotated``::

        Tx = Annotated[AsyncSession, transactional_session(async_sessionmaker(engine))]

        async def endpoint(session: Tx): ...

    Each request gets its own session and transaction. It commits when the endpoint returns,
    after the response body is built and before anything is sent, so a commit that fails
    (a constraint checked at commit, a lost connection) fails the request: register an
    exception handler to turn such errors into a 4xx. When the endpoint raises (an
    ``HTTPException`` too), the transaction rolls back: the rows and the messages written
    in it never existed.
    """
    depends = _fastapi_depends()
    from sqlalchemy.orm import sessionmaker

    # an async_sessionmaker exists only if its module (which needs greenlet) was imported
    async_maker_class = loaded_class("sqlalchemy.ext.asyncio", "async_sessionmaker")
    if async_maker_class is not None and isinstance(maker, async_maker_class):
        async_maker: async_sessionmaker[Any] = maker

        async def async_transaction() -> AsyncIterator[AsyncSession]:
            async with async_maker() as session, session.begin():
                yield session

        return depends(async_transaction, scope="function")
    if isinstance(maker, sessionmaker):
        sync_maker: sessionmaker[Any] = maker

        def sync_transaction() -> Iterator[Session]:
            with sync_maker() as session, session.begin():
                yield session

        return depends(sync_transaction, scope="function")
    raise ConfigurationError(
        f"transactional_session takes a SQLAlchemy async_sessionmaker or sessionmaker, "
        f"not a {type(maker).__name__}",
        maker_type=type(maker).__name__,
    )


class Runnable(Protocol):
    """What :func:`consumer_lifespan` runs: an inbox broker consumer (``NatsConsumer``,
    ``InMemoryBroker.consumer(...)``, ...), a ``relay.Relay``, or anything with an async
    ``run()`` that returns after ``stop()``. An ``asyncio.Event`` attribute ``ready``, when
    present, says it is receiving."""

    async def run(self) -> None: ...

    def stop(self) -> None: ...


def _name(runnable: object, index: int) -> str:
    return f"{type(runnable).__name__} #{index}"


@contextlib.asynccontextmanager
async def consumer_lifespan(
    *consumers: Runnable, ready_timeout: float | None = 30.0
) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Run ``consumers`` beside the app: started on entry, stopped cleanly on exit.

    On entry, each one's ``run()`` becomes a task, and the context waits until every consumer
    with a ``ready`` event has set it (at most ``ready_timeout`` seconds; ``None``: no limit).
    A consumer whose ``run()`` ends before it is ready stops the start-up: its exception is
    raised (``TimeoutError`` when one is not ready in time), after the ready ones were stopped
    and those still starting cancelled. The context yields the tasks: ``task.done()`` says a
    consumer has ended (a health check).

    On exit, ``stop()`` is called on each, and every task is awaited: messages in hand are
    finished (committed, then acknowledged). A consumer that crashed, while the app ran or
    while stopping, is logged when it happens and its exception is raised here (several:
    an ``ExceptionGroup``), unless the body of the context is already raising.

    A consumer runs once: make new ones for each start of the app (inside its lifespan).
    """
    for index, consumer in enumerate(consumers):
        methods = (getattr(consumer, "run", None), getattr(consumer, "stop", None))
        if not all(callable(method) for method in methods):
            raise ConfigurationError(
                f"consumer_lifespan runs objects with async run() and stop() (inbox consumers, "
                f"relay.Relay); argument {index} is a {type(consumer).__name__}",
                argument=index,
            )
    stopping = False

    def ended(task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("outbox.fastapi: %s crashed", task.get_name(), exc_info=exc)
        elif not stopping:
            log.warning("outbox.fastapi: %s returned before it was stopped", task.get_name())

    tasks: list[asyncio.Task[None]] = []
    for index, consumer in enumerate(consumers):
        task = asyncio.create_task(consumer.run(), name=_name(consumer, index))
        task.add_done_callback(ended)
        tasks.append(task)
    try:
        await _all_ready(consumers, tasks, ready_timeout)
    except BaseException:
        stopping = True
        for consumer, task in zip(consumers, tasks, strict=True):
            ready = getattr(consumer, "ready", None)
            if isinstance(ready, asyncio.Event) and not ready.is_set():
                task.cancel()  # still starting (connecting): nothing in hand to finish
        await _stop(consumers, tasks)
        raise
    try:
        yield tasks
    except BaseException:
        stopping = True
        await _stop(consumers, tasks)  # each crash was logged when it happened
        raise
    stopping = True
    crashes = await _stop(consumers, tasks)
    if len(crashes) == 1:
        raise crashes[0]
    if crashes:
        raise ExceptionGroup("consumers crashed", crashes)


async def _all_ready(
    consumers: Sequence[Runnable], tasks: Sequence[asyncio.Task[None]], within: float | None
) -> None:
    current = ""
    try:
        async with asyncio.timeout(within) as deadline:
            for consumer, task in zip(consumers, tasks, strict=True):
                ready = getattr(consumer, "ready", None)
                if not isinstance(ready, asyncio.Event):
                    continue  # nothing says when it is ready: started is all we know
                current = task.get_name()
                waiter = asyncio.create_task(ready.wait())
                try:
                    await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if ready.is_set():
                    continue
                exc = None if task.cancelled() else task.exception()
                if exc is not None:
                    raise exc
                raise RuntimeError(f"{current} returned from run() before it was ready")
    except TimeoutError as exc:
        if not deadline.expired():
            raise  # a consumer's own TimeoutError, from its run()
        raise TimeoutError(f"{current} was not ready within {within} seconds") from exc


async def _stop(
    consumers: Sequence[Runnable], tasks: Sequence[asyncio.Task[None]]
) -> list[Exception]:
    """Stop every consumer, wait for every task; the exceptions of those that crashed."""
    for consumer in consumers:
        consumer.stop()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    crashes: list[Exception] = []
    for result in results:
        if isinstance(result, Exception):
            crashes.append(result)
        elif isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result  # KeyboardInterrupt, SystemExit: not a consumer's failure to report
    return crashes
