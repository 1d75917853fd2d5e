"""Every SQL registry renders, through the one convention of outbox/_sql.py, for a schema (quoted,
even a reserved word) and for the search_path, and the two renderings differ only there; the
loader of the packages' ``statements.sql`` files refuses a file that disagrees with the names
its package declares, or a malformed statement, at import; and no SQL is left in the packages'
Python source."""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from inbox._statements import inbox_statements
from outbox import schema as tables
from outbox._sql import SqlFileError, load, qualified, registry, render, table_name, templates
from outbox._statements import doorbell_statements, producer_statements, redrive_statements
from outbox._trace_statements import trace_statements
from outbox.exceptions import ConfigurationError
from relay._replay_statements import replay_statements
from relay._statements import relay_statements
from spark_ingest._statements import spark_statements

REGISTRIES: dict[str, Callable[[str | None], Any]] = {
    "producer": producer_statements,
    "redrive": redrive_statements,
    "relay": relay_statements,
    "inbox": inbox_statements,
    "spark": spark_statements,
    "doorbell": doorbell_statements,
    "trace": trace_statements,
    "replay": replay_statements,
}

#: Every table of ours: a quoted reference to one of them must be schema-qualified.
TABLES = sorted(
    getattr(tables, name)
    for name in dir(tables)
    if name.startswith(("OUTBOX_", "INBOX_", "RECONCILIATION_")) and name.isupper()
)

#: A lower-case identifier that check_identifier accepts but PostgreSQL reserves: it only
#: works quoted.
SCHEMA = "user"


def _statements(stmts: Any) -> dict[str, str]:
    return {
        f.name: getattr(stmts, f.name).decode()
        for f in dataclasses.fields(stmts)
        if isinstance(getattr(stmts, f.name), bytes)
    }


@pytest.mark.parametrize("name", REGISTRIES)
def test_registry_renders_for_a_quoted_schema_and_for_the_search_path(name: str) -> None:
    in_schema = _statements(REGISTRIES[name](SCHEMA))
    on_path = _statements(REGISTRIES[name](None))
    assert in_schema
    assert in_schema.keys() == on_path.keys()
    for field, text in in_schema.items():
        assert not re.search(r"\{[a-z_]+\}", text), f"{name}.{field}: placeholder left"
        # The schema is the only difference, and it is always quoted.
        assert text.replace(f'"{SCHEMA}".', "") == on_path[field], f"{name}.{field}"
        assert f"{SCHEMA}." not in text.replace(f'"{SCHEMA}".', ""), f"{name}.{field}"
        for table in TABLES:
            bare = len(re.findall(rf'(?<!\.)"{table}"', text))
            assert bare == 0, f"{name}.{field}: {table} not qualified"
            unquoted = len(re.findall(rf"\b{table}\b", text)) - text.count(f'"{table}"')
            assert unquoted == 0, f"{name}.{field}: {table} written into the text"
            assert len(re.findall(rf'"{table}"', on_path[field])) == text.count(
                f'"{SCHEMA}"."{table}"'
            )
        assert f'"{SCHEMA}"' not in on_path[field]


@pytest.mark.parametrize("name", REGISTRIES)
def test_registry_is_rendered_once_per_schema(name: str) -> None:
    assert REGISTRIES[name](SCHEMA) is REGISTRIES[name](SCHEMA)
    assert REGISTRIES[name](None) is REGISTRIES[name](None)
    assert REGISTRIES[name](SCHEMA) is not REGISTRIES[name](None)


@pytest.mark.parametrize("name", REGISTRIES)
@pytest.mark.parametrize("bad", ["Odd Schema", "Messaging", "a;b", "1st", ""])
def test_registry_refuses_a_schema_that_is_no_plain_identifier(name: str, bad: str) -> None:
    with pytest.raises(ConfigurationError, match="invalid schema name"):
        REGISTRIES[name](bad)


def test_names_that_are_not_statements() -> None:
    assert inbox_statements(SCHEMA).schema == SCHEMA
    assert inbox_statements(None).schema is None
    assert spark_statements(SCHEMA).runs_name == '"user"."outbox_reconciliation_runs"'


