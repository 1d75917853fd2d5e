"""One convention for every package's SQL: named statements in a ``.sql`` file, rendered once
per schema.

Each package keeps its SQL in one file, ``statements.sql`` beside its modules (``outbox``,
``relay``, ``inbox``, ``spark_ingest``), and declares the statements' names once in Python, as
the fields of frozen dataclasses (what mypy and the callers see: ``stmts.claim``). :func:`load`
reads the file when the package's registry module is imported and checks it against those
fields; :func:`registry` turns it into one dataclass instance per schema, cached.

The file's format (the ``-- name:`` headers of procrastinate's ``queries.sql``)::

    -- name: claim
    -- The comment that says why the statement is correct (locks, snapshots, plans).
    WITH RECURSIVE keys AS (...)

    -- name: insert_one
    -- name: insert_one_idempotent (guard = idempotency_guard)
    -- Two statements, one text: see "Variants" below.
    WITH bumped AS (... {guard} ...)

    -- name: record_args (by position: consumer, id, topic, key, seq)
    ...

    -- fragment: holds(t)
    (CASE WHEN {t}.topic = ... END)

* ``-- name: NAME`` starts a statement: the text up to the next header. The comment lines
  right after the header are its documentation and are not sent, nor are comment lines at the
  end of the text (a comment on the statements that follow); comments inside the text are.
  Lines before the first header are the file's own comment.
* **Variants.** Headers that follow one another (only comments between them) name variants of
  the one text that follows them. A header may bind a placeholder of that text to a fragment,
  ``(guard = idempotency_guard)``; a variant that does not bind it has it empty. Every
  placeholder a variant binds must be bound by a fragment of the file.
* **By position.** ``(by position: a, b, c)``: the statement's ``%(a)s`` placeholders are sent
  as ``%s`` and bound from a tuple in that order (psycopg binds a tuple with less work per
  call than a mapping, which counts for a statement run once per message). Each name must
  appear once, in that order.
* ``-- fragment: NAME`` or ``-- fragment: NAME(p, ...)``: a piece of SQL that statements of the
  same file include as ``{NAME}``, or ``{NAME(alias, ...)}`` with each parameter ``{p}``
  replaced by the quoted identifier given at the use.

Placeholders: psycopg's ``%(name)s`` (``%(name)b`` binary, ``%(name)t`` text) for values, a
literal ``%`` written ``%%``, and ``{name}`` for identifiers and fragments of SQL, filled from the
registry's names (tables, constraint names, literals). Identifiers are composed with
:mod:`psycopg.sql` from validated names (:func:`outbox.schema.check_identifier`), never
formatted into the text, so a schema that is a reserved word (``user``) is quoted like any
other, and ``None`` leaves the tables unqualified, found through the search_path. A literal
brace is written ``{{`` / ``}}``.

Checked at import (:class:`SqlFileError`, naming the file and line): every name the package
declares has a statement and every statement is declared (no duplicates); every ``%``
placeholder is well-formed; every ``{name}`` of a registry's statement is one of its names or a
fragment of the file; statements bound by position have each parameter once, in order.
Statements whose ``{placeholders}`` the caller fills per call (an object's name, a role) are
declared as :data:`psycopg.sql.SQL` fields and built with :func:`templates`.

This module is outbox's (the bottom layer): the relay, the inbox and the Spark job import it,
never the other way round.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from psycopg import sql

from outbox.schema import check_identifier

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "Names",
    "SqlFile",
    "SqlFileError",
    "StatementText",
    "bound_by_position",
    "load",
    "parse",
    "qualified",
    "registry",
    "render",
    "table_name",
    "templates",
]

#: What a registry's ``{name}`` placeholders stand for, per schema: tables, constraint names,
#: fragments of SQL.
Names = Mapping[str, sql.Composable]

#: A statement's text given in Python (a registry not moved to a ``.sql`` file: the console's);
#: or its text and fragments of its own for some of its placeholders.
StatementText = str | tuple[str, Mapping[str, str]]

R = TypeVar("R", bound="DataclassInstance")


class SqlFileError(ValueError):
    """A package's ``.sql`` file disagrees with the names the package declares, or a statement
    in it is malformed. Raised at import."""


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


_NAMED = re.compile(r"%\((\w+)\)([sbt])")
# every % of a text: a named placeholder, an escaped %, or (group 4) anything else
_PERCENT = re.compile(r"%\((\w+)\)([sbt])|%(%)|(%\(?[^%]{0,12})")


def bound_by_position(text: str, order: Sequence[str]) -> str:
    """``text`` with its ``%(name)s`` placeholders written ``%s`` (``%(name)b``: ``%b``), bound
    from a tuple in ``order``. Each name must appear once, in ``order``."""
    found = [name for name, _ in _NAMED.findall(text)]
    if found != list(order):
        raise TypeError(f"placeholders {found} are not {list(order)}, each once and in order")
    return _NAMED.sub(r"%\2", text)


# --- The .sql file -------------------------------------------------------------------------

_HEADER = re.compile(r"--\s*(name|fragment):\s*(.*?)\s*$")
_NAME_HEAD = re.compile(r"([a-z_][a-z0-9_]*)\s*(?:\((.*)\))?$")
_CALL = re.compile(r"([a-z_][a-z0-9_]*)(?:\(([\w\s,]*)\))?$")
_IDENT = re.compile(r"[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class Fragment:
    name: str
    text: str
    params: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class Statement:
    name: str
    text: str
    #: placeholder -> fragment that fills it in this variant
    binds: Mapping[str, str]
    #: the placeholders the text's other variants bind (empty here unless bound)
    variant_slots: frozenset[str]
    #: (by position: ...) order, or None
    order: tuple[str, ...] | None
    line: int


@dataclass(frozen=True)
class SqlFile:
    """A parsed ``.sql`` file: its statements and fragments by name."""

    where: str
    statements: Mapping[str, Statement]
    fragments: Mapping[str, Fragment]

    def error(self, line: int, message: str) -> SqlFileError:
        return SqlFileError(f"{self.where}:{line}: {message}")

    def expand(self, name: str) -> str:
        """The statement's text with its fragments and variant placeholders filled in (still
        with the registry's ``{names}``), as psycopg.sql formats it."""
        stmt = self.statements[name]
        fills = {slot: "" for slot in stmt.variant_slots}
        for slot, fragment in stmt.binds.items():
            fills[slot] = self._include(fragment, (), stmt.line, ())
        text = self._expand(stmt.text, fills, stmt.line, ())
        if stmt.order is not None:
            try:
                text = bound_by_position(text, stmt.order)
            except TypeError as exc:
                raise self.error(stmt.line, f"{name}: {exc}") from None
        return text

    def placeholders(self, name: str) -> set[str]:
        """The ``{names}`` the expanded statement still needs from its registry."""
        return {
            field for _, field, _, _ in string.Formatter().parse(self.expand(name)) if field
        }

    def _include(self, name: str, args: Sequence[str], line: int, seen: tuple[str, ...]) -> str:
        frag = self.fragments.get(name)
        if frag is None:
            raise self.error(line, f"no fragment {name!r} in this file")
        if name in seen:
            raise self.error(line, f"fragment {name!r} includes itself")
        if len(args) != len(frag.params):
            raise self.error(
                line, f"fragment {name!r} takes {len(frag.params)} argument(s), not {len(args)}"
            )
        fills = {
            p: sql.Identifier(a).as_string(None) for p, a in zip(frag.params, args, strict=True)
        }
        return self._expand(frag.text, fills, frag.line, (*seen, name))

    def _expand(
        self, text: str, fills: Mapping[str, str], line: int, seen: tuple[str, ...]
    ) -> str:
        out: list[str] = []
        for literal, field, spec, conversion in string.Formatter().parse(text):
            out.append(literal.replace("{", "{{").replace("}", "}}"))
            if field is None:
                continue
            if spec or conversion:
                raise self.error(line, f"placeholder {{{field}}}: no format spec or conversion")
            call = _CALL.match(field)
            if call is None:
                raise self.error(line, f"malformed placeholder {{{field}}}")
            ident, arglist = call.groups()
            if arglist is not None:
                args = [a.strip() for a in arglist.split(",") if a.strip()]
                out.append(self._include(ident, args, line, seen))
            elif ident in fills:
                out.append(fills[ident])
            elif ident in self.fragments:
                out.append(self._include(ident, (), line, seen))
            else:
                out.append("{" + ident + "}")
        return "".join(out)


