"""The relay's configuration: flags > ``OUTBOX_*`` environment > TOML file > defaults.

Everything ends in one frozen :class:`RelayConfig`, validated as a whole, with errors that name
the setting, where it came from and what would be accepted.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from outbox.exceptions import ConfigurationError
from outbox.kit import (
    check_keys,
    check_value,
    libpq_url,
    parse_env,
    read_toml,
    redact,
    url_source,
)
from outbox.schema import check_identifier
from relay._broker_config import options_for, parse_env_option, scheme_of, validate_options
from relay._claimcheck_config import claim_check_from_env, validate_claim_check

__all__ = ["RelayConfig", "TopicPolicy"]

Semantics = Literal["at-least-once", "at-most-once"]
DeadPolicy = Literal["hold", "skip"]

_SEMANTICS = ("at-least-once", "at-most-once")
#: where RelayConfig.load found the database URL, for the error that refuses it
_URL_LABEL: contextvars.ContextVar[str] = contextvars.ContextVar(
    "url_label", default="database_url"
)
_DEAD = ("hold", "skip")


@dataclass(frozen=True)
class TopicPolicy:
    """How one topic is relayed.

    * ``semantics``: ``at-least-once`` (marked after the broker's ack, retried) or
      ``at-most-once`` (marked published *before* sending, never retried).
    * ``on_dead``: ``hold`` keeps the rest of a key waiting behind a dead message until an
      operator retries or purges it; ``skip`` lets the key go on past it.
    * ``max_attempts``: failed attempts before a message becomes dead.
    """

    #: at-least-once (marked after the broker's ack, retried) or at-most-once (marked before)
    semantics: Semantics = "at-least-once"
    #: hold (the key waits behind a dead message) or skip (the key goes on past it)
    on_dead: DeadPolicy = "hold"
    #: failed attempts before a message becomes dead
    max_attempts: int = 10

    def __post_init__(self) -> None:
        if self.semantics not in _SEMANTICS:
            raise ConfigurationError(
                f"semantics {self.semantics!r} is not one of {', '.join(_SEMANTICS)} "
                "(effectively-once is at-least-once, plus the broker's dedup and the "
                "consumer's inbox)",
                value=self.semantics,
            )
        if self.on_dead not in _DEAD:
            raise ConfigurationError(
                f"on_dead {self.on_dead!r} is not one of {', '.join(_DEAD)}", value=self.on_dead
            )
        check_value(
            "max_attempts",
            self.max_attempts,
            _is_int(self.max_attempts) and self.max_attempts >= 1,
            "an integer >= 1",
        )


def _default_relay_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class RelayConfig:
    """Settings of one relay process. See docs/reference/relay-settings.md for each one."""

    def __repr__(self) -> str:  # the URLs' secrets masked: a config may reach a log or an error
        shown = (
            f"{f.name}={redact(value)!r}"
            if f.name.endswith("_url") and isinstance(value := getattr(self, f.name), str)
            else f"{f.name}={redact(repr(getattr(self, f.name)))}"
            for f in dataclasses.fields(self)
        )
        return f"RelayConfig({', '.join(shown)})"

    #: the outbox's PostgreSQL (libpq URL)
    database_url: str
    #: where to publish: nats://, amqp[s]:// (RabbitMQ), amqp1[s]:// (AMQP 1.0), kafka[s]://,
    #: redis[s]://, mqtt[s]://, sqs://, sns://, stdout:, file:/path, memory: (TOML: broker =
    #: "URL", or url in [broker])
    broker_url: str | None = None
    #: the adapter's options (TOML: the [broker] table; OUTBOX_BROKER_<OPTION>); each broker's
    #: are listed below
    broker_options: Mapping[str, Any] = field(default_factory=dict)
    #: topic -> broker destination, "*" a template with {topic} (TOML: [broker.destinations];
    #: OUTBOX_BROKER_DESTINATIONS=topic=dest,...)
    destinations: Mapping[str, str] = field(default_factory=dict)
    #: topic (or "*": every other topic) -> how many partitions its destination is split
    #: into; a destination then holds {partition}, the partition of the message's key
    #: (outbox.partition_for: CRC-32 of the key's UTF-8 bytes mod the count). NATS, RabbitMQ,
    #: Redis, MQTT and AMQP 1.0 (TOML: [broker.partitions]; OUTBOX_BROKER_PARTITIONS=topic=N,...)
    partitions: Mapping[str, int] = field(default_factory=dict)
    #: the claim check: payloads over a threshold go to object storage, a reference to the
    #: broker (TOML: the [claim_check] table; OUTBOX_CLAIM_CHECK_<OPTION>; keys listed below)
    claim_check: Mapping[str, Any] | None = None
    #: schema of the outbox tables (None: the search_path)
    schema: str | None = None
    #: the origin put on every message (which database it came from; consumers keep one
    #: position per origin, topic and key). None: the database's own (outbox_identity)
    origin: str | None = None
    #: this process's name in outbox_relays: unique among live relays (default: host-pid-random)
    relay_id: str = field(default_factory=_default_relay_id)
    #: rows per claim: the heads of keys (leased) and the runs behind them; whole runs of a few
    #: keys on a deep backlog, one row of each of many keys otherwise
    batch_size: int = 500
    #: most rows behind a key's head in one claim (a hot key's backlog goes out in runs of this
    #: size)
    per_key_batch: int = 100
    #: claims being published at once by this relay
    max_in_flight: int = 4
    #: a dead relay's rows are claimable again this long after its last claim (in 'wal' mode,
    #: a stalled streaming relay loses the slot this long after its last heartbeat)
    lease_seconds: float = 30.0
    #: a publish_batch still running after this is treated as failed (must be < lease)
    publish_timeout: float = 10.0
    #: fallback poll when no notification arrives (notifications are lost across reconnects)
    poll_interval: float = 1.0
    #: LISTEN for the producers' wake-ups (off: poll only)
    listen: bool = True
    #: watch the server for batches another relay numbered ('polling' mode; relay/_watch.py);
    #: off: the ledger is read every poll_interval at most when idle
    watch: bool = True
    #: how often the watch and the ledger's reader look while messages come
    watch_interval: float = 0.002
    #: how often they look at most when nothing moves (they back off to this)
    watch_idle_interval: float = 0.05
    #: first wait after a failure; doubles per consecutive failure, with jitter
    backoff_base: float = 0.5
    #: longest wait between retries of a failing message or an unreachable broker
    backoff_max: float = 300.0
    #: how often the relay refreshes its outbox_relays row and the backlog gauges
    heartbeat_interval: float = 5.0
    #: on SIGTERM, how long claims in flight may take to finish before the relay exits
    shutdown_timeout: float = 15.0
    #: delete published rows older than this many seconds (None: keep them; another job may)
    retention_seconds: float | None = None
    #: how often retention runs (with retention_seconds)
    retention_interval: float = 60.0
    #: rows deleted per retention transaction
    retention_batch: int = 1000
    #: serve Prometheus /metrics and /healthz on this port (None: no server)
    metrics_port: int | None = None
    #: address the metrics server binds to
    metrics_host: str = "127.0.0.1"
    #: the TopicPolicy of topics not listed in ``topics`` (TOML: [default])
    default_policy: TopicPolicy = field(default_factory=TopicPolicy)
    #: per-topic TopicPolicy (TOML: [topics.NAME])
    topics: Mapping[str, TopicPolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigurationError(
                "no database URL: set database_url / --url / OUTBOX_DATABASE_URL"
            )
        for name in ("database_url", "relay_id", "metrics_host"):
            _check(name, getattr(self, name), isinstance(getattr(self, name), str), "a string")
        for name in ("broker_url", "schema"):
            value = getattr(self, name)
            _check(name, value, value is None or isinstance(value, str), "a string")
        _check("origin", self.origin, _is_origin(self.origin),
               "1-255 bytes of printable text, no space at either end")  # fmt: skip
        if self.schema is not None:
            check_identifier(self.schema)
        for name in ("batch_size", "per_key_batch", "max_in_flight", "retention_batch"):
            value = getattr(self, name)
            _check(name, value, _is_int(value) and value >= 1, "an integer >= 1")
        for name in _SECONDS:
            value = getattr(self, name)
            _check(name, value, _is_seconds(value), "a finite number of seconds > 0")
        value = self.retention_seconds
        _check(
            "retention_seconds",
            value,
            value is None or _is_seconds(value),
            "a finite number of seconds > 0 (omit it to keep published rows)",
        )
        _check("listen", self.listen, isinstance(self.listen, bool), "true or false")
        _check("watch", self.watch, isinstance(self.watch, bool), "true or false")
        _check(
            "watch_idle_interval",
            self.watch_idle_interval,
            self.watch_idle_interval >= self.watch_interval,
            f"a number of seconds >= watch_interval ({self.watch_interval})",
        )
        port = self.metrics_port
        _check(
            "metrics_port",
            port,
            port is None or (_is_int(port) and 1 <= port <= 65535),
            "a TCP port, an integer from 1 to 65535",
        )
        _check(
            "default_policy",
            self.default_policy,
            isinstance(self.default_policy, TopicPolicy),
            "a TopicPolicy",
        )
        _check(
            "topics",
            self.topics,
            isinstance(self.topics, Mapping)
            and all(
                isinstance(t, str) and isinstance(p, TopicPolicy) for t, p in self.topics.items()
            ),
            "a mapping of topic names to TopicPolicy",
        )
        self._check_broker()
        if self.publish_timeout >= self.lease_seconds:
            raise ConfigurationError(
                f"publish_timeout ({self.publish_timeout}s) must be shorter than lease_seconds "
                f"({self.lease_seconds}s), or another relay could take over a batch that is "
                "still being published",
                setting="publish_timeout",
            )
        # the one URL rule (outbox/_dburl.py): SQLAlchemy's and JDBC's forms work here too;
        # checked last, so that a config's other errors are said whatever its URL
        label = _URL_LABEL.get()
        object.__setattr__(self, "database_url", libpq_url(self.database_url, label))

    def _check_broker(self) -> None:
        """The [broker] table's options (for the URL's adapter) and its destinations."""
        _check(
            "destinations",
            self.destinations,
            isinstance(self.destinations, Mapping)
            and all(
                isinstance(t, str) and isinstance(d, str) and d
                for t, d in self.destinations.items()
            ),
            'a table of topic = "destination" (non-empty strings)',
        )
        _check(
            "broker_options", self.broker_options, isinstance(self.broker_options, Mapping),
            "a table of broker options",
        )  # fmt: skip
        _check(
            "partitions",
            self.partitions,
            isinstance(self.partitions, Mapping)
            and all(isinstance(t, str) and t for t in self.partitions),
            "a table of topic = partition count",
        )
        if self.partitions or any("{partition}" in d for d in self.destinations.values()):
            from relay.brokers.base import Destinations

            Destinations(self.destinations, partitions=self.partitions)  # the templates agree
        if self.broker_url is not None and self.broker_options:
            validate_options(self.broker_url, self.broker_options)
        if self.claim_check is not None:
            validate_claim_check(self.claim_check)

    def policy(self, topic: str) -> TopicPolicy:
        """The policy of ``topic`` (the default one unless configured)."""
        return self.topics.get(topic, self.default_policy)

    def dead_policy_params(self) -> dict[str, Any]:
        """The claim statement's per-topic 'hold' parameters."""
        return {
            "hold_default": self.default_policy.on_dead == "hold",
            "hold_topics": [t for t, p in self.topics.items() if p.on_dead == "hold"],
            "skip_topics": [t for t, p in self.topics.items() if p.on_dead == "skip"],
        }

    @classmethod
    def load(
        cls,
        file: str | Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **flags: Any,
    ) -> RelayConfig:
        """Merge a TOML file, ``OUTBOX_*`` environment variables and flags (``None`` = unset)."""
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        if file is not None:
            values.update(_from_toml(Path(file), origin))
        environ = os.environ if env is None else env
        values.update(_from_env(environ))
        values.update({k: v for k, v in flags.items() if v is not None})
        _broker_from_env(environ, values, origin)
        claim_check_from_env(environ, values, origin)
        if values.get("claim_check") is not None:
            validate_claim_check(values["claim_check"], _claim_check_origin(values, origin))
        if values.get("broker_url") and values.get("broker_options"):
            validate_options(values["broker_url"], values["broker_options"], origin)
        source = "database_url"
        if values.get("database_url"):  # say where it came from, in errors and hints
            url = values["database_url"]
            source = (
                "--url"
                if flags.get("database_url")
                else next(
                    (f"${v}" for v in ("OUTBOX_DATABASE_URL", "DATABASE_URL")
                     if environ.get(v) == url),
                    f"config file {file}: database_url",
                )
            )  # fmt: skip
            url_source(source)
        token = _URL_LABEL.set(source)
        try:
            return _build(cls, values)
        finally:
            _URL_LABEL.reset(token)