def test_helpers_quote_and_qualify() -> None:
    assert qualified("user", "t").as_string(None) == '"user"."t"'
    assert qualified(None, "t").as_string(None) == '"t"'
    assert table_name("user", "t").as_string(None) == '\'"user"."t"\''
    names = {"t": qualified("user", "t")}
    assert render("SELECT 1 FROM {t} WHERE x = %(x)s", names) == (
        b'SELECT 1 FROM "user"."t" WHERE x = %(x)s'
    )
    # A statement's own fragment is rendered with the registry's names first.
    own = ("SELECT 1 {guard}", {"guard": "FROM {t}"})
    assert render(own, names) == b'SELECT 1 FROM "user"."t"'
    assert render(("SELECT 1{guard}", {"guard": ""}), names) == b"SELECT 1"
    assert render("SELECT '{{}}'::jsonb", names) == b"SELECT '{}'::jsonb"


def test_registry_whose_texts_and_fields_disagree_fails_at_once() -> None:
    @dataclasses.dataclass(frozen=True)
    class Two:
        first: bytes
        second: bytes

    def names(schema: str | None) -> dict[str, sql.Composable]:
        return {}

    with pytest.raises(TypeError, match=r"without a text \['second'\]"):
        registry(Two, {"first": "SELECT 1"}, names)
    with pytest.raises(TypeError, match=r"texts without a field \['third'\]"):
        registry(Two, {"first": "SELECT 1", "second": "SELECT 2", "third": "SELECT 3"}, names)
    two = registry(Two, {"first": "SELECT 1", "second": "SELECT 2"}, names)
    assert two(None) == Two(b"SELECT 1", b"SELECT 2")


# --- The loader ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Two:
    first: bytes
    second: bytes
    schema: str | None = None


def _names(schema: str | None) -> dict[str, sql.Composable]:
    return {"t": qualified(schema, "t")}


TWO = """
-- The file's own comment.

-- name: first
-- What the first does.
SELECT 1 FROM {t} WHERE x = %(x)s

-- name: second
SELECT 2
"""


def test_a_file_loads_and_renders_without_its_comments() -> None:
    two = registry(Two, load("outbox", Two, text=TWO), _names)
    assert two("user") == Two(b'SELECT 1 FROM "user"."t" WHERE x = %(x)s', b"SELECT 2")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (TWO.replace("-- name: second\nSELECT 2\n", ""),
         r"declared without a statement \['second'\], statements not declared \[\]"),
        (TWO + "\n-- name: third\nSELECT 3\n",
         r"declared without a statement \[\], statements not declared \['third'\]"),
        (TWO + "\n-- name: first\nSELECT 3\n",
         r"outbox/statements.sql:11: duplicate name 'first' \(first at line 4\)"),
        (TWO.replace("{t}", "{table}"), r"first: unknown placeholder\(s\) \['table'\]"),
        (TWO.replace("%(x)s", "%s"), r"malformed parameter '%s'"),
        (TWO.replace("%(x)s", "%(x)d"), r"malformed parameter"),
        (TWO.replace("SELECT 2", ""), r"'second' has no SQL"),
        ("SELECT 0\n" + TWO, r"SQL before the first '-- name:' header"),
        (TWO.replace("-- name: second", "-- name: second (guard = nothing)"),
         r"no fragment 'nothing'"),
        (TWO.replace("-- name: second", "-- name: second (by position: y)"),
         r"second: placeholders \[\] are not \['y'\]"),
        (TWO.replace("-- name: second", "-- name: Second!"), r"malformed header"),
    ],
    ids=["missing", "extra", "duplicate", "unknown placeholder", "positional %s",
         "bad % type", "empty", "SQL before a header", "unknown fragment", "by position",
         "malformed header"],
)  # fmt: skip
def test_a_file_that_disagrees_or_is_malformed_fails_at_load(text: str, message: str) -> None:
    with pytest.raises(SqlFileError, match=message):
        registry(Two, load("outbox", Two, text=text), _names)