def _check_percents(text: str, where: str) -> None:
    for m in _PERCENT.finditer(text):
        if m.group(4) is not None:
            raise SqlFileError(
                f"{where}: malformed parameter {m.group(4)!r}: write %(name)s (or %(name)b, "
                "%(name)t), and a literal % as %%"
            )


class _Head(NamedTuple):
    name: str
    options: str | None
    line: int


class _Block(NamedTuple):
    """Headers (several: variants of one text) and the lines that follow them."""

    kind: str
    heads: list[_Head]
    body: list[str]


def parse(text: str, where: str) -> SqlFile:
    """Parse the text of a ``.sql`` file (see the module's docstring); ``where`` names it in
    errors."""
    statements: dict[str, Statement] = {}
    fragments: dict[str, Fragment] = {}
    blocks: list[_Block] = []
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line.strip())
        if header is not None:
            kind, rest = header.groups()
            head = _NAME_HEAD.match(rest)
            if head is None:
                raise SqlFileError(f"{where}:{number}: malformed header {line.strip()!r}")
            name, options = head.groups()
            entry = _Head(name, options, number)
            last = blocks[-1] if blocks else None
            if (
                kind == "name"
                and last is not None
                and last.kind == "name"
                and all(not b.strip() or b.strip().startswith("--") for b in last.body)
            ):
                last.heads.append(entry)  # a variant of the text that follows
            else:
                blocks.append(_Block(kind, [entry], []))
        elif blocks:
            blocks[-1].body.append(line)
        elif line.strip() and not line.strip().startswith("--"):
            raise SqlFileError(f"{where}:{number}: SQL before the first '-- name:' header")

    seen: dict[str, int] = {}
    for kind, heads, body in blocks:
        for name, _, number in heads:
            if name in seen:
                raise SqlFileError(
                    f"{where}:{number}: duplicate name {name!r} (first at line {seen[name]})"
                )
            seen[name] = number
        lines = list(body)
        while lines and (not lines[0].strip() or lines[0].strip().startswith("--")):
            lines.pop(0)  # the statement's documentation
        while lines and (not lines[-1].strip() or lines[-1].strip().startswith("--")):
            lines.pop()  # a comment on what follows
        sql_text = "\n".join(lines).strip()
        first = heads[0].line
        if not sql_text:
            raise SqlFileError(f"{where}:{first}: {heads[0].name!r} has no SQL")
        _check_percents(sql_text, f"{where}:{first}")
        if kind == "fragment":
            name, params, number = heads[0]
            names = tuple(p.strip() for p in (params or "").split(",") if p.strip())
            if any(not _IDENT.match(p) for p in names):
                raise SqlFileError(f"{where}:{number}: malformed parameters ({params})")
            fragments[name] = Fragment(name, sql_text, names, number)
            continue
        parsed: list[tuple[str, dict[str, str], tuple[str, ...] | None, int]] = []
        for name, options, number in heads:
            binds: dict[str, str] = {}
            order: tuple[str, ...] | None = None
            if options is not None and options.strip().startswith("by position:"):
                order = tuple(
                    p.strip() for p in options.split(":", 1)[1].split(",") if p.strip()
                )
            elif options is not None:
                for part in options.split(","):
                    slot, eq, fragment = (s.strip() for s in part.partition("="))
                    if not eq or not _IDENT.match(slot) or not _IDENT.match(fragment):
                        raise SqlFileError(
                            f"{where}:{number}: malformed option {part.strip()!r}: write "
                            "(placeholder = fragment, ...) or (by position: a, b, ...)"
                        )
                    binds[slot] = fragment
            parsed.append((name, binds, order, number))
        slots = frozenset(s for _, binds, _, _ in parsed for s in binds)
        for name, binds, order, number in parsed:
            statements[name] = Statement(name, sql_text, binds, slots, order, number)
    loaded = SqlFile(where, statements, fragments)
    for name in statements:
        loaded.expand(name)  # fragments exist, take their arguments, positions check out
    return loaded


