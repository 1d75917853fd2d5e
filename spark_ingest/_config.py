"""Configuration of the reconciliation job: sources, subscriptions, window, SLA, thresholds.

Library functions take these frozen objects; the CLI builds them from flags and a TOML file.
Passwords are read from an environment variable or a file when a connection is opened, and
never appear in ``repr``, logs or errors.
"""

from __future__ import annotations

import datetime as dt
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from outbox.exceptions import ConfigurationError
from outbox.schema import check_identifier

__all__ = [
    "CLASSES",
    "DISCREPANCY_CLASSES",
    "JobConfig",
    "Source",
    "Window",
    "load_toml",
    "parse_duration",
    "previous_day",
]

#: Classes of (message, expected consumer); ``delivered`` is the only clean one.
CLASSES = ("delivered", "in_flight", "lagging", "lost", "stuck", "dead", "stale")
#: Everything a run counts as a discrepancy (per-pair classes, then flags and phantoms).
DISCREPANCY_CLASSES = (
    "lost",
    "stuck",
    "dead",
    "stale",
    "phantom",
    "duplicate",
    "out_of_order",
)


@dataclass(frozen=True)
class Source:
    """One PostgreSQL database: a JDBC URL (or a libpq URL), a user, where the password is."""

    name: str
    url: str
    user: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    schema: str | None = None

    def __post_init__(self) -> None:
        if self.schema is not None:
            check_identifier(self.schema)
        self._parts()  # validate early

    def __repr__(self) -> str:  # never show where a password might be embedded
        return f"Source(name={self.name!r}, url={self.jdbc_url!r}, user={self.login!r})"

    def _parts(self) -> tuple[str, int, str, str | None]:
        raw = self.url.removeprefix("jdbc:")
        parts = urlsplit(raw)
        if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
            raise ConfigurationError(
                f"source {self.name!r}: invalid URL {_redact(self.url)!r}: expected "
                "jdbc:postgresql://host:5432/dbname (or postgresql://user@host:5432/dbname)",
                source=self.name,
            )
        if parts.password:
            raise ConfigurationError(
                f"source {self.name!r}: put the password in an environment variable or a file "
                "(password_env / password_file), not in the URL",
                source=self.name,
            )
        dbname = parts.path.lstrip("/") or "postgres"
        return parts.hostname, parts.port or 5432, dbname, parts.username

    @property
    def login(self) -> str | None:
        """The user: explicit, else from the URL (``user@`` or ``?user=``)."""
        if self.user:
            return self.user
        query = dict(parse_qsl(urlsplit(self.url.removeprefix("jdbc:")).query))
        return self._parts()[3] or query.get("user")

    @property
    def jdbc_url(self) -> str:
        host, port, dbname, _ = self._parts()
        return f"jdbc:postgresql://{host}:{port}/{dbname}"

    def password(self) -> str | None:
        """The password from ``password_env`` or ``password_file`` (None: trust/.pgpass)."""
        if self.password_env:
            value = os.environ.get(self.password_env)
            if value is None:
                raise ConfigurationError(
                    f"source {self.name!r}: environment variable {self.password_env} is not set",
                    source=self.name,
                )
            return value
        if self.password_file:
            try:
                return Path(self.password_file).read_text().strip()
            except OSError as exc:
                raise ConfigurationError(
                    f"source {self.name!r}: cannot read password file {self.password_file}: "
                    f"{exc.strerror}",
                    source=self.name,
                ) from exc
        return None

    def libpq_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``psycopg.connect`` (password included, never logged)."""
        host, port, dbname, _ = self._parts()
        kw: dict[str, Any] = {"host": host, "port": port, "dbname": dbname}
        if self.login:
            kw["user"] = self.login
        password = self.password()
        if password is not None:
            kw["password"] = password
        return kw

    def jdbc_properties(self) -> dict[str, str]:
        """Properties for Spark's JDBC source; ``driver`` is always set (see docs)."""
        props = {"driver": "org.postgresql.Driver", "fetchsize": "10000"}
        if self.login:
            props["user"] = self.login
        password = self.password()
        if password is not None:
            props["password"] = password
        return props


