"""Finding the caller's driver connection, and refusing to write outside a transaction.

Every write of outbox-inbox runs on the *caller's* connection, inside the caller's
transaction. SQLAlchemy objects (Session, Connection and their async twins) are unwrapped to
the psycopg 3 connection they hold, after making sure SQLAlchemy has begun its transaction, so
the statement commits or rolls back with the caller's business rows. The async calls also take
SQLAlchemy's asyncpg driver (``postgresql+asyncpg://``): its connection is wrapped in
:class:`outbox._asyncpg.AsyncpgConnection`, which runs the same statements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import psycopg
from psycopg.pq import TransactionStatus

from outbox._asyncpg import AsyncpgConnection, is_asyncpg
from outbox._optional import loaded_class
from outbox._statements import TEMPLATES
from outbox.exceptions import ConfigurationError, TransactionRequiredError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

__all__ = ["AsyncRaw", "AsyncTarget", "Target", "resolve_async", "resolve_sync"]

#: What the sync calls (``publish``, ``publish_batch``, ``receive``) write through: the
#: caller's SQLAlchemy Session or Connection on the psycopg driver, or a psycopg Connection.
Target: TypeAlias = "Session | Connection | psycopg.Connection[Any]"
#: What the async calls write through: an AsyncSession or AsyncConnection on the psycopg or
#: asyncpg driver, or a psycopg AsyncConnection.
AsyncTarget: TypeAlias = "AsyncSession | AsyncConnection | psycopg.AsyncConnection[Any]"

_BEGIN = TEMPLATES.begin.as_string(None)

_AUTOCOMMIT_HINT = (
    "the connection is in autocommit mode and not inside a transaction, so the message "
    "would be committed on its own, apart from your business rows, and a later rollback "
    "could not take it back. Write it inside your transaction: "
    "`with conn.transaction(): ...` (or a connection with autocommit=False)"
)
#: SQLAlchemy's begin() opens no database transaction on an AUTOCOMMIT engine or connection
_SQLALCHEMY_AUTOCOMMIT_HINT = (
    "the SQLAlchemy connection uses isolation_level='AUTOCOMMIT', where begin() opens no "
    "database transaction, so the message would be committed on its own, apart from your "
    "business rows, and a later rollback could not take it back. Publish on an engine without "
    "that setting, or switch this connection back before its transaction: "
    "`conn.execution_options(isolation_level='READ COMMITTED')`, then `with conn.begin(): ...`"
)


def _check(raw: Any, hint: str = _AUTOCOMMIT_HINT) -> None:
    status = raw.pgconn.transaction_status  # what raw.info.transaction_status wraps, unwrapped
    if status == TransactionStatus.INERROR:
        raise TransactionRequiredError(
            "the transaction has already failed (an earlier statement raised); roll it back "
            "and retry the whole unit of work"
        )
    if raw.autocommit and status == TransactionStatus.IDLE:
        raise TransactionRequiredError(hint)


def _not_psycopg(
    obj: Any, raw: Any, urls: str = "a 'postgresql+psycopg://' URL (psycopg 3)"
) -> ConfigurationError:
    return ConfigurationError(
        f"{type(obj).__name__} uses the driver {type(raw).__module__}.{type(raw).__name__}; "
        f"outbox-inbox does not support it: create the engine with {urls}",
        driver=type(raw).__name__,
    )


def resolve_sync(target: Target) -> psycopg.Connection[Any]:
    """The psycopg connection behind ``target``, in a transaction, or a clear error."""
    if isinstance(target, psycopg.Connection):
        _check(target)
        return target
    raw = _unwrap_sqlalchemy_sync(target)
    if not isinstance(raw, psycopg.Connection):
        raise _not_psycopg(target, raw)
    _check(raw, _SQLALCHEMY_AUTOCOMMIT_HINT)
    return raw


#: What the async calls run their statements on: psycopg's connection, or asyncpg's wrapped.
AsyncRaw: TypeAlias = "psycopg.AsyncConnection[Any] | AsyncpgConnection"


async def resolve_async(target: AsyncTarget) -> AsyncRaw:
    """The driver connection behind ``target``, in a transaction, or a clear error."""
    if isinstance(target, psycopg.AsyncConnection):
        _check(target)
        return target
    conn, fairy = await _unwrap_sqlalchemy_async(target)
    raw = fairy.driver_connection
    if isinstance(raw, psycopg.AsyncConnection):
        _check(raw, _SQLALCHEMY_AUTOCOMMIT_HINT)
        return raw
    if is_asyncpg(raw):
        return await _asyncpg(conn, fairy, raw)
    raise _not_psycopg(target, raw, "'postgresql+psycopg://' or 'postgresql+asyncpg://'")


async def _asyncpg(conn: Any, fairy: Any, raw: Any) -> AsyncpgConnection:
    """The asyncpg connection behind SQLAlchemy's AsyncConnection ``conn``, in its transaction.

    A failed transaction is not caught here (asyncpg does not expose it): the server refuses
    the first statement with InFailedSqlTransaction instead."""
    if not raw.is_in_transaction():
        if fairy.dbapi_connection.autocommit:  # isolation_level="AUTOCOMMIT": no transaction
            raise TransactionRequiredError(_SQLALCHEMY_AUTOCOMMIT_HINT)
        # SQLAlchemy's asyncpg adapter sends BEGIN (with the isolation level the caller chose)
        # only with its own first statement: have it begin now, once per transaction.
        await conn.exec_driver_sql(_BEGIN)
    return AsyncpgConnection.of(raw, conn.engine.url)


def _unsupported(target: Any, expected: str) -> ConfigurationError:
    return ConfigurationError(
        f"cannot write through a {type(target).__module__}.{type(target).__name__}; "
        f"pass {expected}",
        target_type=type(target).__name__,
    )


def _unwrap_sqlalchemy_sync(target: Any) -> Any:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(target, Session):
        conn = target.connection()  # begins the session's transaction if needed (autobegin)
    elif isinstance(target, Connection):
        conn = target
        if not conn.in_transaction():
            conn.begin()  # what SQLAlchemy's own autobegin would do on the first execute
    else:
        raise _unsupported(
            target,
            "a SQLAlchemy Session or Connection, or a psycopg.Connection "
            "(use publish_async for async sessions and connections)",
        )
    return conn.connection.driver_connection


async def _unwrap_sqlalchemy_async(target: Any) -> tuple[Any, Any]:
    """SQLAlchemy's AsyncConnection behind ``target``, in a transaction, and its pool entry."""
    # not imported here: SQLAlchemy's asyncio module needs greenlet (the "async" extra), and an
    # AsyncSession or AsyncConnection can only exist if the caller imported it
    session_class = loaded_class("sqlalchemy.ext.asyncio", "AsyncSession")
    connection_class = loaded_class("sqlalchemy.ext.asyncio", "AsyncConnection")
    if session_class is not None and isinstance(target, session_class):
        conn = await target.connection()
    elif connection_class is not None and isinstance(target, connection_class):
        conn = target
        if not conn.in_transaction():
            await conn.begin()
    else:
        raise _unsupported(
            target,
            "a SQLAlchemy AsyncSession or AsyncConnection, or a psycopg.AsyncConnection "
            "(use publish for sync sessions and connections)",
        )
    return conn, await conn.get_raw_connection()