def _statement_fields(cls: type[Any]) -> list[str]:
    """The fields of ``cls`` that are statements: typed ``bytes`` (rendered per schema) or
    ``sql.SQL`` (templates, composed per call)."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.type in (bytes, "bytes", sql.SQL, "sql.SQL", "SQL")
    ]


def load(
    package: str, *declared: type[Any], resource: str = "statements.sql", text: str | None = None
) -> SqlFile:
    """The package's ``.sql`` file (read with :mod:`importlib.resources`), checked against the
    statement fields of the ``declared`` dataclasses: each field names one statement of the
    file and each statement is one field's (``text``: the file's text, for tests)."""
    where = f"{package.replace('.', '/')}/{resource}"
    if text is None:
        text = resources.files(package).joinpath(resource).read_text(encoding="utf-8")
    loaded = parse(text, where)
    wanted: dict[str, str] = {}
    for cls in declared:
        for name in _statement_fields(cls):
            if name in wanted:
                raise SqlFileError(f"{where}: {name!r} is declared by {wanted[name]} and {cls}")
            wanted[name] = cls.__name__
    missing = sorted(set(wanted) - set(loaded.statements))
    extra = sorted(set(loaded.statements) - set(wanted))
    if missing or extra:
        raise SqlFileError(
            f"{where}: the file and {', '.join(c.__name__ for c in declared)} disagree: "
            f"declared without a statement {missing}, statements not declared {extra}"
        )
    return loaded


def registry(
    cls: type[R],
    texts: SqlFile | Mapping[str, StatementText],
    names: Callable[[str | None], Names],
    *,
    values: Callable[[str | None], Mapping[str, Any]] | None = None,
) -> Callable[[str | None], R]:
    """The function ``schema -> cls`` of a registry, cached per schema (``None``: the
    search_path).

    ``texts``: the package's :func:`load`-ed file, whose statements fill the ``bytes`` fields
    of ``cls`` (or, for a registry still written in Python, a mapping of field to text);
    ``names(schema)`` gives what the ``{name}`` placeholders stand for; ``values(schema)``, the
    fields that are not statements (a table's name, the schema). The schema is checked before
    anything is rendered. A statement whose placeholders are not all among the names, or fields
    without a statement, fail at import.
    """
    statements = [
        f.name for f in dataclasses.fields(cls) if f.type in (bytes, "bytes")
    ]
    known = set(names(None))
    expanded: dict[str, StatementText]
    if isinstance(texts, SqlFile):
        missing = sorted(set(statements) - set(texts.statements))
        if missing:
            raise SqlFileError(f"{texts.where}: no statement for {cls.__name__} {missing}")
        expanded = {name: texts.expand(name) for name in statements}
        for name in statements:
            unknown = sorted(texts.placeholders(name) - known)
            if unknown:
                line = texts.statements[name].line
                raise texts.error(
                    line, f"{name}: unknown placeholder(s) {unknown}; known: {sorted(known)}"
                )
    else:
        if set(texts) != set(statements):
            raise TypeError(
                f"{cls.__name__}: statements without a text "
                f"{sorted(set(statements) - set(texts))}, "
                f"texts without a field {sorted(set(texts) - set(statements))}"
            )
        expanded = dict(texts)
    make = cast(Callable[..., R], cls)

    @lru_cache(maxsize=32)
    def statements_for(schema: str | None) -> R:
        if schema is not None:
            check_identifier(schema)
        composed = names(schema)
        rendered = {field: render(text, composed) for field, text in expanded.items()}
        return make(**rendered, **(values(schema) if values is not None else {}))

    statements_for.__doc__ = f"The {cls.__name__} for tables in ``schema`` (None: search_path)."
    return statements_for


def templates(cls: type[R], texts: SqlFile) -> R:
    """``cls`` with each of its ``sql.SQL`` fields the file's statement of that name: texts
    whose ``{placeholders}`` the caller fills per call (``.format(name=sql.Identifier(...))``)."""
    fields = _statement_fields(cls)
    return cast(Callable[..., R], cls)(**{f: sql.SQL(texts.expand(f)) for f in fields})

