"""The relay's revision matches schema.py, in the default schema and a named one, and downgrades."""

from __future__ import annotations

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from outbox import _migrate
from outbox.schema import make_metadata


@pytest.mark.parametrize("schema", [None, "messaging"])
def test_migration_relay_revision_matches_schema(
    empty_database_url: str, schema: str | None
) -> None:
    _migrate.upgrade(empty_database_url, schema=schema)
    engine = create_engine(_migrate.sqlalchemy_url(empty_database_url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "include_schemas": schema is not None,
                    "include_name": lambda name, type_, parent: type_ != "schema" or name == schema,
                    "include_object": lambda obj, name, type_, r, c: (
                        name != "outbox_alembic_version"
                    ),
                },
            )
            diff = compare_metadata(ctx, make_metadata(schema))
    finally:
        engine.dispose()
    assert diff == []


def test_migration_relay_downgrade_removes_relay_objects(empty_database_url: str) -> None:
    _migrate.upgrade(empty_database_url)
    _migrate.downgrade(empty_database_url, "outbox_0001")
    with psycopg.connect(empty_database_url) as conn:
        cols = {
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'outbox_messages'"
            )
        }
        relays = conn.execute("SELECT to_regclass('outbox_relays')").fetchone()
    assert "lease_token" not in cols
    assert "status" in cols
    assert relays == (None,)
    _migrate.upgrade(empty_database_url)
