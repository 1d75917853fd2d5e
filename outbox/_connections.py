"""Finding the caller's psycopg connection, and refusing to write outside a transaction.

Every write of outbox-inbox runs on the *caller's* connection, inside the caller's
transaction. SQLAlchemy objects (Session, Connection and their async twins) are unwrapped to
the psycopg 3 connection they hold, after making sure SQLAlchemy has begun its transaction, so
the statement commits or rolls back with the caller's business rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import psycopg
from psycopg.pq import TransactionStatus

from outbox.exceptions import ConfigurationError, TransactionRequiredError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

__all__ = ["AsyncTarget", "Target", "resolve_async", "resolve_sync"]

#: What the sync calls (``publish``, ``publish_batch``, ``receive``) write through: the
#: caller's SQLAlchemy Session or Connection on the psycopg driver, or a psycopg Connection.
Target: TypeAlias = "Session | Connection | psycopg.Connection[Any]"
#: What the async calls write through: an AsyncSession or AsyncConnection on the psycopg
#: driver, or a psycopg AsyncConnection.
AsyncTarget: TypeAlias = "AsyncSession | AsyncConnection | psycopg.AsyncConnection[Any]"

_AUTOCOMMIT_HINT = (
    "the connection is in autocommit mode and not inside a transaction, so the message "
    "would be committed on its own, apart from your business rows, and a later rollback "
    "could not take it back. Write it inside your transaction: "
    "`with session.begin(): ...`, `with conn.begin(): ...`, or for psycopg "
    "`with conn.transaction(): ...` (or a connection with autocommit=False)"
)


def _check(raw: Any) -> None:
    status = raw.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise TransactionRequiredError(
            "the transaction has already failed (an earlier statement raised); roll it back "
            "and retry the whole unit of work"
        )
    if raw.autocommit and status == TransactionStatus.IDLE:
        raise TransactionRequiredError(_AUTOCOMMIT_HINT)


def _not_psycopg(obj: Any, raw: Any) -> ConfigurationError:
    return ConfigurationError(
        f"{type(obj).__name__} uses the driver {type(raw).__module__}.{type(raw).__name__}; "
        "outbox-inbox needs psycopg 3: create the engine with a 'postgresql+psycopg://' URL",
        driver=type(raw).__name__,
    )


def resolve_sync(target: Target) -> psycopg.Connection[Any]:
    """The psycopg connection behind ``target``, in a transaction, or a clear error."""
    if isinstance(target, psycopg.Connection):
        raw: Any = target
    else:
        raw = _unwrap_sqlalchemy_sync(target)
    if not isinstance(raw, psycopg.Connection):
        raise _not_psycopg(target, raw)
    _check(raw)
    return raw


async def resolve_async(target: AsyncTarget) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection behind ``target``, in a transaction, or a clear error."""
    if isinstance(target, psycopg.AsyncConnection):
        raw: Any = target
    else:
        raw = await _unwrap_sqlalchemy_async(target)
    if not isinstance(raw, psycopg.AsyncConnection):
        raise _not_psycopg(target, raw)
    _check(raw)
    return raw


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


async def _unwrap_sqlalchemy_async(target: Any) -> Any:
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    except ImportError as exc:  # pragma: no cover - sqlalchemy[asyncio] missing
        raise _unsupported(target, "a psycopg.AsyncConnection") from exc

    if isinstance(target, AsyncSession):
        conn = await target.connection()
    elif isinstance(target, AsyncConnection):
        conn = target
        if not conn.in_transaction():
            await conn.begin()
    else:
        raise _unsupported(
            target,
            "a SQLAlchemy AsyncSession or AsyncConnection, or a psycopg.AsyncConnection "
            "(use publish for sync sessions and connections)",
        )
    fairy = await conn.get_raw_connection()
    return fairy.driver_connection
