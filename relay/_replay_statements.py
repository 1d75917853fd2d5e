"""The SQL of ``outbox replay`` (:mod:`relay._replay`), rendered once per schema (the
convention of ``outbox/_sql.py``). Read the comments before changing anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox.kit import Names, load, qualified, registry
from outbox.schema import OUTBOX_DEAD_AUDIT, OUTBOX_MESSAGES, OUTBOX_REPLAY_CURSORS

__all__ = ["ReplayStatements", "replay_statements"]


@dataclass(frozen=True)
class ReplayStatements:
    lock: bytes
    cursor: bytes
    start: bytes
    resume: bytes
    reset: bytes
    count: bytes
    rows: bytes
    advance: bytes
    finish: bytes


_SQL = load("relay", ReplayStatements, resource="replay.sql")


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "cursors": qualified(schema, OUTBOX_REPLAY_CURSORS),
        "audit": qualified(schema, OUTBOX_DEAD_AUDIT),
    }


#: The replay's statements for tables in ``schema`` (``None``: the search_path).
replay_statements = registry(
    ReplayStatements,
    _SQL,
    _names,
)