_SECONDS = (
    "lease_seconds",
    "publish_timeout",
    "poll_interval",
    "watch_interval",
    "watch_idle_interval",
    "backoff_base",
    "backoff_max",
    "heartbeat_interval",
    "shutdown_timeout",
    "retention_interval",
)


def _is_int(value: object) -> bool:
    """An int, and not a bool (``True`` is an int in Python; ``max_attempts = true`` is a typo)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_origin(value: object) -> bool:
    """None, or what outbox_identity.origin takes: 1-255 bytes, printable, no edge spaces."""
    if value is None:
        return True
    return (
        isinstance(value, str)
        and value.strip() == value
        and value.isprintable()
        and 0 < len(value.encode("utf-8", "surrogatepass")) <= 255
    )


def _is_seconds(value: object) -> bool:
    """A finite number > 0 (``nan`` compares false with everything, so it passed ``<= 0``)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _check(name: str, value: object, ok: bool, accepts: str) -> None:
    check_value(name, value, ok, accepts, setting=name)


_FIELDS = {f.name: f for f in dataclasses.fields(RelayConfig)}
_SCALARS = set(_FIELDS) - {
    "default_policy", "topics", "broker_options", "destinations", "partitions", "claim_check"
}  # fmt: skip


def _claim_check_origin(values: Mapping[str, Any], origin: Mapping[str, str]) -> str:
    """Where the claim check's settings came from: the file's table and/or the variables."""
    found = sorted({origin[f"claim_check.{k}"] for k in values["claim_check"]
                    if f"claim_check.{k}" in origin})  # fmt: skip
    return ", ".join(found) if found else "[claim_check]"


