"""Configuration of the reconciliation job: sources, subscriptions, window, SLA, thresholds.

Library functions take these frozen objects; the CLI builds them from flags and a TOML file.
Passwords are read from an environment variable or a file when a connection is opened, and
never appear in ``repr``, logs or errors.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from outbox.exceptions import ConfigurationError
from outbox.kit import (
    ACCEPTED,
    JOB_SOURCE_KEYS,
    JOB_TOP_KEYS,
    check_keys,
    check_value,
    env_secret,
    file_secret,
    libpq_url,
    read_toml,
    redact,
    secrets_in,
)
from outbox.schema import check_identifier

__all__ = [
    "CLASSES",
    "CONNECTION_PARAMETERS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_ROWS_PER_PARTITION",
    "DISCREPANCY_CLASSES",
    "THRESHOLD_NAMES",
    "JobConfig",
    "Source",
    "Window",
    "check_inboxes",
    "check_thresholds",
    "database_of",
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


#: Partition queries the job runs at once against one database, at most (``max_connections``).
DEFAULT_MAX_CONNECTIONS = 4

#: Rows per JDBC partition when the job sizes its reads from the data. Each read task pays a
#: query start and a Spark task: a partition must take long enough to fetch that this fixed
#: cost stays small beside it, short enough that a failed task redoes little, and hold few
#: enough rows to fit a small (512 MiB) executor.
DEFAULT_ROWS_PER_PARTITION = 200_000


#: Connection parameters a source URL may carry (``?sslmode=verify-full&sslrootcert=...``):
#: libpq's name (psycopg, on the driver) -> the PostgreSQL JDBC driver's property (the Spark
#: reads), for pgjdbc 42.7. The files are read by both drivers: a client key in PKCS#8 (PEM
#: ``BEGIN PRIVATE KEY``, or DER ``.pk8``) suits both. The key's passphrase (sslpassword) is a
#: secret: it comes from ``sslpassword_env``, never the URL. Anything else in the query is
#: refused rather than dropped: a TLS setting one driver ignored would connect without it.
CONNECTION_PARAMETERS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "channel_binding": "channelBinding",
    "sslnegotiation": "sslNegotiation",
    "gssencmode": "gssEncMode",
    "connect_timeout": "connectTimeout",
    "application_name": "ApplicationName",
}


def _check_count(where: str, key: str, value: object, *, example: int) -> None:
    """A whole number >= 1 (not a bool, not a float, not a string)."""
    check_value(
        key,
        value,
        not isinstance(value, bool) and isinstance(value, int) and value >= 1,
        f"a whole number >= 1 (e.g. {key} = {example})",
        where=where,
    )


@dataclass(frozen=True)
class Source:
    """One PostgreSQL database: a JDBC URL (or a libpq URL), a user, where the password is.

    ``max_connections`` bounds the partition queries the reconciliation runs at once against
    this source's database (see ``_job.read_sources``).
    """

    name: str
    url: str
    user: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    schema: str | None = None
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: the environment variable holding the passphrase of an encrypted client key (sslkey)
    sslpassword_env: str | None = None

    def __post_init__(self) -> None:
        # the one URL rule (outbox/_dburl.py); the JDBC URL is derived from it (jdbc_url)
        object.__setattr__(self, "url", _url_form(self.url, f"source {self.name!r}"))
        if self.schema is not None:
            check_identifier(self.schema)
        _check_count(
            f"source {self.name!r}",
            "max_connections",
            self.max_connections,
            example=DEFAULT_MAX_CONNECTIONS,
        )
        self._parts()  # validate early
        self.parameters()

    def __repr__(self) -> str:  # never show where a password might be embedded
        return f"Source(name={self.name!r}, url={self.jdbc_url!r}, user={self.login!r})"

    def _parts(self) -> tuple[str, int, str, str | None]:
        raw = self.url.removeprefix("jdbc:")
        expected = "jdbc:postgresql://host:5432/dbname (or postgresql://user@host:5432/dbname)"
        try:
            parts = urlsplit(raw)
            port = parts.port  # raises ValueError for a port out of range or not a number
            if port == 0:
                raise ValueError("port 0")
        except ValueError as exc:  # urlsplit: bad IPv6 brackets; .port: "99999", "abc"
            # urllib's words may quote a piece of a password that holds a raw '/', '?' or '#'
            why = (
                "a password must be percent-encoded (a raw '/', '?', '#' or '@' ends it)"
                if secrets_in(raw)
                else str(exc)
            )
            raise ConfigurationError(
                f"source {self.name!r}: invalid URL {redact(self.url)!r}: {why}; expected "
                f"{expected} with a port from 1 to 65535",
                source=self.name,
            ) from exc
        if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
            raise ConfigurationError(
                f"source {self.name!r}: invalid URL {redact(self.url)!r}: expected {expected}",
                source=self.name,
            )
        if parts.password:
            raise ConfigurationError(
                f"source {self.name!r}: put the password in an environment variable or a file "
                "(password_env / password_file), not in the URL",
                source=self.name,
            )
        dbname = parts.path.lstrip("/") or "postgres"
        return parts.hostname, port or 5432, dbname, parts.username

    @property
    def login(self) -> str | None:
        """The user: explicit, else from the URL (``user@`` or ``?user=``)."""
        if self.user:
            return self.user
        query = dict(parse_qsl(urlsplit(self.url.removeprefix("jdbc:")).query))
        return self._parts()[3] or query.get("user")

    def parameters(self) -> dict[str, str]:
        """The URL's connection parameters (TLS, ...) by their libpq names; ``user`` apart."""
        query = urlsplit(self.url.removeprefix("jdbc:")).query
        found: dict[str, str] = {}
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name == "user":
                continue
            if name in ("password", "sslpassword"):
                where = (
                    "an environment variable or a file (password_env / password_file)"
                    if name == "password"
                    else "an environment variable (sslpassword_env)"
                )
                raise ConfigurationError(
                    f"source {self.name!r}: put the {name} in {where}, not in the URL",
                    source=self.name,
                )
            if name not in CONNECTION_PARAMETERS:
                raise ConfigurationError(
                    f"source {self.name!r}: the URL parameter {name!r} is not one the job passes "
                    f"to both drivers (psycopg and JDBC): use {', '.join(CONNECTION_PARAMETERS)}",
                    source=self.name,
                    parameter=name,
                )
            if not value:
                raise ConfigurationError(
                    f"source {self.name!r}: the URL parameter {name!r} is empty: give it a value "
                    "or leave it out",
                    source=self.name,
                    parameter=name,
                )
            found[name] = value
        return found

    def sslpassword(self) -> str | None:
        """The client key's passphrase from ``sslpassword_env`` (None: no passphrase)."""
        if not self.sslpassword_env:
            return None
        return env_secret(self.sslpassword_env, f"source {self.name!r}", source=self.name)

    @property
    def jdbc_url(self) -> str:
        """``jdbc:postgresql://host:port/dbname``, whichever form the source's URL had."""
        host, port, dbname, _ = self._parts()
        return f"jdbc:postgresql://{host}:{port}/{dbname}"

    def password(self) -> str | None:
        """The password from ``password_env`` or ``password_file`` (None: trust/.pgpass)."""
        # each read is remembered by the redactor: masked if a driver's error quotes it
        if self.password_env:
            return env_secret(self.password_env, f"source {self.name!r}", source=self.name)
        if self.password_file:
            return file_secret(self.password_file, f"source {self.name!r}", source=self.name)
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
        kw.update(self.parameters())
        sslpassword = self.sslpassword()
        if sslpassword is not None:
            kw["sslpassword"] = sslpassword
        return kw

    def jdbc_properties(self) -> dict[str, str]:
        """Properties for Spark's JDBC source; ``driver`` is always set (see docs)."""
        props = {"driver": "org.postgresql.Driver", "fetchsize": "10000"}
        if self.login:
            props["user"] = self.login
        password = self.password()
        if password is not None:
            props["password"] = password
        props.update({CONNECTION_PARAMETERS[k]: v for k, v in self.parameters().items()})
        sslpassword = self.sslpassword()
        if sslpassword is not None:
            props["sslpassword"] = sslpassword
        return props


