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

from outbox._redact import redact
from outbox.exceptions import OutboxError, SchemaNotInstalledError

__all__ = [
    "EXTRA_OF_MODULE",
    "connect_failure",
    "describe_cli_error",
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
    """The start of the error's text, secrets masked (a driver may quote its conninfo)."""
    text = redact(exc).strip().splitlines()
    return " ".join(line.strip() for line in text[:2]) if text else type(exc).__name__


#: how libpq words the connection failures that retrying cannot heal, by kind (psycopg raises
#: them as a plain OperationalError, without a SQLSTATE, so the text is all there is)
_PERMANENT_CONNECT = {  # ('database "x" does not exist' is told apart in connect_failure)
    "login": (
        "password authentication failed",
        "no password supplied",
        'role "',  # ... does not exist
        "is not permitted to log in",
        "no pg_hba.conf entry",
        "certificate authentication failed",
        "sasl authentication failed",
    ),
    "url": (
        "invalid dsn",
        "invalid connection option",
        'missing "=" after',
        "invalid uri",
        "invalid port number",
        "invalid integer value",
        "unterminated quoted string",
        "invalid sslmode value",
        "invalid percent-encoded token",
        "unexpected spaces found",
        "invalid value for parameter",
    ),
}


def connect_failure(exc: BaseException) -> str | None:
    """What a failure to connect says can never heal by retrying, or None when it may (the
    server refused or did not answer, is starting up or shutting down, has no free slot):
    ``'database'`` (it does not exist), ``'login'`` (user, password, pg_hba.conf) or ``'url'``
    (a malformed URL or conninfo string)."""
    if isinstance(exc, pg_errors.InvalidCatalogName):
        return "database"
    if isinstance(exc, pg_errors.InvalidAuthorizationSpecification | pg_errors.InvalidPassword):
        return "login"
    if getattr(exc, "sqlstate", None) is not None:
        return None  # the server answered a statement: not a failure to connect
    if isinstance(exc, psycopg.ProgrammingError):  # the conninfo parser, client-side
        return "url"
    text = str(exc).lower()
    if "does not exist" in text and 'database "' in text and 'role "' not in text:
        return "database"
    for kind in ("login", "url"):
        if any(w in text for w in _PERMANENT_CONNECT[kind]):
            return kind
    return None


def _hint(kind: str) -> str:
    """What to check for a connection failure of ``kind``, naming where the URL came from."""
    from outbox._dburl import ACCEPTED, url_source

    where = url_source()
    return {
        "database": f"check the database name in {where}",
        "login": f"check the user and password in {where} (a password may also come from "
        "PGPASSWORD or ~/.pgpass) and the server's pg_hba.conf",
        "url": f"check {where}: {ACCEPTED}",
    }[kind]


#: admin_shutdown, crash_shutdown, cannot_connect_now: the server answered, then ended the session
_SESSION_ENDED = ("57P01", "57P02", "57P03")


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
    kind = connect_failure(exc)
    if kind is not None:
        return f"{reason}: {_hint(kind)}"
    if isinstance(exc, pg_errors.UndefinedObject) and reason.startswith("role "):
        return (
            f"{reason}: create the role first (CREATE ROLE ... LOGIN) or check its name; "
            "`outbox migrate grants` grants to existing roles only"
        )
    if "does not exist" in reason:
        return f"{reason}: {_hint('database')}"
    if getattr(exc, "sqlstate", None) in _SESSION_ENDED:
        return (
            f"the server ended this session ({reason}): another session terminated it (an "
            "administrator, a tool) or the server is shutting down; the statement it ran did "
            "not complete: run the command again"
        )
    if isinstance(exc, psycopg.OperationalError):
        from outbox._dburl import url_source

        return (
            f"cannot reach the database ({reason}): check {url_source()}, "
            "that the server is running and that it accepts connections from here"
        )
    return f"database error ({type(exc).__name__}): {reason}"


def describe_cli_error(exc: BaseException) -> str | None:
    """The one line a command prints for ``exc``, secrets masked; None for an error that is
    none of the library's nor the database's (a bug: the caller shows its traceback, masked).
    SQLAlchemy's wrapper of a driver error (``migrate``) is described as the driver's error."""
    if isinstance(exc, OutboxError):
        return redact(exc)
    driver_error = getattr(exc, "orig", None)  # sqlalchemy.exc.DBAPIError
    if isinstance(driver_error, psycopg.Error):
        exc = driver_error
    if isinstance(exc, psycopg.Error):
        return describe_database_error(exc)
    return None


_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def one_line(value: object) -> str:
    """``value`` as text that stays on one line of a listing and cannot drive the terminal:
    backslash, newline, CR and tab escaped as ``\\``, ``\\n``, ``\\r``, ``\\t``, and every other
    non-printable character (ESC and the other C0 and C1 controls, DEL, line and paragraph
    separators, bidirectional overrides) as ``\\xNN`` or ``\\uNNNN``. `grep` and `awk` see one
    item per line. Every CLI listing writes its fields through this function."""
    text = str(value).translate(_ESCAPES)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else (f"\\U{code:08x}")
    )
