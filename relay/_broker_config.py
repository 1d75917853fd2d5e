"""The publisher's settings in the relay's config: the ``[broker]`` table, ``OUTBOX_BROKER_*``.

The options are declared once, where they are used: the keyword-only parameters of each
adapter's constructor (``relay/brokers/<broker>.py``) and of
:func:`relay.brokers.publisher_for_url`. This module reads them from those signatures, so an
option an adapter gains is a setting of the daemon at once (and a row of the generated
settings reference); :data:`OPTION_HELP` says what each one means, and a test fails for an
option without a line there.

Besides the adapters' own options, the daemon takes three TLS files any TLS broker needs
(:data:`TLS_FILES`: ``tls_ca``, ``tls_cert``, ``tls_key``) and turns them into each client's
form (:func:`publisher_kwargs`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import ssl
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from outbox.exceptions import ConfigurationError
from outbox.kit import check_keys, parse_env, remember_secrets, value_error

__all__ = [
    "OPTION_HELP",
    "TLS_FILES",
    "Option",
    "adapter_name",
    "object_options",
    "options_for",
    "parse_env_option",
    "publisher_kwargs",
    "scheme_of",
    "validate_options",
]

#: the daemon's TLS settings (files), translated per broker by :func:`publisher_kwargs`
TLS_FILES = {
    "tls_ca": "file of the CA certificates that sign the broker's certificate (PEM)",
    "tls_cert": "file of the relay's client certificate (PEM), for brokers that ask for one",
    "tls_key": "file of the client certificate's private key (PEM)",
}

#: what each adapter option means (the settings reference prints these; a test checks that
#: every option of every adapter has one)
OPTION_HELP: dict[str, str] = {
    "allowed_destinations": "patterns of the destinations this relay may publish to (NATS "
    "subjects, MQTT filters, globs elsewhere); a topic mapped elsewhere pauses (NATS: the "
    "stream's subjects by default)",
    "cloudevents": "write CloudEvents (a table: source, types, topics, structured; "
    "docs/how-to/cloudevents.md)",
    "timeout": "seconds the adapter waits for the broker's acknowledgements of a batch "
    "(default: 80 % of the relay's publish budget; must stay below it)",
    "connect_timeout": "seconds to wait for a connection to the broker",
    "max_in_flight": "most messages handed to the client and not yet acknowledged",
    "max_payload_bytes": "largest body accepted; a larger message is dead-lettered (0: the "
    "broker's own limit)",
    "stream": "JetStream stream the relay checks (and creates with create_stream) at start",
    "stream_subjects": "subjects of the stream it creates (default: STREAM.>); must cover "
    "every destination",
    "create_stream": "create the stream at start when it does not exist",
    "duplicate_window": "seconds JetStream drops a re-sent message id (the created stream's "
    "duplicate_window)",
    "connect_options": "more nats-py connect() options (a table: name, user, password, token, ...)",
    "config": "librdkafka settings (a table: 'security.protocol', 'sasl.mechanism', "
    "'linger.ms', ...); they win over the URL's",
    "persistent": "mark messages persistent (delivery mode 2)",
    "maxlen": "trim each stream to about this many entries (XADD MAXLEN ~; none: keep all)",
    "qos": "MQTT QoS of at-least-once topics (1 or 2)",
    "qos_by_topic": "QoS per topic (a table: topic = 0, 1 or 2)",
    "username": "user name (instead of the URL's)",
    "password": "password (instead of the URL's; masked in every log and error)",
    "client_id": "MQTT client id (empty: generated)",
    "tls": "connect with TLS (mqtts:// sets it)",
    "max_queued": "most messages paho may queue before a publish fails",
    "durable": "send messages durable (the broker keeps them across its restart)",
    "sasl_mechanisms": "SASL mechanisms offered, space-separated (e.g. PLAIN)",
    "tls_verify": "verify the broker's certificate and host name",
    "virtual_host": "the connection's hostname field (Service Bus and Artemis namespaces)",
    "heartbeat": "seconds of idle time before the connection is presumed dead (none: off)",
    "default_destination": "template for topics destinations does not map ({topic}.fifo)",
    "endpoint_url": "a local or private endpoint instead of AWS's",
    "call_timeout": "seconds one AWS call may take (default: timeout)",
    "concurrency": "AWS calls in flight at once",
    "fsync": "fsync the file after every batch",
    "keeps_key_order": "the memory broker keeps each key's order (tests)",
    **TLS_FILES,
}

#: parameters that are not settings of the daemon: set from elsewhere, or not expressible in TOML
_NOT_SETTINGS = {"destinations", "partitions", "ack_timeout"}
_ALT = re.compile(r"\s*\|\s*")


@dataclass(frozen=True)
class Option:
    """One setting of the ``[broker]`` table: its name, kinds, default and meaning."""

    name: str
    #: accepted kinds: "str", "int", "float", "bool", "list", "table", "none"
    kinds: tuple[str, ...]
    default: Any
    help: str
    #: the module whose names the annotation uses (to build an ``object:`` option's class)
    module: str = ""

    def accepts(self) -> str:
        words = {
            "str": "a string",
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "list": "a list of strings",
            "table": "a table",
            "none": "omitted",
        }
        return " or ".join(
            words.get(k, f"a table of {k.partition(':')[2]}'s fields")
            for k in self.kinds
            if k != "none"
        )

    def check(self, value: Any, where: str) -> None:
        ok = (
            ("bool" in self.kinds and isinstance(value, bool))
            or (not isinstance(value, bool) and "int" in self.kinds and isinstance(value, int))
            or (
                not isinstance(value, bool)
                and "float" in self.kinds
                and isinstance(value, int | float)
            )
            or ("str" in self.kinds and isinstance(value, str))
            or (
                "list" in self.kinds
                and isinstance(value, list)
                and all(isinstance(v, str) for v in value)
            )
            or (
                any(k == "table" or k.startswith("object:") for k in self.kinds)
                and isinstance(value, dict)
            )
        )
        if not ok:
            raise value_error(self.name, value, self.accepts(), where=where, setting=self.name)


def _kinds(annotation: str) -> tuple[str, ...] | None:
    """The kinds a string annotation accepts (None: not expressible in TOML)."""
    kinds: list[str] = []
    for alt in _ALT.split(annotation.strip()):
        base = alt.split("[", 1)[0].strip()
        if alt in ("str", "int", "float", "bool"):
            kinds.append(alt)
        elif alt == "None":
            kinds.append("none")
        elif base in ("Sequence", "list", "tuple") and "[str" in alt:
            kinds.append("list")
        elif base in ("Mapping", "dict"):
            kinds.append("table")
        elif alt.startswith("os.PathLike") or alt == "Path":
            kinds.append("str")
        elif alt.isidentifier() and alt[:1].isupper():  # a class of the adapter's module,
            kinds.append(f"object:{alt}")  # built from a table of its fields (object_options)
        else:
            return None
    return tuple(kinds)


def scheme_of(url: str) -> str:
    return url.partition(":")[0].lower()


def _adapter(scheme: str) -> Callable[..., Any] | None:
    from relay.brokers import _BUILDERS

    builder = _BUILDERS.get(scheme)
    if builder is None:
        return None
    module, cls_name, _ = builder
    cls: Callable[..., Any] = getattr(importlib.import_module(f"relay.brokers.{module}"), cls_name)
    return cls


def adapter_name(scheme: str) -> str:
    cls = _adapter(scheme)
    return getattr(cls, "__name__", "?") if cls is not None else "?"


def options_for(scheme: str) -> dict[str, Option]:
    """The ``[broker]`` settings a broker URL of ``scheme`` takes (adapter options, the
    options of publisher_for_url, and the TLS files)."""
    from relay.brokers import publisher_for_url

    found: dict[str, Option] = {}
    cls = _adapter(scheme)
    sources: list[Callable[..., Any]] = [publisher_for_url, *([cls] if cls else [])]
    for source in sources:
        for param in inspect.signature(source).parameters.values():
            if param.kind is not inspect.Parameter.KEYWORD_ONLY or param.name in _NOT_SETTINGS:
                continue
            kinds = _kinds(str(param.annotation))
            module = sys.modules.get(getattr(source, "__module__", ""))
            if kinds is None or not all(
                dataclasses.is_dataclass(getattr(module, k.partition(":")[2], None))
                for k in kinds
                if k.startswith("object:")
            ):  # only a dataclass is built from a table (TextIO, say, is not)
                continue
            default = None if param.default is inspect.Parameter.empty else param.default
            found[param.name] = Option(
                param.name, kinds, default, OPTION_HELP.get(param.name, ""),
                getattr(source, "__module__", ""),
            )  # fmt: skip
    for name, text in TLS_FILES.items():
        found.setdefault(name, Option(name, ("str", "none"), None, text))
    return found


def validate_options(
    url: str, options: Mapping[str, Any], origin: Mapping[str, str] | None = None
) -> None:
    """Refuse an option the broker of ``url`` does not take or a value of the wrong kind; the
    error names where the value came from (``origin[name]``: a file's table, a variable)."""
    origin = origin or {}
    known = options_for(scheme_of(url))
    for name, value in options.items():
        where = origin.get(name, "[broker]")
        if name not in known:
            check_keys([name], sorted(known), where, what=f"{scheme_of(url)}:// option")
        known[name].check(value, where)
    for name in TLS_FILES:
        path = options.get(name)
        if path is not None and not Path(path).is_file():
            raise ConfigurationError(
                f"{origin.get(name, '[broker]')}: {name} file {path} does not exist",
                setting=name,
            )
    object_options(url, options, origin)  # a table that does not build its object: here
    if options.get("password") is not None:
        remember_secrets({"password": options["password"]})
    for name in ("connect_options", "config"):
        if isinstance(options.get(name), dict):
            remember_secrets(options[name])


def object_options(
    url: str, options: Mapping[str, Any], origin: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``options`` with each table given for a class-typed option (``cloudevents =
    {...}``, say) built into that class, from the adapter module's own name for it."""
    known = options_for(scheme_of(url))
    out = dict(options)
    for name, value in options.items():
        option = known.get(name)
        classes = [k.partition(":")[2] for k in option.kinds if k.startswith("object:")] if (
            option is not None and isinstance(value, dict)
        ) else []  # fmt: skip
        if not classes or option is None:
            continue
        where = (origin or {}).get(name, "[broker]")
        cls = getattr(sys.modules.get(option.module), classes[0], None)
        if cls is None:
            raise ConfigurationError(
                f"{where}: {name} cannot be built from the config file ({classes[0]} is not "
                "importable where the adapter names it): set it from Python",
                setting=name,
            )
        try:
            out[name] = cls(**value)
        except (TypeError, ValueError, ConfigurationError) as exc:
            raise ConfigurationError(f"{where}: {name}: {exc}", setting=name) from exc
    return out


def parse_env_option(var: str, raw: str, option: Option) -> Any:
    """The text of ``var`` as ``option``'s kind: a list is comma-separated (or a JSON array),
    a table is ``k=v,k=v`` (or a JSON object)."""
    if "list" in option.kinds or any(
        k == "table" or k.startswith("object:") for k in option.kinds
    ):
        text = raw.strip()
        if text.startswith(("{", "[")):
            try:
                return json.loads(text)
            except ValueError as exc:
                raise ConfigurationError(
                    f"{var} is not valid JSON: {exc}", setting=option.name
                ) from None
        if "list" not in option.kinds:
            pairs = [p for p in text.split(",") if p.strip()]
            if not all("=" in p for p in pairs):
                raise ConfigurationError(
                    f"{var} must be name=value[,name=value...] or a JSON object",
                    setting=option.name,
                )
            return {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in pairs)}
        return [p.strip() for p in text.split(",") if p.strip()]
    for kind, cast in (("bool", bool), ("int", int), ("float", float)):
        if kind in option.kinds:
            return parse_env(var, raw, cast, option.name)
    return raw


def publisher_kwargs(url: str, options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The URL and keyword arguments for publisher_for_url: the TLS files in the client's form
    (NATS: an SSL context; Kafka: librdkafka's ssl.* settings; RabbitMQ, Redis: URL
    parameters; AMQP 1.0: its tls_ca)."""
    kwargs = object_options(url, options)
    tls = {name: kwargs.pop(name) for name in TLS_FILES if kwargs.get(name) is not None}
    scheme = scheme_of(url)
    if not tls:
        return url, kwargs
    if scheme == "nats":
        context = ssl.create_default_context(cafile=tls.get("tls_ca"))
        if "tls_cert" in tls:
            context.load_cert_chain(tls["tls_cert"], tls.get("tls_key"))
        kwargs["connect_options"] = {**kwargs.get("connect_options", {}), "tls": context}
    elif scheme in ("kafka", "kafkas"):
        names = {"tls_ca": "ssl.ca.location", "tls_cert": "ssl.certificate.location",
                 "tls_key": "ssl.key.location"}  # fmt: skip
        config = {names[k]: v for k, v in tls.items()}
        if "sasl.username" not in (kwargs.get("config") or {}) and "@" not in url:
            config.setdefault("security.protocol", "SSL")
        kwargs["config"] = {**config, **(kwargs.get("config") or {})}
    elif scheme in ("amqp", "amqps", "redis", "rediss"):
        names = (
            {"tls_ca": "cafile", "tls_cert": "certfile", "tls_key": "keyfile"}
            if scheme.startswith("amqp")
            else {"tls_ca": "ssl_ca_certs", "tls_cert": "ssl_certfile", "tls_key": "ssl_keyfile"}
        )
        parts = urlsplit(url)
        query = [*parse_qsl(parts.query), *((names[k], v) for k, v in tls.items())]
        url = urlunsplit(parts._replace(query=urlencode(query)))
    elif scheme in ("amqp1", "amqp1s") and set(tls) == {"tls_ca"}:
        kwargs["tls_ca"] = tls["tls_ca"]
    else:
        raise ConfigurationError(
            f"[broker] {', '.join(sorted(tls))}: the {scheme}:// adapter does not take TLS "
            "files (SQS and SNS use AWS_CA_BUNDLE; MQTT and AMQP 1.0 the system's trust store "
            "or tls_ca)",
            setting=sorted(tls)[0],
        )
    return url, kwargs