def _from_toml(path: Path, origin: dict[str, str]) -> dict[str, Any]:
    data = read_toml(path, kind="config file")
    if "relay" in data:  # [relay] holds the settings; [broker] may sit beside it
        data = {**data["relay"], **{k: data[k] for k in ("broker", "claim_check") if k in data}}
    where = f"config file {path}"
    # [[databases]] and [fleet]: a relay serving many databases (relay/_fleet_config.py)
    check_keys(
        data, sorted({*_FIELDS, "default", "broker", "databases", "fleet"}), where,
        what="setting",
    )  # fmt: skip
    if "claim_check" in data:
        out_claim = data["claim_check"]
        if isinstance(out_claim, dict):
            origin.update({f"claim_check.{k}": f"{where}: [claim_check]" for k in out_claim})
        else:
            raise ConfigurationError(f"{where}: claim_check must be a [claim_check] table")
    out = {k: v for k, v in data.items() if k in _SCALARS or k == "claim_check"}
    broker = data.get("broker")
    if isinstance(broker, str):  # broker = "nats://..." is the URL
        out["broker_url"] = broker
    elif isinstance(broker, dict):
        broker = dict(broker)
        if "url" in broker:
            if "broker_url" in data:
                raise ConfigurationError(
                    f"{where}: the broker URL is given twice (broker_url and [broker] url)"
                )
            out["broker_url"] = broker.pop("url")
        if "destinations" in broker:
            out["destinations"] = broker.pop("destinations")
            check_value(
                "[broker.destinations]",
                out["destinations"],
                isinstance(out["destinations"], dict),
                'a table of topic = "destination"',
                where=where,
            )
        if "partitions" in broker:
            out["partitions"] = broker.pop("partitions")
            check_value(
                "[broker.partitions]",
                out["partitions"],
                isinstance(out["partitions"], dict),
                "a table of topic = partition count",
                where=where,
            )
        out["broker_options"] = broker
        origin.update({name: f"{where}: [broker]" for name in broker})
    elif broker is not None:
        raise ConfigurationError(
            f'{where}: broker must be a URL (broker = "nats://...") or a [broker] table'
        )
    if "default" in data or "default_policy" in data:
        raw = data.get("default", data.get("default_policy"))
        out["default_policy"] = _policy("the default policy", raw, f"{where}: [default]")
    if "topics" in data:
        if not isinstance(data["topics"], dict):
            raise ConfigurationError(f"{where}: [topics] must be a table of topic -> policy")
        out["topics"] = {
            t: _policy(f"topic {t!r}", p, f"{where}: [topics.{t}]")
            for t, p in data["topics"].items()
        }
    return out


