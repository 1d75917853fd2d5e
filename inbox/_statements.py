"""The inbox's SQL, rendered once per schema from ``inbox/statements.sql``. Read that file's
comments before changing anything.

Every statement runs on the consumer's own connection, inside the transaction that applies the
message's effect, so the record and the effect commit or roll back together. Identifiers are
composed with ``psycopg.sql`` from validated names, never formatted into text.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from outbox.kit import Names, load, qualified, registry
from outbox.schema import (
    INBOX_DEAD_AUDIT,
    INBOX_HELD,
    INBOX_KAFKA_OFFSETS,
    INBOX_MESSAGES,
    INBOX_PARTITION_LEASES,
    INBOX_PARTITION_MEMBERS,
    INBOX_POSITIONS,
)

__all__ = ["InboxStatements", "inbox_statements"]


@dataclass(frozen=True)
class InboxStatements:
    record: bytes
    record_args: bytes
    note_duplicate: bytes
    position_lock: bytes
    position_advance: bytes
    mark_stale: bytes
    forget: bytes
    record_failure: bytes
    position_skip: bytes
    purge_batch: bytes
    purge_cutoff: bytes
    finished: bytes
    kafka_offset_store: bytes
    kafka_offsets_read: bytes
    blocked_keys: bytes
    key_gauges: bytes
    hold_key: bytes
    park: bytes
    unsettle: bytes
    unhold: bytes
    release_done: bytes
    repark: bytes
    audit: bytes
    retry_failed: bytes
    purge_apply: bytes
    held_decided: bytes
    parked_ready: bytes
    held_list: bytes
    dead_decide: bytes
    dead_audit_list: bytes
    consumer_activity: bytes
    record_batch: bytes
    note_duplicates: bytes
    positions_lock: bytes
    positions_advance: bytes
    mark_stale_batch: bytes
    forget_batch: bytes
    partition_join: bytes
    partition_slots: bytes
    partition_members: bytes
    partition_renew: bytes
    partition_acquire: bytes
    partition_release: bytes
    partition_leave: bytes
    partition_fence: bytes
    partition_status: bytes
    #: the schema the statements were rendered for (None: the search_path)
    schema: str | None


_SQL = load("inbox", InboxStatements)


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, INBOX_MESSAGES),
        "positions": qualified(schema, INBOX_POSITIONS),
        "messages_pkey": sql.Identifier(f"{INBOX_MESSAGES}_pkey"),
        "positions_pkey": sql.Identifier(f"{INBOX_POSITIONS}_pkey"),
        "kafka_offsets": qualified(schema, INBOX_KAFKA_OFFSETS),
        "kafka_offsets_pkey": sql.Identifier(f"{INBOX_KAFKA_OFFSETS}_pkey"),
        "held": qualified(schema, INBOX_HELD),
        "held_pkey": sql.Identifier(f"{INBOX_HELD}_pkey"),
        "audit": qualified(schema, INBOX_DEAD_AUDIT),
        "partition_members": qualified(schema, INBOX_PARTITION_MEMBERS),
        "partition_members_pkey": sql.Identifier(f"{INBOX_PARTITION_MEMBERS}_pkey"),
        "partition_leases": qualified(schema, INBOX_PARTITION_LEASES),
        "partition_leases_pkey": sql.Identifier(f"{INBOX_PARTITION_LEASES}_pkey"),
    }


#: The inbox statements for tables in ``schema`` (``None``: the search_path).
inbox_statements = registry(
    InboxStatements,
    _SQL,
    _names,
    values=lambda schema: {
        "schema": schema,
    },
)
