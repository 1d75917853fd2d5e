"""Alembic revisions of outbox-inbox (installed as the package ``outbox_migrations``).

Inside your own Alembic environment add ``outbox_migrations:versions`` to ``version_locations``
and run ``alembic upgrade heads``; standalone, run ``outbox migrate upgrade``.

A revision that creates or changes a PL/pgSQL or SQL function states it whole: the function's
complete text at that revision is ``functions/<function>.<revision>.sql`` (``CREATE OR REPLACE
FUNCTION ...``), loaded with :func:`function_sql`. The revision's upgrade runs its own file, its
downgrade the file of the revision before; no revision patches another's text.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["function_sql", "schema_names"]

_FUNCTIONS = Path(__file__).resolve().with_name("functions")


def function_sql(name: str, revision: str, **fmt: str) -> str:
    """The text of function ``name`` as revision ``revision`` creates it, its placeholders
    (``{fn}``, ``{messages}``, ... : ``str.format`` fields; ``{{`` is a literal brace) filled
    from ``fmt``."""
    path = _FUNCTIONS / f"{name}.{revision}.sql"
    if not path.is_file():
        raise FileNotFoundError(f"no text of function {name} at revision {revision}: {path}")
    return path.read_text(encoding="utf-8").format(**fmt)


def schema_names(schema: str | None) -> dict[str, str]:
    """The placeholders the function files use, for the configured ``schema`` (None: the
    search_path's, unqualified): ``fn`` (the functions' prefix) and the objects they name."""
    prefix = f'"{schema}".' if schema else ""
    return {
        "fn": prefix,
        "messages": f"{prefix}outbox_messages",
        "messages_seq": f"{prefix}outbox_key_sequences",
        "capture": f"{prefix}outbox_capture",
        "pending": f"{prefix}outbox_wal_pending",
        "counter": f"{prefix}outbox_write_counter",
    }
