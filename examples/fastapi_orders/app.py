"""An order service on FastAPI, with the outbox on the way out and the inbox on the way in.

* ``POST /orders`` writes the order and its ``OrderPlaced`` message in one transaction: both
  exist, or neither does. ``POST /orders?fail=1`` raises after publishing (a check that fails
  late): 409, and nothing is written or published. The same order twice: 409 as well, found at
  commit, and the second message is rolled back with it.
* A consumer beside the app records a confirmation per order, exactly once (the inbox).

Run it (the outbox tables must exist: ``outbox migrate upgrade --url "$OUTBOX_DATABASE_URL"``)::

    export OUTBOX_DATABASE_URL=postgresql://app@127.0.0.1:5432/app
    uvicorn --factory examples.fastapi_orders.app:create_app
    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"order_id": "A-1", "item": "book", "quantity": 2}'

So that it runs on its own, the lifespan also runs the relay, publishing to an in-memory broker
that the consumer reads. In production the relay is its own process (``outbox relay --broker
nats://...``) and the consumer reads the real broker (``inbox.NatsConsumer`` and the others),
usually in another service; the endpoint does not change.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations, and
# `Tx` below is local to create_app, where a string annotation could not be resolved.
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Annotated, Any

import psycopg
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field
from sqlalchemy import String, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from inbox import AsyncHandlerRunner
from inbox.testing import InMemoryBroker
from outbox import publish_async
from outbox.envelope import Envelope
from outbox.fastapi import consumer_lifespan, transactional_session
from relay import Relay, RelayConfig

#: the consumer's name in the inbox (``inbox_messages.consumer``)
CONSUMER = "order-confirmations"


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    quantity: Mapped[int]


class Confirmation(Base):
    """The consumer's effect: one row per order, whatever the broker redelivers."""

    __tablename__ = "order_confirmations"
    order_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    message_id: Mapped[uuid.UUID]


class OrderIn(BaseModel):
    order_id: str = Field(min_length=1, max_length=40)
    item: str = Field(min_length=1, max_length=100)
    quantity: int = Field(gt=0)


async def confirm(conn: psycopg.AsyncConnection[Any], envelope: Envelope) -> None:
    """Apply one ``OrderPlaced``, in the transaction where the inbox records the message."""
    order = json.loads(envelope.payload)
    await conn.execute(
        "INSERT INTO order_confirmations (order_id, message_id) VALUES (%s, %s)",
        (order["order_id"], envelope.id),
    )


def create_app(database_url: str | None = None) -> FastAPI:
    """The app, on ``database_url`` (libpq form; default: ``$OUTBOX_DATABASE_URL``)."""
    url = database_url or os.environ["OUTBOX_DATABASE_URL"]
    engine = create_async_engine(make_url(url).set(drivername="postgresql+psycopg"))
    Tx = Annotated[AsyncSession, transactional_session(async_sessionmaker(engine))]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            stack.push_async_callback(engine.dispose)
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
            broker = InMemoryBroker()
            # InMemoryBroker has the relay's publisher methods but declares no `features`
            relay = Relay(RelayConfig(database_url=url), broker)  # type: ignore[arg-type]
            pool = AsyncConnectionPool(url, min_size=1, max_size=2, open=False)
            await stack.enter_async_context(pool)
            consumer = broker.consumer(AsyncHandlerRunner(pool, confirm, consumer=CONSUMER))
            app.state.consumer = consumer
            app.state.tasks = await stack.enter_async_context(consumer_lifespan(relay, consumer))
            yield  # serving; on shutdown the consumer and the relay stop, then the pool closes

    app = FastAPI(title="orders", lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def place_order(order: OrderIn, session: Tx, fail: bool = False) -> dict[str, str]:
        session.add(Order(id=order.order_id, item=order.item, quantity=order.quantity))
        message_id = await publish_async(
            session,
            topic="orders",
            key=order.order_id,
            payload={"event": "OrderPlaced", **order.model_dump()},
            headers={"type": "OrderPlaced"},
        )
        if fail:  # anything that raises now rolls back the order and its message together
            raise HTTPException(409, "order rejected after publishing: nothing was written")
        return {"order_id": order.order_id, "message_id": str(message_id)}

    @app.exception_handler(IntegrityError)
    async def conflict(request: Request, exc: IntegrityError) -> JSONResponse:
        # raised by the commit (the order's INSERT is flushed then), before any response
        return JSONResponse({"detail": "the order already exists: nothing was written"}, 409)

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"consumers_running": not any(task.done() for task in app.state.tasks)}

    return app