def database_of(source: Source) -> tuple[str, int, str]:
    """Where ``source``'s connections go: host, port and database (any schema)."""
    host, port, dbname, _ = source._parts()
    return host.lower(), port, dbname


def _database_key(source: Source) -> tuple[str, int, str, str]:
    """What makes two sources the same inbox table: host, port, database and schema."""
    host, port, dbname, _ = source._parts()
    return host.lower(), port, dbname, source.schema or "public"


def check_inboxes(inboxes: Sequence[Source]) -> None:
    """Reject two inbox sources with one name, or two reading the same inbox table.

    The reconciliation joins inbox rows on (message id, consumer) whatever source they came
    from, so one inbox read twice would count each delivery twice (a false duplicate and a
    wrong delivered count); two sources named alike would share one name in every output.
    """
    names: dict[str, Source] = {}
    places: dict[tuple[str, int, str, str], Source] = {}
    for src in inboxes:
        if src.name in names:
            raise ConfigurationError(
                f"two inbox sources are named {src.name!r}: give each [[inbox]] its own name",
                source=src.name,
            )
        names[src.name] = src
        key = _database_key(src)
        if key in places:
            host, port, dbname, schema = key
            raise ConfigurationError(
                f"inbox sources {places[key].name!r} and {src.name!r} both read "
                f"{host}:{port}/{dbname} (schema {schema}): every delivery would be counted "
                "twice; list each inbox database once",
                source=src.name,
            )
        places[key] = src


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
    #: JDBC partitions per read, instead of sizing them from the data (still bounded by the
    #: sources' ``max_connections``).
    partitions: int | None = None
    #: Rows per JDBC partition when the reads are sized from the data.
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION

    def __post_init__(self) -> None:
        if not self.subscriptions:
            raise ConfigurationError(
                "no subscriptions: give topic -> consumers with --subscribe topic=c1,c2 or a "
                "[subscriptions] table in the TOML file"
            )
        if not self.inboxes:
            raise ConfigurationError("no inbox source: pass --inbox jdbc:postgresql://...")
        check_inboxes(self.inboxes)
        for topic, consumers in self.subscriptions.items():
            _check_consumers(f"subscription {topic!r}", consumers)
        check_thresholds(self.thresholds, "thresholds")
        if self.sla <= dt.timedelta(0):
            raise ConfigurationError(f"the SLA must be positive, not {self.sla}: e.g. 1h")
        if self.partitions is not None:
            _check_count("job", "partitions", self.partitions, example=4)
        _check_count(
            "job", "rows_per_partition", self.rows_per_partition, example=DEFAULT_ROWS_PER_PARTITION
        )
        check_connections((self.outbox, *self.inboxes))


