"""Database errors as operators should read them: one line, what went wrong, what to do.

The command-line boundary (``outbox.cli``) turns every psycopg error that escapes a command
into one of these lines and exit status 2, instead of a traceback.
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pg_errors

__all__ = ["EXTRA_OF_MODULE", "describe_database_error", "missing_extra", "one_line"]

#: the pip extra that installs each optional module the commands may need
EXTRA_OF_MODULE = {
    "pyspark": "spark",
    "nats": "nats",
    "aio_pika": "rabbitmq",
    "confluent_kafka": "kafka",
    "redis": "redis",
    "paho": "mqtt",
    "prometheus_client": "metrics",
    "opentelemetry": "otel",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra that would install the module ``exc`` did not find, if it is one of ours."""
    top = (exc.name or "").split(".")[0]
    return EXTRA_OF_MODULE.get(top)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(line.strip() for line in text[:2]) if text else type(exc).__name__


def describe_database_error(exc: psycopg.Error) -> str:
    """One line for an operator: what the database said and what to check or run."""
    reason = _first_line(exc)
    if isinstance(exc, pg_errors.UndefinedTable):
        return (
            f"{reason}: the outbox/inbox tables are not installed here: run `outbox migrate "
            "upgrade --url ...` (add --schema if you use one)"
        )
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return (
            f"{reason}: this database user lacks a grant; `outbox migrate grants` prints what "
            "each role needs"
        )
    if isinstance(exc, pg_errors.InvalidCatalogName) or "does not exist" in reason:
        return f"{reason}: check the database name in --url (or $OUTBOX_DATABASE_URL)"
    if isinstance(exc, psycopg.OperationalError):
        return (
            f"cannot reach the database ({reason}): check --url (or $OUTBOX_DATABASE_URL), "
            "that the server is running and that it accepts connections from here"
        )
    return f"database error ({type(exc).__name__}): {reason}"


_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def one_line(value: object) -> str:
    """``value`` as text that stays on one line of a listing (backslash, newline, CR and tab
    escaped), so `grep` and `awk` see one item per line."""
    return str(value).translate(_ESCAPES)
