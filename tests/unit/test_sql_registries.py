"""Every SQL registry renders, through the one convention of outbox/_sql.py, for a schema (quoted,
even a reserved word) and for the search_path, and the two renderings differ only there."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest
from psycopg import sql

from inbox._statements import inbox_statements
from outbox import schema as tables
from outbox._sql import qualified, registry, render, table_name
from outbox._statements import producer_statements, redrive_statements
from outbox._trace_statements import trace_statements
from outbox.exceptions import ConfigurationError
from relay._queries import relay_statements
from relay._replay_statements import replay_statements
from spark_ingest._statements import spark_statements

REGISTRIES: dict[str, Callable[[str | None], Any]] = {
    "producer": producer_statements,
    "redrive": redrive_statements,
    "relay": relay_statements,
    "inbox": inbox_statements,
    "spark": spark_statements,
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