def check_connections(sources: Sequence[Source]) -> None:
    """Every database can serve its reads within its ``max_connections``.

    Each read (the outbox, each inbox) needs one connection at least while it runs, and the
    reads of one run may run at once; sources in one database (host, port, database) share the
    smallest ``max_connections`` among them.
    """
    groups: dict[tuple[str, int, str], list[Source]] = {}
    for src in sources:
        groups.setdefault(database_of(src), []).append(src)
    for (host, port, dbname), members in groups.items():
        cap = min(s.max_connections for s in members)
        if len(members) > cap:
            names = ", ".join(repr(s.name) for s in members)
            raise ConfigurationError(
                f"sources {names} read {host}:{port}/{dbname} at once: {len(members)} reads "
                f"need max_connections >= {len(members)} there, not {cap}",
                key="max_connections",
            )


#: Thresholds may bound each discrepancy class, ``lagging`` and their ``total``.
THRESHOLD_NAMES = (*DISCREPANCY_CLASSES, "lagging", "total")


def check_thresholds(thresholds: Mapping[str, object], where: str) -> None:
    """Every name a known class, every limit an int >= 0 (not a bool, not a float)."""
    check_keys(thresholds, THRESHOLD_NAMES, where, what="threshold class")
    for name, limit in thresholds.items():
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(
                f"{where}: {name} = {limit!r}: a threshold must be a whole number >= 0 "
                f"(e.g. {name} = 10)",
                key=name,
            )


def _check_consumers(where: str, consumers: object) -> None:
    if isinstance(consumers, str) or not isinstance(consumers, Sequence):
        raise ConfigurationError(
            f'{where}: expected a list of consumer names (e.g. orders = ["billing"]), '
            f"got {consumers!r}"
        )
    if not consumers or not all(isinstance(c, str) and c.strip() for c in consumers):
        raise ConfigurationError(
            f"{where}: expected a non-empty list of consumer names, got {list(consumers)!r}"
        )


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, *, what: str | None = None) -> dt.timedelta:
    """``90s``, ``15m``, ``2h``, ``1d`` or plain seconds; positive and finite.

    ``what`` (e.g. ``--sla``) leads the error message."""
    text = text.strip()
    head = f"{what}: invalid duration {text!r}" if what else f"invalid duration {text!r}"
    hint = "use a positive duration, e.g. 90s, 15m, 2h, 1d"
    try:
        number, unit = (text[:-1], _UNITS[text[-1]]) if text[-1:] in _UNITS else (text, 1)
        seconds = float(number) * unit
        if not math.isfinite(seconds):
            raise OverflowError(seconds)
        value = dt.timedelta(seconds=seconds)
    except (ValueError, OverflowError) as exc:
        why = "too long" if isinstance(exc, OverflowError) else "not a duration"
        raise ConfigurationError(f"{head}: {why}; {hint}", value=text) from exc
    if value <= dt.timedelta(0):
        raise ConfigurationError(f"{head}: not positive; {hint}", value=text)
    return value


_SOURCE_KEYS = JOB_SOURCE_KEYS
_TOP_KEYS = JOB_TOP_KEYS


