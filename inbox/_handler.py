"""What a runner calls: a handler over the transaction's target and the message (an Envelope).

The target is what the ``transactions`` given to the runner yield: a psycopg connection for a
psycopg_pool pool, a SQLAlchemy ``Connection`` for an Engine, a ``Session`` for a sessionmaker.
Each protocol is generic over it, so ``Handler[Session]`` says "a handler of Sessions"::

    def apply_payment(session: Session, envelope: Envelope) -> None: ...

    handler: Handler[Session] = apply_payment

A handler's return value is ignored; raising fails the delivery.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, TypeVar

from outbox.envelope import Envelope

__all__ = ["AsyncBatchHandler", "AsyncHandler", "BatchHandler", "Handler"]

#: the transaction's target a handler writes through (contravariant: a handler of
#: ``psycopg.Connection[Any]`` is a handler of any psycopg connection)
TargetT_contra = TypeVar("TargetT_contra", contravariant=True)


class Handler(Protocol[TargetT_contra]):
    """``handler(target, message)``: apply one message's effect through ``target``."""

    def __call__(self, target: TargetT_contra, message: Envelope, /) -> object: ...


class AsyncHandler(Protocol[TargetT_contra]):
    """``await handler(target, message)``: the async runner's :class:`Handler`."""

    def __call__(self, target: TargetT_contra, message: Envelope, /) -> Awaitable[object]: ...


class BatchHandler(Protocol[TargetT_contra]):
    """``batch_handler(target, messages)``: apply the effects of a whole batch at once."""

    def __call__(self, target: TargetT_contra, messages: list[Envelope], /) -> object: ...


class AsyncBatchHandler(Protocol[TargetT_contra]):
    """``await batch_handler(target, messages)``: the async runner's :class:`BatchHandler`."""

    def __call__(
        self, target: TargetT_contra, messages: list[Envelope], /
    ) -> Awaitable[object]: ...
