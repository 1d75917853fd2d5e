"""Where the operator functions run their statements: a URL (a connection of their own, closed
after) or a connection the caller holds (the console lends one from its pool per call).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg

__all__ = ["Database", "connected"]

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
