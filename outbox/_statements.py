"""The producer's SQL (and the re-drive's, the doorbell's, the GRANTs'), rendered once per
schema from ``outbox/statements.sql``. Read that file's comments before changing anything.

Statements use psycopg's ``%(name)s`` placeholders and run on the caller's own connection,
inside the caller's transaction. Identifiers are composed with ``psycopg.sql`` from validated
names, never formatted into the text: the convention of ``outbox/_sql.py``, which every
package's registry follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from outbox._sql import Names, load, qualified, registry, table_name, templates
from outbox.schema import (
    OUTBOX_CAPTURE,
    OUTBOX_DEAD_AUDIT,
    OUTBOX_MESSAGES,
    OUTBOX_SEQUENCES,
    OUTBOX_WAL_PENDING,
    OUTBOX_WRITE_COUNTER,
)

__all__ = [
    "TEMPLATES",
    "WAKEUP_CHANNEL",
    "DoorbellStatements",
    "MigrateStatements",
    "OutboxTemplates",
    "ProducerStatements",
    "RedriveStatements",
    "doorbell_statements",
    "migrate_statements",
    "producer_statements",
    "redrive_statements",
]

#: NOTIFY channel that wakes relays. Versioned so old and new relays coexist in a rolling deploy.
WAKEUP_CHANNEL = "outbox_wakeup_v1"


@dataclass(frozen=True)
class ProducerStatements:
    ledger_insert_one: bytes
    ledger_insert_one_idempotent: bytes
    ledger_insert: bytes
    current_xact: bytes


@dataclass(frozen=True)
class RedriveStatements:
    preview: bytes
    redrive: bytes


@dataclass(frozen=True)
class DoorbellStatements:
    doorbell_session: bytes
    doorbell_settle: bytes


@dataclass(frozen=True)
class MigrateStatements:
    version_rows: bytes
    drop_version_table: bytes
    version_schemas: bytes


@dataclass(frozen=True)
class OutboxTemplates:
    """Statements the caller completes per call (``.format(...)``)."""

    begin: sql.SQL
    grant_schema: sql.SQL
    grant_table: sql.SQL
    grant_columns: sql.SQL
    grant_sequence: sql.SQL
    grant_function: sql.SQL
    grant_role: sql.SQL


_SQL = load(
    "outbox",
    ProducerStatements,
    RedriveStatements,
    DoorbellStatements,
    MigrateStatements,
    OutboxTemplates,
)


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "sequences": qualified(schema, OUTBOX_SEQUENCES),
        "capture": qualified(schema, OUTBOX_CAPTURE),
        "pending": qualified(schema, OUTBOX_WAL_PENDING),
        "counter": table_name(schema, OUTBOX_WRITE_COUNTER),
    }


#: The producer statements for tables in ``schema`` (``None``: the search_path).
producer_statements = registry(ProducerStatements, _SQL, _names)

#: The re-drive statements for tables in ``schema`` (``None``: the search_path).
redrive_statements = registry(
    RedriveStatements,
    _SQL,
    lambda schema: {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "audit": qualified(schema, OUTBOX_DEAD_AUDIT),
        "counter": table_name(schema, OUTBOX_WRITE_COUNTER),
    },
)

#: The doorbell's statements (no table: the schema does not matter; pass None).
doorbell_statements = registry(DoorbellStatements, _SQL, lambda schema: {})

#: The standalone migration runner's statements on its version table in ``schema``.
migrate_statements = registry(
    MigrateStatements,
    _SQL,
    lambda schema: {"version": qualified(schema, "outbox_alembic_version")},
)

#: The templates, completed per call.
TEMPLATES = templates(OutboxTemplates, _SQL)