def _redact(url: str) -> str:
    parts = urlsplit(url.removeprefix("jdbc:"))
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@")
    return url


@dataclass(frozen=True)
class Window:
    """Half-open ``[start, end)`` of ``created_at`` (aware datetimes)."""

    start: dt.datetime
    end: dt.datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ConfigurationError("window bounds must carry a time zone (e.g. ...+00:00)")
        if not self.start < self.end:
            raise ConfigurationError(
                f"empty window: start {self.start.isoformat()} is not before "
                f"end {self.end.isoformat()}"
            )


def previous_day(now: dt.datetime | None = None) -> Window:
    """Yesterday in UTC: the default window of the nightly run."""
    now = now or dt.datetime.now(dt.UTC)
    end = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return Window(end - dt.timedelta(days=1), end)


@dataclass(frozen=True)
class JobConfig:
    """Everything one reconciliation run needs."""

    outbox: Source
    inboxes: tuple[Source, ...]
    subscriptions: dict[str, tuple[str, ...]]
    window: Window
    sla: dt.timedelta = dt.timedelta(hours=1)
    thresholds: dict[str, int] = field(default_factory=dict)
    partitions: int | None = None

    def __post_init__(self) -> None:
        if not self.subscriptions:
            raise ConfigurationError(
                "no subscriptions: give topic -> consumers with --subscribe topic=c1,c2 or a "
                "[subscriptions] table in the TOML file"
            )
        if not self.inboxes:
            raise ConfigurationError("no inbox source: pass --inbox jdbc:postgresql://...")
        unknown = set(self.thresholds) - set(DISCREPANCY_CLASSES) - {"lagging", "total"}
        if unknown:
            raise ConfigurationError(
                f"unknown threshold class(es) {sorted(unknown)}: use one of "
                f"{[*DISCREPANCY_CLASSES, 'lagging', 'total']}"
            )


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> dt.timedelta:
    """``90s``, ``15m``, ``2h``, ``1d`` or plain seconds."""
    text = text.strip()
    try:
        if text[-1:] in _UNITS:
            return dt.timedelta(seconds=float(text[:-1]) * _UNITS[text[-1]])
        return dt.timedelta(seconds=float(text))
    except ValueError as exc:
        raise ConfigurationError(
            f"invalid duration {text!r}: use e.g. 90s, 15m, 2h, 1d", value=text
        ) from exc


def _source(name: str, table: dict[str, Any]) -> Source:
    if "url" not in table:
        raise ConfigurationError(f"source {name!r} in the TOML file has no 'url'")
    return Source(
        name=str(table.get("name", name)),
        url=str(table["url"]),
        user=table.get("user"),
        password_env=table.get("password_env"),
        password_file=table.get("password_file"),
        schema=table.get("schema"),
    )


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a job file into keyword pieces: ``outbox``, ``inboxes``, ``subscriptions``,
    ``sla``, ``thresholds`` (each present only if the file sets it)."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"cannot read job file {path}: {exc}") from exc
    out: dict[str, Any] = {}
    if "outbox" in doc:
        out["outbox"] = _source("outbox", doc["outbox"])
    if "inbox" in doc:
        out["inboxes"] = tuple(_source(f"inbox{i + 1}", t) for i, t in enumerate(doc["inbox"]))
    if "subscriptions" in doc:
        out["subscriptions"] = {
            str(topic): tuple(str(c) for c in consumers)
            for topic, consumers in doc["subscriptions"].items()
        }
    if "sla" in doc:
        out["sla"] = parse_duration(str(doc["sla"]))
    if "thresholds" in doc:
        out["thresholds"] = {str(k): int(v) for k, v in doc["thresholds"].items()}
    return out
