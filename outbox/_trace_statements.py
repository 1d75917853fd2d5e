"""The SQL of ``outbox trace`` (:mod:`outbox.trace`), rendered once per schema (the
convention of ``outbox/_sql.py``). Every statement only reads; the caller runs them in a
read-only transaction, so the console's role (or the relay's on the outbox database, a
consumer's on its inbox database) is enough.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox._sql import Names, load, qualified, registry
from outbox.schema import (
    INBOX_HELD,
    INBOX_MESSAGES,
    INBOX_POSITIONS,
    OUTBOX_IDENTITY,
    OUTBOX_MESSAGES,
    OUTBOX_RELAYS,
    OUTBOX_WAL_PENDING,
    RECONCILIATION_RUNS,
)

__all__ = ["TraceStatements", "trace_statements"]


@dataclass(frozen=True)
class TraceStatements:
    message_by_id: bytes
    ledger_by_id: bytes
    message_by_seq: bytes
    neighbours: bytes
    key_blocker: bytes
    relays: bytes
    origin: bytes
    last_run: bytes
    inbox_records: bytes
    inbox_records_by_seq: bytes
    inbox_consumers: bytes
    inbox_position: bytes
    inbox_held: bytes


_SQL = load("outbox", TraceStatements, resource="trace.sql")


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "pending": qualified(schema, OUTBOX_WAL_PENDING),
        "relays": qualified(schema, OUTBOX_RELAYS),
        "identity": qualified(schema, OUTBOX_IDENTITY),
        "runs": qualified(schema, RECONCILIATION_RUNS),
        "inbox": qualified(schema, INBOX_MESSAGES),
        "positions": qualified(schema, INBOX_POSITIONS),
        "held": qualified(schema, INBOX_HELD),
    }


#: The trace's statements for tables in ``schema`` (``None``: the search_path).
trace_statements = registry(
    TraceStatements,
    _SQL,
    _names,
)
