"""Where ``outbox trace`` looks: the outbox database and the inbox databases, given on the
command line or read from a reconciliation job file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outbox._config import (
    JOB_SOURCE_KEYS,
    JOB_TOP_KEYS,
    check_keys,
    env_secret,
    file_secret,
    read_toml,
)
from outbox._redact import redact, remember_secrets
from outbox.exceptions import ConfigurationError
from outbox.schema import check_identifier

#: how long a connection attempt to one database may take
CONNECT_TIMEOUT = 10


@dataclass(frozen=True)
class TraceSource:
    """One inbox database to look in: a name (shown in the trace), a libpq URL (``jdbc:`` is
    accepted and dropped), and, as in the reconciliation's job file, the user and where the
    password is (never in the URL)."""

    name: str
    url: str
    user: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    schema: str | None = None

    def __post_init__(self) -> None:
        if self.schema is not None:
            check_identifier(self.schema)

    def __repr__(self) -> str:  # a URL may hold a password
        return f"TraceSource(name={self.name!r}, url={redact(self.url)!r})"

    def connect_kwargs(self) -> dict[str, Any]:
        """``psycopg.connect`` keyword arguments (the password is looked up now)."""
        url = self.url.removeprefix("jdbc:")
        remember_secrets(url)
        kw: dict[str, Any] = {"conninfo": url, "connect_timeout": CONNECT_TIMEOUT}
        if self.user:
            kw["user"] = self.user
        password = _password(self.name, self.password_env, self.password_file)
        if password is not None:
            kw["password"] = password
        return kw


@dataclass(frozen=True)
class TraceSources:
    """Where to look: the outbox database and the inbox databases."""

    outbox: TraceSource
    inboxes: tuple[TraceSource, ...] = ()


def _password(name: str, env: str | None, path: str | None) -> str | None:
    where = f"source {name!r}"
    if env:
        return env_secret(env, where)
    if path:
        return file_secret(path, where)
    return None


#: the keys of a job file's source tables the trace uses (the others are the job's)
_SOURCE_KEYS = {"name", "url", "user", "password_env", "password_file", "schema"}


def load_trace_sources(path: str | Path) -> tuple[TraceSource | None, tuple[TraceSource, ...]]:
    """The ``[outbox]`` and ``[[inbox]]`` tables of a reconciliation job file (the keys the
    trace needs). The file is checked as the job checks it: a key the job file does not know,
    at the top or in a source table, is refused with the closest known one; the job's own
    keys and tables are left to the job."""
    doc = read_toml(path, kind="job file")
    check_keys(doc, JOB_TOP_KEYS, f"job file {path}")

    def source(where: str, default_name: str, raw: Any) -> TraceSource:
        if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
            raise ConfigurationError(f'job file {path}: {where} needs url = "postgresql://..."')
        check_keys(raw, JOB_SOURCE_KEYS, f"job file {path}: {where}")
        known = {k: v for k, v in raw.items() if k in _SOURCE_KEYS}
        known.setdefault("name", default_name)
        return TraceSource(**known)

    outbox = source("[outbox]", "outbox", doc["outbox"]) if "outbox" in doc else None
    raw_inboxes = doc.get("inbox", [])
    if not isinstance(raw_inboxes, list):
        raise ConfigurationError(f"job file {path}: write [[inbox]] (a list), not [inbox]")
    inboxes = tuple(
        source(f"[[inbox]] #{i + 1}", f"inbox{i + 1}", raw) for i, raw in enumerate(raw_inboxes)
    )
    return outbox, inboxes
