"""The reconciliation branch of the exception tree."""

from __future__ import annotations

from outbox.exceptions import OutboxError

__all__ = ["JdbcDriverNotFoundError", "ReconciliationError", "SourceError"]


class ReconciliationError(OutboxError):
    """The reconciliation job failed."""


class JdbcDriverNotFoundError(ReconciliationError):
    """No PostgreSQL JDBC driver jar was found; nothing is downloaded at run time."""


class SourceError(ReconciliationError):
    """A source database could not be read (URL, credentials or tables are wrong)."""
