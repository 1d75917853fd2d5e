"""``outbox migrate downgrade base`` leaves nothing of ours (its version table goes too), and
``outbox migrate current`` without ``--schema`` names the schema the tables are in."""

from __future__ import annotations

import psycopg
from click.testing import CliRunner

from outbox.cli import main


def _tables(url: str) -> set[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
    return {(s, t) for s, t in rows}


def test_downgrade_base_leaves_no_version_table_and_current_names_the_schema(
    empty_database_url: str,
) -> None:
    runner = CliRunner()
    url = ["--url", empty_database_url]
    up = runner.invoke(main, ["migrate", "upgrade", *url, "--schema", "messaging"])
    assert up.exit_code == 0, up.output
    plain = runner.invoke(main, ["migrate", "current", *url])
    assert plain.output.strip() == (
        "(none) in the search_path: the tables are in messaging: pass --schema messaging (or "
        "set OUTBOX_SCHEMA)"
    )
    named = runner.invoke(main, ["migrate", "current", *url, "--schema", "messaging"])
    assert "(head)" in named.output
    down = runner.invoke(main, ["migrate", "downgrade", "base", *url, "--schema", "messaging"])
    assert down.exit_code == 0, down.output
    assert {t for s, t in _tables(empty_database_url) if s == "messaging"} == set()
    gone = runner.invoke(main, ["migrate", "current", *url, "--schema", "messaging"])
    assert gone.output.strip() == (
        "(none) in schema messaging: run `outbox migrate upgrade` to create them"
    )
    # and without a schema, the same
    runner.invoke(main, ["migrate", "upgrade", *url])
    runner.invoke(main, ["migrate", "downgrade", "base", *url])
    assert {t for s, t in _tables(empty_database_url) if s == "public"} == set()