def _policy(label: str, raw: Any, where: str) -> TopicPolicy:
    """The TopicPolicy of one table; errors say ``label`` (``topic 'orders'``) and ``where``."""
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{where}: {label} must be a table of policy keys, got {raw!r}")
    check_keys(raw, [f.name for f in dataclasses.fields(TopicPolicy)], where)
    try:
        return TopicPolicy(**raw)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{label}: {exc.message}") from exc


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if env.get("OUTBOX_DATABASE_URL"):
        out["database_url"] = env["OUTBOX_DATABASE_URL"]
    elif env.get("DATABASE_URL"):  # the other commands' fallback, the same for the relay
        out["database_url"] = env["DATABASE_URL"]
    if env.get("OUTBOX_BROKER_URL"):
        out["broker_url"] = env["OUTBOX_BROKER_URL"]
    if env.get("OUTBOX_SCHEMA"):
        out["schema"] = env["OUTBOX_SCHEMA"]
    for name in _SCALARS - {"database_url", "broker_url", "schema"}:
        var = f"OUTBOX_RELAY_{name.upper()}"
        if var in env:
            out[name] = parse_env(var, env[var], _kind(name), name)
    return out


def _partitions_from_env(text: str) -> dict[str, int]:
    """``OUTBOX_BROKER_PARTITIONS``: ``topic=N,...`` (or a JSON object), counts whole numbers."""
    from relay._broker_config import Option

    var = "OUTBOX_BROKER_PARTITIONS"
    table = parse_env_option(var, text, Option("partitions", ("table",), None, ""))
    if not isinstance(table, dict):
        raise ConfigurationError(f"{var} must be topic=N[,topic=N...] or a JSON object")
    return {
        str(topic): parse_env(var, str(count), int, "partitions") for topic, count in table.items()
    }


