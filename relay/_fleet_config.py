"""The configuration of a relay serving many databases: ``[[databases]]`` in its TOML file.

The file's settings are every database's defaults; each ``[[databases]]`` table names one
database (``name``, ``url``) and may override some of them for it (``schema``, ``origin``,
``max_in_flight``, ...). ``[fleet]`` holds what is process-wide (the cap on database work, how
long a paused database waits). The list lives in the file, not in a catalog table: the URLs
are secrets the relay's host already holds (a control database would be one more place to
grant and one more to be down), and a reload (SIGHUP) applies an edited list without a
restart.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from outbox.exceptions import ConfigurationError
from outbox.kit import check_keys, check_value, describe_database_error, read_toml
from relay._config import RelayConfig

__all__ = [
    "OVERRIDABLE", "DatabaseEntry", "FleetConfig", "FleetSettings", "database_config",
    "database_error_line", "load_fleet",
]  # fmt: skip

#: the settings a ``[[databases]]`` table may give for its database alone
OVERRIDABLE = (
    "schema", "origin", "batch_size", "per_key_batch", "max_in_flight", "lease_seconds",
    "publish_timeout", "poll_interval", "listen", "watch", "watch_interval",
    "watch_idle_interval", "heartbeat_interval", "retention_seconds", "retention_interval",
    "retention_batch",
)  # fmt: skip

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
#: the placeholder URL of the file's own settings (each database gets its own)
_NO_URL = "postgresql:///outbox-fleet-defaults"


@dataclass(frozen=True)
class DatabaseEntry:
    """One ``[[databases]]`` table."""

    #: the database's name in log lines, the `database` label of every metric and `outbox
    #: status`: letters, digits, `_`, `.`, `-`, at most 63 (never its URL)
    name: str
    #: its PostgreSQL URL (masked in every output)
    url: str
    #: settings for this database only, over the file's (the keys of ``OVERRIDABLE``)
    overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetSettings:
    """The ``[fleet]`` table: what one relay process serving many databases shares."""

    #: most claims and batches in flight at once in this process, over all its databases
    #: (each database's own max_in_flight applies within it): the cap on database work
    max_concurrent: int = 8
    #: longest wait before a paused database (unreachable, login refused, not migrated, an
    #: origin another database has) is tried again: 1 s, doubling up to this
    retry_max: float = 60.0
    #: seconds a database's connection attempt may take before it counts as unreachable
    connect_timeout: float = 10.0
    #: most pooled connections per database (none: max_in_flight + 3, as a relay of its own);
    #: 1 serves a database in 'polling' mode on one connection (its claims, marks and
    #: heartbeats take turns); 'wal' mode needs 3. LISTEN and the commit watch add one each
    database_connections: int | None = None

    def __post_init__(self) -> None:
        check_value(
            "max_concurrent",
            self.max_concurrent,
            isinstance(self.max_concurrent, int)
            and not isinstance(self.max_concurrent, bool)
            and self.max_concurrent >= 1,
            "an integer >= 1",
        )
        pool = self.database_connections
        check_value(
            "database_connections",
            pool,
            pool is None or (isinstance(pool, int) and not isinstance(pool, bool) and pool >= 1),
            "an integer >= 1",
        )
        for name in ("retry_max", "connect_timeout"):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            check_value(name, value, ok and value < float("inf"), "a number of seconds > 0")


@dataclass(frozen=True)
class FleetConfig:
    """The relay's settings (every database's defaults), its databases and ``[fleet]``."""

    base: RelayConfig
    databases: tuple[DatabaseEntry, ...]
    settings: FleetSettings
    #: each database's own RelayConfig, by name
    configs: Mapping[str, RelayConfig]


def load_fleet(
    file: str | Path | None, *, env: Mapping[str, str] | None = None, **flags: Any
) -> FleetConfig | None:
    """The file's ``[[databases]]`` and ``[fleet]``; None when it lists no databases (a relay
    of one database, configured as before)."""
    if file is None:
        return None
    path = Path(file)
    data = read_toml(path, kind="config file")
    if "databases" not in data:
        if "fleet" in data:
            raise ConfigurationError(
                f"config file {path}: [fleet] is set but no [[databases]] table is"
            )
        return None
    where = f"config file {path}"
    section = data.get("relay", data)
    if flags.get("database_url") or (isinstance(section, dict) and "database_url" in section):
        raise ConfigurationError(
            f"{where} lists [[databases]]: database_url (or --url) is not used with it; "
            "give each database a [[databases]] table"
        )
    entries = _entries(data["databases"], where)
    settings = _settings(data.get("fleet", {}), where)
    base = RelayConfig.load(path, env=env, **{**flags, "database_url": _NO_URL})
    configs = {e.name: database_config(base, e, where) for e in entries}
    return FleetConfig(base, entries, settings, configs)


def database_config(base: RelayConfig, entry: DatabaseEntry, where: str) -> RelayConfig:
    """``base`` for ``entry``'s database: its URL and overrides."""
    try:
        return dataclasses.replace(base, database_url=entry.url, **entry.overrides)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: [[databases]] {entry.name!r}: {exc.message}") from None


def _entries(raw: Any, where: str) -> tuple[DatabaseEntry, ...]:
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigurationError(
            f"{where}: databases must be [[databases]] tables (name = ..., url = ...)"
        )
    out: list[DatabaseEntry] = []
    seen: set[str] = set()
    for n, table in enumerate(raw, 1):
        label = f"{where}: [[databases]] #{n}"
        check_keys(table, ["name", "url", *OVERRIDABLE], label, what="setting")
        name, url = table.get("name"), table.get("url")
        check_value(
            "name", name, isinstance(name, str) and bool(_NAME.fullmatch(name)),
            "letters, digits, '_', '.', '-' (at most 63; it labels metrics)", where=label,
        )  # fmt: skip
        if name in seen:
            raise ConfigurationError(f"{label}: the name {name!r} is given twice")
        seen.add(name)
        if not isinstance(url, str) or not url:
            raise ConfigurationError(f"{label} ({name}): url must be a PostgreSQL URL")
        overrides = {k: v for k, v in table.items() if k not in ("name", "url")}
        out.append(DatabaseEntry(name, url, overrides))
    return tuple(out)


def _settings(raw: Any, where: str) -> FleetSettings:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{where}: fleet must be a [fleet] table")
    names = [f.name for f in dataclasses.fields(FleetSettings)]
    check_keys(raw, names, f"{where}: [fleet]", what="setting")
    try:
        return FleetSettings(**raw)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: [fleet]: {exc.message}") from None


def database_error_line(exc: psycopg.Error) -> str:
    """The one-line hint for a listed database that fails, naming where its URL comes from
    (its ``[[databases]]`` table), not ``--url``."""
    return describe_database_error(exc).replace("--url", "its [[databases]] url")
