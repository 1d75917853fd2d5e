"""The console's own reads, rendered once per schema from ``outbox/console/statements.sql``
(everything it changes goes through the CLI's audited functions)."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from outbox._sql import Names, load, qualified, registry
from outbox.schema import INBOX_MESSAGES, OUTBOX_MESSAGES, RECONCILIATION_RUNS
from relay._statements import _DEAD_FILTER

__all__ = ["ConsoleStatements", "console_statements"]


@dataclass(frozen=True)
class ConsoleStatements:
    published_since: bytes
    consumers: bytes
    runs: bytes
    run_report: bytes
    dead_listing: bytes


_SQL = load("outbox.console", ConsoleStatements)


def _names(schema: str | None) -> Names:
    return {
        "messages": qualified(schema, OUTBOX_MESSAGES),
        "inbox": qualified(schema, INBOX_MESSAGES),
        "runs": qualified(schema, RECONCILIATION_RUNS),
        "filter": sql.SQL(_DEAD_FILTER),
    }


#: The console's statements for tables in ``schema`` (``None``: the search_path).
console_statements = registry(ConsoleStatements, _SQL, _names)