def _broker_from_env(
    env: Mapping[str, str], values: dict[str, Any], origin: dict[str, str]
) -> None:
    """``OUTBOX_BROKER_DESTINATIONS`` and ``OUTBOX_BROKER_<OPTION>`` (over the file's)."""
    raw = {
        var: text
        for var, text in env.items()
        if var.startswith("OUTBOX_BROKER_") and var != "OUTBOX_BROKER_URL" and text != ""
    }
    if not raw:
        return
    if "OUTBOX_BROKER_DESTINATIONS" in raw:
        text = raw.pop("OUTBOX_BROKER_DESTINATIONS")
        from relay._broker_config import Option

        table = parse_env_option("OUTBOX_BROKER_DESTINATIONS", text,
                                 Option("destinations", ("table",), None, ""))  # fmt: skip
        values["destinations"] = {**values.get("destinations", {}), **table}
    if "OUTBOX_BROKER_PARTITIONS" in raw:
        values["partitions"] = {
            **values.get("partitions", {}),
            **_partitions_from_env(raw.pop("OUTBOX_BROKER_PARTITIONS")),
        }
    if not raw:
        return
    url = values.get("broker_url")
    if not url:
        raise ConfigurationError(
            f"{sorted(raw)[0]} is set but no broker URL is (OUTBOX_BROKER_URL, --broker, or "
            "broker in the config file)"
        )
    known = options_for(scheme_of(url))
    options = dict(values.get("broker_options", {}))
    for var, text in sorted(raw.items()):
        name = var.removeprefix("OUTBOX_BROKER_").lower()
        if name not in known:
            check_keys([name], sorted(known), var, what=f"{scheme_of(url)}:// option")
        options[name] = parse_env_option(var, text, known[name])
        origin[name] = var
    values["broker_options"] = options


def _kind(name: str) -> type:
    """The Python type of a scalar setting (its annotation is a string: ``"float | None"``)."""
    annotation = str(_FIELDS[name].type)
    return next((t for t in (bool, int, float) if t.__name__ in annotation), str)


def _build(cls: type[RelayConfig], values: dict[str, Any]) -> RelayConfig:
    if "database_url" not in values:
        raise ConfigurationError(
            "no database URL: pass --url postgresql://user@host:5432/dbname, set "
            "OUTBOX_DATABASE_URL, or database_url in the config file"
        )
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigurationError(f"invalid relay configuration: {exc}") from exc
