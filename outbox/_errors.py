"""Database errors, translated in one place: what went wrong, and what to run to fix it.

Two boundaries use this module. The library's own calls (``publish()``, the relay's start-up
check, the inbox's ``receive()``) turn the driver errors a user can act on into the library's
exceptions with :func:`translate` (a missing table becomes :class:`SchemaNotInstalledError`
through :func:`schema_not_installed`, the one place its message is written). The command-line
boundary (``outbox.cli``) turns every psycopg error that escapes a command into one line with
:func:`describe_database_error` and exit status 2, instead of a traceback.
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pg_errors

from outbox.exceptions import SchemaNotInstalledError

__all__ = [
    "EXTRA_OF_MODULE",
    "describe_database_error",
    "missing_extra",
    "one_line",
    "schema_not_installed",
    "translate",
]

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
    "starlette": "console",
    "jinja2": "console",
    "uvicorn": "console",
    "multipart": "console",
    "itsdangerous": "console",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra that would install the module ``exc`` did not find, if it is one of ours."""
    top = (exc.name or "").split(".")[0]
    return EXTRA_OF_MODULE.get(top)


def schema_not_installed(
    schema: str | None, problem: str = "do not exist", *, then: str = ""
) -> SchemaNotInstalledError:
    """The error for tables that are missing (or older than this code) in ``schema``."""
    where = f"schema {schema!r}" if schema else "the search_path"
    flag = f" --schema {schema}" if schema else ""
    return SchemaNotInstalledError(
        f"the outbox-inbox tables in {where} {problem}: run `outbox migrate upgrade{flag} --url "
        "...` against this database (or `alembic upgrade heads` with "
        "outbox_migrations:versions in your version_locations)" + (f", {then}" if then else ""),
        schema=schema,
    )


def translate(exc: psycopg.Error, *, schema: str | None) -> Exception:
    """The library's error for a driver error a user can act on; other errors unchanged
    (raise the result ``from exc``, so the driver's error stays the cause)."""
    if isinstance(exc, pg_errors.UndefinedTable):
        return schema_not_installed(schema, f"are missing ({_first_line(exc)})")
    return exc


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
