"""Every SQL statement of the relay, rendered once per schema from ``relay/statements.sql``.
Read that file's comments first: the ordering argument is at its top.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from outbox.kit import WAKEUP_CHANNEL, Names, load, qualified, registry, table_name, templates
from outbox.schema import (
    OUTBOX_CAPTURE,
    OUTBOX_CAPTURE_LEASE,
    OUTBOX_DEAD_AUDIT,
    OUTBOX_IDENTITY,
    OUTBOX_MESSAGES,
    OUTBOX_RELAYS,
    OUTBOX_SEQUENCES,
    OUTBOX_WAL_PENDING,
    OUTBOX_WRITE_COUNTER,
    RECONCILIATION_RUNS,
)

__all__ = ["TEMPLATES", "RelayStatements", "RelayTemplates", "relay_statements"]


@dataclass(frozen=True)
class RelayStatements:
    tables_present: bytes
    origin: bytes
    claim: bytes
    mark: bytes
    mark_published: bytes
    release_owner: bytes
    register: bytes
    relay_holder: bytes
    heartbeat: bytes
    unregister: bytes
    retention: bytes
    status_topics: bytes
    status_relays: bytes
    last_reconciliation: bytes
    dead_list: bytes
    dead_retry: bytes
    dead_purge: bytes
    dead_requeue_ids: bytes
    dead_purge_ids: bytes
    dead_listing: bytes
    published_since: bytes
    audit_list: bytes
    capture_mode: bytes
    capture_lock: bytes
    ledger_lock: bytes
    ledger_bound: bytes
    capture_known: bytes
    capture_bump: bytes
    capture_waiting_keys: bytes
    capture_record: bytes
    capture_published: bytes
    capture_pending_delete: bytes
    capture_recorded: bytes
    capture_pending_sweep: bytes
    capture_pending_rows: bytes
    capture_pending_count: bytes
    capture_durable: bytes
    capture_unsent: bytes
    capture_slot: bytes
    capture_lease_take: bytes
    capture_lease_stream: bytes
    capture_lease_beat: bytes
    capture_lease_check: bytes
    capture_lease_fence: bytes
    capture_slot_free: bytes
    capture_lease_resign: bytes
    watch_reading: bytes
    durable_commit: bytes
    session: bytes
    listen: bytes
    ping: bytes
    wal_level: bytes
    current_database: bytes
    publication_exists: bytes
    slot_create: bytes
    slot_drop: bytes
    publication_has_table: bytes
    capture_enable: bytes
    capture_disable: bytes
    capture_table: bytes
    capture_tables: bytes
    wake_relays: bytes


@dataclass(frozen=True)
class RelayTemplates:
    """Statements the caller completes per call (``.format(...)``)."""

    capture_other: sql.SQL
    publication_create: sql.SQL
    publication_add: sql.SQL
    start_replication: sql.SQL


_SQL = load("relay", RelayStatements, RelayTemplates)


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "relays": qualified(schema, OUTBOX_RELAYS),
        "runs": qualified(schema, RECONCILIATION_RUNS),
        "audit": qualified(schema, OUTBOX_DEAD_AUDIT),
        "sequences": qualified(schema, OUTBOX_SEQUENCES),
        "identity": qualified(schema, OUTBOX_IDENTITY),
        "capture": qualified(schema, OUTBOX_CAPTURE),
        "capture_lease": qualified(schema, OUTBOX_CAPTURE_LEASE),
        "pending": qualified(schema, OUTBOX_WAL_PENDING),
        "pending_name": table_name(schema, OUTBOX_WAL_PENDING),
        "counter": qualified(schema, OUTBOX_WRITE_COUNTER),
        "counter_name": table_name(schema, OUTBOX_WRITE_COUNTER),
        "messages_name": table_name(schema, OUTBOX_MESSAGES),
        "relays_name": table_name(schema, OUTBOX_RELAYS),
        "audit_name": table_name(schema, OUTBOX_DEAD_AUDIT),
        "capture_name": table_name(schema, OUTBOX_CAPTURE),
        "requeue_fn": qualified(schema, "outbox_dead_requeue"),
        "purge_fn": qualified(schema, "outbox_dead_purge"),
        "channel": sql.Identifier(WAKEUP_CHANNEL),
        "channel_name": sql.Literal(WAKEUP_CHANNEL),
    }


#: The relay's statements for tables in ``schema`` (``None``: the search_path).
relay_statements = registry(RelayStatements, _SQL, _names)

#: The relay's templates, completed per call.
TEMPLATES = templates(RelayTemplates, _SQL)
