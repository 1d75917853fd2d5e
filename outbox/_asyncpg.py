"""Running our statements on asyncpg, the driver behind ``postgresql+asyncpg://`` engines.

The statement registries (``outbox/_sql.py``) render psycopg texts: ``%(name)s`` placeholders
(``%(name)b`` where psycopg sends a binary array) and ``%%`` for a literal ``%``.
:class:`AsyncpgConnection` wraps the asyncpg connection behind a SQLAlchemy ``AsyncSession`` /
``AsyncConnection`` and offers the few psycopg operations the async write paths use
(``execute``, ``cursor()``, ``fetchone``/``fetchall``, ``description``, ``rowcount``), so
``publish_async`` and the inbox's async calls run the same statements, with the same locks and
the same guarantees, on either driver. psycopg stays the fast path: nothing
here runs for a psycopg connection.

* Placeholders become ``$1``, ``$2`` ... once per statement text (cached); a name used twice
  is one parameter. Values are passed positionally; the server infers each parameter's type
  from the statement (our texts cast where inference could go wrong), and asyncpg encodes the
  Python values: UUIDs, bytes, datetimes and lists as they are; jsonb as JSON text, so a
  psycopg ``Jsonb`` wrapper is unwrapped to its JSON text.
* Each statement is prepared once per connection (asyncpg's public ``prepare``) and kept, as
  SQLAlchemy's own asyncpg dialect does: its attributes say whether it returns rows, and its
  status message (``INSERT 0 1``) gives the row count of a statement that returns none.
* Database errors are raised as psycopg's error class of the same SQLSTATE (psycopg is always
  installed), the asyncpg error as the cause, so every ``except psycopg.Error`` and
  :func:`outbox._errors.translate` handle both drivers from one place: a missing table is
  still :class:`~outbox.exceptions.SchemaNotInstalledError`, a serialization failure in the
  inbox still :class:`~inbox.ConcurrentDeliveryError`.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Mapping, Sequence
from functools import lru_cache
from types import TracebackType
from typing import Any, ClassVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Json, Jsonb

__all__ = ["AsyncpgConnection", "adapt", "is_asyncpg", "libpq_conninfo", "positional"]

_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]|%%")


@lru_cache(maxsize=256)
def positional(query: bytes) -> tuple[str, tuple[str, ...]]:
    """``query`` with ``$n`` placeholders for asyncpg, and the parameter name of each ``$n``."""
    names: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _PLACEHOLDER.sub(replace, query.decode()), tuple(names)


def _value(value: Any) -> Any:
    if isinstance(value, Json | Jsonb):
        return json.dumps(value.obj, ensure_ascii=False, separators=(",", ":"))
    if isinstance(value, list | tuple):
        return [_value(v) for v in value]
    return value


def adapt(names: Sequence[str], params: Mapping[str, Any]) -> list[Any]:
    """The positional arguments asyncpg takes for ``params``."""
    return [_value(params[name]) for name in names]


def libpq_conninfo(url: Any) -> str:
    """The libpq connection string of a SQLAlchemy engine URL (asyncpg's query options, which
    libpq does not know, are left out): the doorbell's psycopg session uses it."""
    host = url.host or url.query.get("host")
    parts = {"host": host, "port": url.port, "dbname": url.database, "user": url.username}
    parts["password"] = url.password
    return make_conninfo("", **{k: v for k, v in parts.items() if v is not None})


def is_asyncpg(raw: Any) -> bool:
    """Whether ``raw`` is an asyncpg connection (without importing asyncpg otherwise)."""
    return type(raw).__module__.split(".")[0] == "asyncpg"


class _Error(psycopg.Error):
    """An asyncpg error whose SQLSTATE psycopg does not know."""


def _as_psycopg(exc: Exception) -> psycopg.Error:
    sqlstate = getattr(exc, "sqlstate", None)
    try:
        cls: type[psycopg.Error] = pg_errors.lookup(sqlstate) if sqlstate else _Error
    except KeyError:
        cls = _Error
    return cls(f"{exc} (asyncpg {type(exc).__name__})")


class _Cursor:
    """The result of one statement, shaped like the psycopg cursor our code reads."""

    def __init__(self, conn: AsyncpgConnection) -> None:
        self._conn = conn
        self._rows: list[tuple[Any, ...]] = []
        self.description: Sequence[Any] | None = None
        self.rowcount = -1

    async def execute(self, query: bytes, params: Mapping[str, Any] | None = None) -> _Cursor:
        text, names = positional(query)
        args = adapt(names, params or {})
        import asyncpg

        try:
            stmt = await self._conn.prepared(text)
            records = await stmt.fetch(*args)
        except asyncpg.PostgresError as exc:
            self._conn.forget(text)  # prepared again next time (it may be what went stale)
            raise _as_psycopg(exc) from exc
        attributes = stmt.get_attributes()
        self._rows = [tuple(r) for r in records]
        self.description = attributes or None
        if attributes:
            self.rowcount = len(self._rows)
        else:
            last = (stmt.get_statusmsg() or "").rsplit(" ", 1)[-1]
            self.rowcount = int(last) if last.isdigit() else -1
        return self

    async def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    async def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    async def __aenter__(self) -> _Cursor:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._rows = []


class AsyncpgConnection:
    """An asyncpg connection, with the psycopg operations our async write paths use.

    One per asyncpg connection (:meth:`of`), so the capture mode a connection has learnt
    (``outbox/_capture.py``) and its prepared statements last as long as the connection.
    """

    _by_driver: ClassVar[weakref.WeakKeyDictionary[Any, AsyncpgConnection]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, driver: Any, conninfo: str) -> None:
        self.driver = driver
        #: libpq connection string of the same database, for the doorbell (outbox/_wakeup.py)
        self.conninfo = conninfo
        self._statements: dict[str, Any] = {}

    @classmethod
    def of(cls, driver: Any, url: Any) -> AsyncpgConnection:
        """The wrapper of ``driver``, an asyncpg connection of the engine at SQLAlchemy ``url``."""
        conn = cls._by_driver.get(driver)
        if conn is None:
            conn = cls._by_driver[driver] = cls(driver, libpq_conninfo(url))
        return conn

    async def prepared(self, text: str) -> Any:
        stmt = self._statements.get(text)
        if stmt is None:
            stmt = self._statements[text] = await self.driver.prepare(text)
        return stmt

    def forget(self, text: str) -> None:
        self._statements.pop(text, None)

    def cursor(self) -> _Cursor:
        return _Cursor(self)

    async def execute(self, query: bytes, params: Mapping[str, Any] | None = None) -> _Cursor:
        return await _Cursor(self).execute(query, params)

    def in_transaction(self) -> bool:
        return bool(self.driver.is_in_transaction())
