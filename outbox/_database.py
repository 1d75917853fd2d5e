"""Where the operator functions run their statements: a URL (a connection of their own, closed
after) or a connection the caller holds (the console lends one from its pool per call).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg

__all__ = ["Database", "connected", "row_by_name", "rows_by_name"]

#: A libpq URL or conninfo string, or an open psycopg connection.
Database: TypeAlias = "str | psycopg.Connection[Any]"


@contextmanager
def connected(
    database: Database, *, transaction: bool = False
) -> Iterator[psycopg.Connection[Any]]:
    """A connection to ``database``. With ``transaction``, the block is one transaction,
    committed when it ends without an exception (on the caller's connection: a transaction
    block, a savepoint if the caller already has a transaction open); without, statements run
    as they come (a URL's own connection is in autocommit mode)."""
    if isinstance(database, str):
        with psycopg.connect(database, autocommit=not transaction) as conn:
            yield conn
    elif transaction:
        with database.transaction():
            yield database
    else:
        yield database


def rows_by_name(cursor: Any, rows: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """``rows`` of ``cursor``'s last statement as dicts, column name -> value.

    For the cursors that give tuples whatever is asked: the asyncpg wrapper's
    (``outbox/_asyncpg.py``) beside psycopg's, behind one ``raw`` connection. A psycopg
    cursor of our own is opened with ``row_factory=dict_row`` or ``class_row`` instead.
    """
    names = [column.name for column in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in rows]


def row_by_name(cursor: Any, row: Sequence[Any] | None) -> dict[str, Any] | None:
    """One row of ``cursor``'s last statement as a dict (None: no row); see rows_by_name."""
    return None if row is None else rows_by_name(cursor, [row])[0]
