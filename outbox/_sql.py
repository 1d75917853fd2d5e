"""One convention for every package's SQL: named statements, rendered once per schema.

Each package keeps its statements in one registry module (``outbox/_statements.py``,
``relay/_queries.py``, ``inbox/_statements.py``, ``spark_ingest/_statements.py``): a module-level
text per statement, named after what it does, with the comment that says why it is correct
(locks, snapshots, plans) right above it, and a frozen dataclass with one ``bytes`` field per
statement. :func:`registry` turns the texts into that dataclass for a schema, once per schema.

The texts use psycopg's ``%(name)s`` placeholders for values and ``{name}`` placeholders for
identifiers and fragments. Identifiers are composed with :mod:`psycopg.sql` from validated
names (:func:`outbox.schema.check_identifier`), never formatted into the text, so a schema
that is a reserved word (``user``) is quoted like any other, and ``None`` leaves the tables
unqualified, found through the search_path. A literal brace in a text is written ``{{`` / ``}}``.

This module is outbox's (the bottom layer): the relay, the inbox and the Spark job import it,
never the other way round.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar, cast

from psycopg import sql

from outbox.schema import check_identifier

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "Names",
    "StatementText",
    "bound_by_position",
    "qualified",
    "registry",
    "render",
    "table_name",
]

#: What a registry's ``{name}`` placeholders stand for, per schema: tables, constraint names,
#: fragments of SQL.
Names = Mapping[str, sql.Composable]

#: A statement's text; or its text and fragments of its own (texts too, rendered with the
#: registry's names first) for some of its placeholders, for two statements that differ only
#: in a clause.
StatementText = str | tuple[str, Mapping[str, str]]

R = TypeVar("R", bound="DataclassInstance")


def qualified(schema: str | None, table: str) -> sql.Identifier:
    """``"schema"."table"``; ``"table"`` (found through the search_path) when schema is None."""
    return sql.Identifier(schema, table) if schema else sql.Identifier(table)


def table_name(schema: str | None, table: str) -> sql.Literal:
    """The quoted, qualified table name as a text literal (for ``to_regclass``)."""
    return sql.Literal(qualified(schema, table).as_string(None))


def render(text: StatementText, names: Names) -> bytes:
    """One statement's text with its placeholders filled, as the bytes psycopg sends."""
    if isinstance(text, tuple):
        text, own = text
        names = {**names, **{k: sql.SQL(v).format(**names) for k, v in own.items()}}
    return sql.SQL(text).format(**names).as_string(None).encode()


_NAMED = re.compile(r"%\((\w+)\)s")


def bound_by_position(text: str, order: Sequence[str]) -> str:
    """``text`` with its ``%(name)s`` placeholders written ``%s``, bound from a tuple in
    ``order``: psycopg binds a tuple with less work per call than a mapping, which counts for
    a statement run once per message. Each name must appear once, in ``order``."""
    found = _NAMED.findall(text)
    if found != list(order):
        raise TypeError(f"placeholders {found} are not {list(order)}, each once and in order")
    return _NAMED.sub("%s", text)


def registry(
    cls: type[R],
    texts: Mapping[str, StatementText],
    names: Callable[[str | None], Names],
    *,
    values: Callable[[str | None], Mapping[str, Any]] | None = None,
) -> Callable[[str | None], R]:
    """The function ``schema -> cls`` of a registry, cached per schema (``None``: the
    search_path).

    ``texts`` maps each statement field of ``cls`` (every field typed ``bytes``) to its text;
    ``names(schema)`` gives what the ``{name}`` placeholders stand for; ``values(schema)``, the
    fields that are not statements (a table's name, the schema). The schema is checked before
    anything is rendered. A registry whose texts and fields disagree fails at import.
    """
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    statements = {name for name, kind in fields.items() if kind in (bytes, "bytes")}
    if set(texts) != statements:
        raise TypeError(
            f"{cls.__name__}: statements without a text {sorted(statements - set(texts))}, "
            f"texts without a field {sorted(set(texts) - statements)}"
        )
    make = cast(Callable[..., R], cls)

    @lru_cache(maxsize=32)
    def statements_for(schema: str | None) -> R:
        if schema is not None:
            check_identifier(schema)
        composed = names(schema)
        rendered = {field: render(text, composed) for field, text in texts.items()}
        return make(**rendered, **(values(schema) if values is not None else {}))

    statements_for.__doc__ = f"The {cls.__name__} for tables in ``schema`` (None: search_path)."
    return statements_for
