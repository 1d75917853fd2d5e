"""Assertions shared by several test folders."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import CheckConstraint, create_engine
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
        checks = _check_counts(conn, schema)
    engine.dispose()
    declared = {
        table.name: sum(isinstance(c, CheckConstraint) for c in table.constraints)
        for table in make_metadata(schema).tables.values()
    }
    # autogenerate does not compare CHECK constraints: count them per table
    assert checks == {name: n for name, n in declared.items() if n}
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


def _check_counts(conn: Any, schema: str | None) -> dict[str, int]:
    rows = conn.exec_driver_sql(
        "SELECT c.conrelid::regclass::text, count(*) FROM pg_constraint c "
        "JOIN pg_namespace n ON n.oid = c.connamespace "
        "WHERE c.contype = 'c' AND n.nspname = %(schema)s GROUP BY 1",
        {"schema": schema or "public"},
    ).all()
    return {str(name).rsplit(".", 1)[-1].strip('"'): int(n) for name, n in rows}
