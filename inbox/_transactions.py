"""Turning what the user gives a runner into "open one transaction, yield the target".

A runner needs a fresh transaction per message that commits when the block ends without an
exception and rolls back otherwise. Accepted: psycopg_pool pools (the handler gets a psycopg
connection), SQLAlchemy engines (a Connection) and sessionmakers (a Session), or any zero-arg
callable returning such a context manager.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

from outbox.exceptions import ConfigurationError
from outbox.kit import loaded_class

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool, ConnectionPool
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
    from sqlalchemy.orm import sessionmaker

__all__ = [
    "AsyncTransactionSource",
    "AsyncTransactions",
    "TransactionSource",
    "Transactions",
    "async_transactions",
    "sync_transactions",
]

#: a zero-argument callable opening one transaction; its context manager yields the target
Transactions = Callable[[], contextlib.AbstractContextManager[Any]]
AsyncTransactions = Callable[[], contextlib.AbstractAsyncContextManager[Any]]

#: what a sync runner accepts as ``transactions``
TransactionSource: TypeAlias = (
    "ConnectionPool[Any] | Engine | sessionmaker[Any] | "
    "Callable[[], contextlib.AbstractContextManager[Any]]"
)
#: what an async runner accepts as ``transactions``
AsyncTransactionSource: TypeAlias = (
    "AsyncConnectionPool[Any] | AsyncEngine | async_sessionmaker[Any] | "
    "Callable[[], contextlib.AbstractAsyncContextManager[Any]]"
)

_SYNC_HINT = (
    "pass a psycopg_pool.ConnectionPool, a SQLAlchemy Engine or sessionmaker, or a "
    "zero-argument callable returning a context manager that yields a connection or session "
    "inside a transaction (committed on exit)"
)
_ASYNC_HINT = (
    "pass a psycopg_pool.AsyncConnectionPool, a SQLAlchemy AsyncEngine or async_sessionmaker, "
    "or a zero-argument callable returning an async context manager that yields a connection "
    "or session inside a transaction (committed on exit)"
)


def sync_transactions(source: TransactionSource) -> Transactions:
    """A factory of transactions for a sync runner."""
    from psycopg_pool import ConnectionPool
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import sessionmaker

    if isinstance(source, ConnectionPool):

        @contextlib.contextmanager
        def pooled() -> Iterator[Any]:
            with source.connection() as conn:  # commits on a clean exit, else rolls back
                yield conn

        return pooled
    if isinstance(source, Engine | sessionmaker):
        return source.begin
    if callable(source):
        return source
    raise ConfigurationError(
        f"cannot open transactions from a {type(source).__name__}: {_SYNC_HINT}"
    )


def async_transactions(source: AsyncTransactionSource) -> AsyncTransactions:
    """A factory of transactions for an async runner."""
    from psycopg_pool import AsyncConnectionPool

    if isinstance(source, AsyncConnectionPool):

        @contextlib.asynccontextmanager
        async def pooled() -> AsyncIterator[Any]:
            async with source.connection() as conn:
                yield conn

        return pooled
    # SQLAlchemy's asyncio module needs greenlet (the "async" extra): an AsyncEngine or an
    # async_sessionmaker can only exist if it was imported, so look, don't import
    sqlalchemy_async = tuple(
        cls
        for cls in (
            loaded_class("sqlalchemy.ext.asyncio", "AsyncEngine"),
            loaded_class("sqlalchemy.ext.asyncio", "async_sessionmaker"),
        )
        if cls is not None
    )
    if sqlalchemy_async and isinstance(source, sqlalchemy_async):
        return source.begin  # type: ignore[no-any-return]
    if callable(source):
        return source
    raise ConfigurationError(
        f"cannot open transactions from a {type(source).__name__}: {_ASYNC_HINT}"
    )
