"""Alembic environment of the standalone runner (`outbox migrate ...`).

Applications with their own Alembic environment do not use this file: they add
``outbox_migrations:versions`` to their ``version_locations`` and our revisions run in their env.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateSchema

from outbox._migrate import VERSION_TABLE, configured_schema
from outbox.schema import make_metadata

config = context.config
schema = configured_schema(config)
version_table = config.get_main_option("version_table") or VERSION_TABLE
target_metadata = make_metadata(schema)


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        literal_binds=True,
        version_table=version_table,
        version_table_schema=schema,
        target_metadata=target_metadata,
    )
    with context.begin_transaction():
        if schema:
            # The version table lives in our schema, so the schema must exist first.
            context.execute(CreateSchema(schema, if_not_exists=True))
        context.run_migrations()


def _run(connection: Connection) -> None:
    if schema:
        connection.execute(CreateSchema(schema, if_not_exists=True))
    context.configure(
        connection=connection,
        version_table=version_table,
        version_table_schema=schema,
        target_metadata=target_metadata,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=NullPool)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