def _source(where: str, default_name: str, table: object) -> Source:
    if not isinstance(table, dict):
        raise ConfigurationError(f"{where} must be a table of {', '.join(_SOURCE_KEYS)}")
    check_keys(table, _SOURCE_KEYS, where)
    if "url" not in table:
        raise ConfigurationError(
            f"{where} has no 'url': add url = \"jdbc:postgresql://host:5432/dbname\"",
            key="url",
        )
    for key, value in table.items():
        if key == "max_connections":
            _check_count(where, key, value, example=DEFAULT_MAX_CONNECTIONS)
        else:
            check_value(key, value, isinstance(value, str) and bool(value), "a non-empty string",
                        where=where)  # fmt: skip
    return Source(
        name=table.get("name", default_name),
        url=table["url"],
        user=table.get("user"),
        password_env=table.get("password_env"),
        password_file=table.get("password_file"),
        schema=table.get("schema"),
        max_connections=table.get("max_connections", DEFAULT_MAX_CONNECTIONS),
        sslpassword_env=table.get("sslpassword_env"),
    )


def _inboxes(where: str, value: object) -> tuple[Source, ...]:
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigurationError(
            f"{where}: 'inbox' must be an array of tables: write [[inbox]] (double brackets) "
            "once per inbox database, each with its url",
            key="inbox",
        )
    return tuple(
        _source(f"{where}: [[inbox]] #{i + 1}", f"inbox{i + 1}", t) for i, t in enumerate(value)
    )


def _subscriptions(where: str, value: object) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"{where}: 'subscriptions' must be a table: [subscriptions] then "
            'orders = ["billing", "shipping"]',
            key="subscriptions",
        )
    for topic, consumers in value.items():
        _check_consumers(f"{where}: [subscriptions] {topic}", consumers)
    return {t: tuple(dict.fromkeys(c.strip() for c in cs)) for t, cs in value.items()}


def _table(where: str, key: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where}: {key!r} must be a table: [{key}]", key=key)
    return value


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a job file into keyword pieces: ``outbox``, ``inboxes``, ``subscriptions``,
    ``sla``, ``thresholds``, ``rows_per_partition`` (each present only if the file sets it).

    The file is checked against its schema: unknown keys (at any level), wrong types,
    ``[inbox]`` for ``[[inbox]]``, bad durations or thresholds raise ConfigurationError
    naming the file and the key."""
    doc = read_toml(path, kind="job file")
    where = f"job file {path}"
    check_keys(doc, _TOP_KEYS, where)
    out: dict[str, Any] = {}
    if "outbox" in doc:
        out["outbox"] = _source(f"{where}: [outbox]", "outbox", doc["outbox"])
    if "inbox" in doc:
        out["inboxes"] = _inboxes(where, doc["inbox"])
        check_inboxes(out["inboxes"])
    if "subscriptions" in doc:
        out["subscriptions"] = _subscriptions(where, doc["subscriptions"])
    if "sla" in doc:
        sla = doc["sla"]
        if isinstance(sla, bool) or not isinstance(sla, str | int | float):
            raise ConfigurationError(f'{where}: sla must be a duration like "1h", got {sla!r}')
        out["sla"] = parse_duration(str(sla), what=f"{where}: sla")
    if "thresholds" in doc:
        thresholds = _table(where, "thresholds", doc["thresholds"])
        check_thresholds(thresholds, f"{where}: [thresholds]")
        out["thresholds"] = dict(thresholds)
    if "rows_per_partition" in doc:
        rows = doc["rows_per_partition"]
        _check_count(where, "rows_per_partition", rows, example=DEFAULT_ROWS_PER_PARTITION)
        out["rows_per_partition"] = rows
    return out


def _url_form(url: str, where: str) -> str:
    """``url`` (any form outbox/_dburl.py accepts) as ``postgresql://`` URL; a libpq
    ``key=value`` string becomes one (its password, if any, is refused by :meth:`parameters`)."""
    try:
        raw = libpq_url(url, where)
    except ConfigurationError:
        raise ConfigurationError(
            f"{where}: invalid URL {redact(url)!r}: expected jdbc:postgresql://host:5432/dbname "
            f"(or {ACCEPTED})"
        ) from None
    if "://" in raw:
        return raw
    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(raw).items() if v is not None}
    host = params.pop("host", "localhost")
    port = params.pop("port", None)
    user = params.pop("user", None)
    dbname = params.pop("dbname", "")
    netloc = f"{quote(user)}@" if user else ""
    netloc += f"[{host}]" if ":" in host else host
    netloc += f":{port}" if port else ""
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{netloc}/{quote(dbname)}{query}"
