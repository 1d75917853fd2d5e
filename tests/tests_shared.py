"""Assertions shared by several test folders."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from outbox import make_metadata
from outbox._migrate import sqlalchemy_url


def assert_schema_matches(url: str, schema: str | None) -> None:
    """The migrated database equals ``make_metadata(schema)``: no autogenerate difference."""
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "compare_server_default": True,
                "include_schemas": schema is not None,
                "include_name": lambda name, type_, _: type_ != "schema" or name == schema,
            },
        )
        diff = compare_metadata(ctx, make_metadata(schema))
    engine.dispose()
    diff = [
        d
        for d in diff
        if not (
            isinstance(d, tuple)
            and d[0] == "remove_table"
            and d[1].name == "outbox_alembic_version"
        )
    ]
    assert diff == []
