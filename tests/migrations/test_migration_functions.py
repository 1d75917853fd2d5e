"""Every function the migrations create is written out whole in migrations/functions, and the
database holds exactly what those files say, at every revision, upgrading and downgrading.

``<function>.<revision>.sql`` is the function's complete text as that revision creates it. At
each revision of the chain the test expects, for every function, the file of the newest
revision at or before it; it runs that file's ``CREATE OR REPLACE FUNCTION`` inside a
transaction it rolls back and checks that ``pg_get_functiondef`` did not change (same body,
arguments, defaults, volatility, security, settings) and that no second function of the name
appeared. At the head, every function in the schema is one of ours, with a file.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import psycopg
import pytest
from alembic.script import ScriptDirectory
from psycopg.rows import dict_row

from outbox._migrate import alembic_config, downgrade, upgrade
from outbox_migrations import function_sql, schema_names

FUNCTIONS = Path(__file__).resolve().parents[2] / "migrations" / "functions"
#: The released files, byte for byte (their sha256's first 16 hex digits): each was checked,
#: when written, to create exactly what the earlier text-patching revisions created
#: (pg_get_functiondef at every revision, up and down, with and without a schema). A released
#: revision's text never changes; a new revision adds its own files.
RELEASED = {
    "outbox_check_topic.outbox_0018.sql": "3718160479d4afd9",
    "outbox_dead_purge.outbox_0018.sql": "0530bd56fc6ae3ef",
    "outbox_dead_requeue.outbox_0018.sql": "2d9e5be300383cbe",
    "outbox_idempotency_id.outbox_0009.sql": "59d49c847e5e1988",
    "outbox_oldest_xact_start.outbox_0018.sql": "3156065bf929e291",
    "outbox_publish.outbox_0009.sql": "58cafd03ecd24cd4",
    "outbox_publish.outbox_0010.sql": "fac447749dacb312",
    "outbox_publish.outbox_0012.sql": "5422f8f4207465d6",
    "outbox_publish.outbox_0015.sql": "0a32113141103cca",
    "outbox_publish.outbox_0017.sql": "026808d11dc77c29",
    "outbox_publish.outbox_0018.sql": "98b2825cc464a8ea",
    "outbox_publish.outbox_0024.sql": "a502e5ff520ec8c2",
    "outbox_publish.outbox_0025.sql": "5492621f5ee87b49",
    "outbox_sha1.outbox_0009.sql": "8a762f9aa2ef5bf9",
    "outbox_uuid_v7.outbox_0009.sql": "7458a22989ecb96b",
}
FILE = re.compile(r"^(?P<name>[a-z0-9_]+)\.(?P<revision>[a-z0-9_]+)\.sql$")


def _chain() -> list[str]:
    """The revisions, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    (head,) = script.get_heads()
    return [r.revision for r in reversed(list(script.walk_revisions("base", head)))]


def _files() -> dict[str, dict[str, str]]:
    """revision -> {function name: file name}"""
    found: dict[str, dict[str, str]] = {}
    for path in sorted(FUNCTIONS.iterdir()):
        match = FILE.match(path.name)
        assert match, f"{path.name}: name it <function>.<revision>.sql"
        found.setdefault(match["revision"], {})[match["name"]] = path.name
    return found


def _expected(chain: list[str], at: str) -> dict[str, str]:
    """function name -> the revision whose file holds its text at revision ``at``."""
    files = _files()
    latest: dict[str, str] = {}
    for revision in chain[: chain.index(at) + 1]:
        for name in files.get(revision, {}):
            latest[name] = revision
    return latest


def _definitions(conn: psycopg.Connection[dict[str, object]], schema: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT p.proname AS name, pg_get_functiondef(p.oid) AS definition FROM pg_proc AS p "
        "JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = %s",
        [schema],
    ).fetchall()
    names = [str(r["name"]) for r in rows]
    assert len(names) == len(set(names)), f"overloaded functions in {schema}: {sorted(names)}"
    return {str(r["name"]): str(r["definition"]) for r in rows}


def _check(url: str, schema: str | None, chain: list[str], at: str) -> None:
    expected = _expected(chain, at)
    names = schema_names(schema)
    with psycopg.connect(url, row_factory=dict_row) as conn:
        before = _definitions(conn, schema or "public")
        assert set(before) == set(expected), f"at {at}: functions {sorted(before)}"
        for name, revision in sorted(expected.items()):
            conn.execute(function_sql(name, revision, **names))
        after = _definitions(conn, schema or "public")
        conn.rollback()
    for name, revision in sorted(expected.items()):
        assert after[name] == before[name], f"at {at}: {name} is not {name}.{revision}.sql"


@pytest.mark.parametrize("schema", [None, "messaging"])
def test_each_revision_holds_the_functions_its_files_state(
    empty_database_url: str, schema: str | None
) -> None:
    chain = _chain()
    for revision in chain:
        upgrade(empty_database_url, schema=schema, revision=revision)
        _check(empty_database_url, schema, chain, revision)
    for revision in reversed(chain[:-1]):
        downgrade(empty_database_url, revision, schema=schema)
        _check(empty_database_url, schema, chain, revision)


def test_every_file_belongs_to_a_revision_and_is_one_function() -> None:
    chain = _chain()
    for revision, files in _files().items():
        assert revision in chain, f"{sorted(files.values())}: no revision {revision}"
        for name, file in files.items():
            text = (FUNCTIONS / file).read_text(encoding="utf-8")
            creates = re.findall(r"(?m)^CREATE OR REPLACE FUNCTION \{fn\}(\w+)\(", text)
            assert creates == [name], f"{file}: one CREATE OR REPLACE FUNCTION {{fn}}{name}("


def test_a_missing_file_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="no text of function outbox_nothing"):
        function_sql("outbox_nothing", "outbox_0009")


def test_released_function_texts_never_change() -> None:
    changed = [
        name
        for name, digest in RELEASED.items()
        if hashlib.sha256((FUNCTIONS / name).read_bytes()).hexdigest()[:16] != digest
    ]
    assert changed == [], f"{changed}: a released revision's function changed; add a revision"