def test_variants_fragments_and_positions() -> None:
    text = """
-- name: first
-- name: second (guard = guard)
-- One text, two statements: `guard` is empty in the first.
SELECT 1 FROM {t} {guard}

-- fragment: guard
WHERE {alias(u)} AND x = %(x)s AND y = %(y)s

-- fragment: alias(a)
{a}.ok

-- name: third (by position: x, y)
SELECT %(x)s, %(y)b, '{{}}'::jsonb, 100 %% 7
"""

    @dataclasses.dataclass(frozen=True)
    class Three:
        first: bytes
        second: bytes
        third: bytes

    three = registry(Three, load("outbox", Three, text=text), _names)(None)
    assert three.first == b'SELECT 1 FROM "t" '
    assert three.second == b'SELECT 1 FROM "t" WHERE "u".ok AND x = %(x)s AND y = %(y)s'
    assert three.third == b"SELECT %s, %b, '{}'::jsonb, 100 %% 7"


def test_templates_are_completed_per_call() -> None:
    @dataclasses.dataclass(frozen=True)
    class Grants:
        grant: sql.SQL

    loaded = load("outbox", Grants, text="-- name: grant\nGRANT {what} TO {role}\n")
    grant = templates(Grants, loaded).grant.format(what=sql.SQL("x"), role=sql.Identifier("r"))
    assert grant.as_string(None) == 'GRANT x TO "r"'


@pytest.mark.parametrize("package", ["outbox", "inbox", "relay", "spark_ingest"])
def test_every_package_file_is_loaded_whole(package: str) -> None:
    """Each package's statements.sql is read by its registry module (every statement declared,
    see ``load``) and ships beside it."""
    path = Path(__file__).parents[2] / package / "statements.sql"
    assert path.is_file()
    names = re.findall(r"^-- name: (\w+)", path.read_text(), re.MULTILINE)
    assert names
    assert len(names) == len(set(names))


# --- No SQL outside the .sql files -----------------------------------------------------------

#: A string literal that is a statement: it starts with a statement's keywords.
STATEMENT = re.compile(
    r"""^\s*(
        SELECT\s+(?!,)\S | WITH\s+(RECURSIVE\s+)?\w+\s+AS\b | INSERT\s+INTO\b
      | UPDATE\s+\S+\s+(AS\s+\w+\s+)?SET\b | DELETE\s+FROM\b | (CREATE|ALTER|DROP)\s+[A-Z]
      | GRANT\s+\S.*\b(ON|TO)\b | REVOKE\s | LISTEN\s | NOTIFY\s | SHOW\s+\w
      | SET\s+(LOCAL\s+|SESSION\s+)?\w+\s*(=|\bTO\b) | TRUNCATE\s | START_REPLICATION\b
    )""",
    re.VERBOSE | re.DOTALL,
)
PACKAGES = ["outbox", "inbox", "relay", "spark_ingest", "outbox_console"]


def _literals(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module (f-strings by their constant parts), docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            parts = (v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
            found.append((node.lineno, "".join(map(str, parts))))
    return found


def test_no_sql_text_in_the_packages_python_source() -> None:
    root = Path(__file__).parents[2]
    found = [
        f"{path.relative_to(root)}:{line}: {text.strip()[:60]!r}"
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        for line, text in _literals(path)
        if STATEMENT.match(text)
    ]
    assert found == []


@pytest.mark.parametrize(
    "text",
    ["SELECT 1", "\nWITH x AS (SELECT 1) SELECT * FROM x", "UPDATE {} SET mode = 'wal'",
     "SET LOCAL synchronous_commit = on", "LISTEN outbox_wakeup_v1", "SHOW wal_level",
     "GRANT {} ON TABLE {} TO {}", "CREATE PUBLICATION {}", "INSERT INTO t VALUES (1)",
     "DELETE FROM t", "START_REPLICATION SLOT"],
)  # fmt: skip
def test_the_sql_check_sees_statements(text: str) -> None:
    assert STATEMENT.match(text)


@pytest.mark.parametrize(
    "text",
    ["SELECT, INSERT, UPDATE", "SELECT", "select the rows", "set it in postgresql.conf",
     "grant that user SELECT: GRANT SELECT ON t TO u", "Updated {} rows"],
)
def test_the_sql_check_lets_prose_and_privilege_names_be(text: str) -> None:
    assert not STATEMENT.match(text)


# Rows read by name: tests/unit/test_named_rows.py.
