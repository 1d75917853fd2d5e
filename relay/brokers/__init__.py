"""Broker adapters: one module per broker, SDKs imported lazily; the URL chooses the adapter.

>>> pub = publisher_for_url("nats://127.0.0.1:4222", destinations={"*": "events.{topic}"})
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from outbox.exceptions import ConfigurationError, MissingDependencyError
from outbox.kit import redact, remember_secrets
from relay.brokers.base import BrokerFeatures, Destinations, Publisher

__all__ = [
    "BrokerFeatures",
    "Destinations",
    "MissingDependencyError",
    "Publisher",
    "publisher_for_url",
]

SCHEMES: tuple[str, ...]
SCHEMES = ("nats", "amqp", "amqps", "kafka", "kafkas", "redis", "rediss", "mqtt", "mqtts", "stdout",
           "file", "memory")  # fmt: skip
SCHEMES += ("amqp1", "amqp1s")  # AMQP 1.0 (amqp:// is RabbitMQ's 0-9-1)
SCHEMES += ("sqs", "sns")  # Amazon SQS and SNS: relay/brokers/sqs.py


def publisher_for_url(
    url: str,
    *,
    destinations: Mapping[str, str] | None = None,
    partitions: Mapping[str, int] | None = None,
    ack_timeout: float | None = None,
    **options: Any,
) -> Publisher:
    """The adapter for ``url``'s scheme, built with ``destinations`` and adapter ``options``.

    ``partitions`` (topic or "*" -> count) splits topics over destinations holding
    ``{partition}`` (NATS, RabbitMQ, Redis, MQTT, AMQP 1.0 and ``memory:``; Kafka and SQS FIFO
    keep each key's order with their own partitions and message groups).

    ``ack_timeout`` becomes the ``timeout`` option of adapters that wait for acknowledgements
    (unless ``timeout`` is given); the others ignore it. ``outbox relay`` passes 80 % of its
    publish budget, so the adapter always gives up before the relay does.

    ``nats://h:p[,nats://h2:p2]``, ``amqp[s]://user:pass@h:p/vhost``,
    ``kafka[s]://[user:pass@]h:p[,h2:p2][?mechanism=SCRAM-SHA-512]`` (SASL, see ``_kafka``),
    ``redis[s]://h:p/db``, ``mqtt[s]://[user:pass@]h[:p]``, ``stdout:``, ``file:/path``,
    ``memory:``, ``sqs://[REGION][?endpoint=URL]``, ``sns://[REGION][?endpoint=URL]``. Raises
    ConfigurationError for an unknown scheme or option, and
    MissingDependencyError (a ConfigurationError) naming the pip extra when the SDK is missing.
    """
    scheme = url.partition(":")[0].lower()
    builder = _BUILDERS.get(scheme)
    if builder is None or ":" not in url:
        raise ConfigurationError(
            f"unknown broker URL {redact(url)!r}: use one of "
            + ", ".join(
                f"{s}:" if s in ("stdout", "file", "memory") else f"{s}://" for s in SCHEMES
            ),
            url=redact(url),
        )
    module, cls_name, make_args = builder
    cls = getattr(importlib.import_module(f"relay.brokers.{module}"), cls_name)
    remember_secrets(url, options.get("config"))  # masked wherever a client's error quotes them
    url, allow = _allow_of(url)
    if allow is not None:
        if not _accepts(cls, "allowed_destinations"):
            raise ConfigurationError(
                f"{scheme}: URLs take no allow= (this adapter sends to one place)", url=redact(url)
            )
        options = {"allowed_destinations": allow, **options}
    args, implied = make_args(url)
    if "config" in implied and options.get("config") is not None:  # the caller's settings win
        options = {**options, "config": {**implied["config"], **options["config"]}}
    kwargs = {**implied, **options, "destinations": destinations}
    if partitions:
        if not _accepts(cls, "partitions"):
            raise ConfigurationError(
                f"{scheme}: [broker.partitions] is for NATS, RabbitMQ, Redis, MQTT and AMQP 1.0 "
                "(Kafka partitions by key and SQS FIFO groups by key by themselves)",
                url=redact(url),
            )
        kwargs["partitions"] = partitions
    if ack_timeout is not None and "timeout" not in kwargs and _accepts(cls, "timeout"):
        kwargs["timeout"] = ack_timeout
    _check_options(cls, kwargs, url)
    publisher: Publisher = cls(*args, **kwargs)
    return publisher


def _allow_of(url: str) -> tuple[str, list[str] | None]:
    """``url`` without its ``allow=`` query parameters, and their patterns (comma-separated,
    repeatable): the destinations the default mapping may make (``allowed_destinations``), so
    ``outbox relay --broker 'kafka://k:9092?allow=orders-*'`` bounds where topics go."""
    base, question, query = url.partition("?")
    if not question or "allow=" not in query:
        return url, None
    keep: list[str] = []
    allow: list[str] = []
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if key == "allow":
            allow.extend(p for p in unquote(value).split(",") if p)
        else:
            keep.append(item)
    if not allow:
        raise ConfigurationError(
            f"broker URL {redact(url)!r}: allow= needs destination patterns (orders-*,events.>)",
            url=redact(url),
        )
    return base + ("?" + "&".join(keep) if keep else ""), allow


def _accepts(cls: Callable[..., Any], option: str) -> bool:
    param = inspect.signature(cls).parameters.get(option)
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


def _check_options(cls: Callable[..., Any], kwargs: Mapping[str, Any], url: str) -> None:
    params = inspect.signature(cls).parameters
    allowed = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {', '.join(unknown)} for {url.partition(':')[0]}: adapter "
            f"{getattr(cls, '__name__', cls)}; valid: {', '.join(sorted(allowed))}",
            options=unknown,
        )


def _whole(url: str) -> tuple[list[Any], dict[str, Any]]:
    return [url], {}


def _nats(url: str) -> tuple[list[Any], dict[str, Any]]:
    return [[u.strip() for u in url.split(",") if u.strip()]], {}


#: SASL mechanisms librdkafka accepts with a user name and a password
KAFKA_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _kafka(url: str) -> tuple[list[Any], dict[str, Any]]:
    """``kafka[s]://[user:password@]host:port[,host:port][?mechanism=SCRAM-SHA-512]``.

    The user-info becomes librdkafka's SASL settings (never part of a server name, which
    librdkafka logs): ``sasl.username``, ``sasl.password``, ``sasl.mechanism`` (``mechanism``,
    default PLAIN) and ``security.protocol`` SASL_PLAINTEXT, or SASL_SSL for ``kafkas://``
    (plain ``kafkas://`` without user-info is SSL).
    """
    expected = "kafka[s]://[user:password@]host:port[,host:port][?mechanism=PLAIN]"
    scheme, _, rest = url.partition("://")
    tls = scheme.lower() == "kafkas"
    rest, _, query = rest.partition("?")
    userinfo, at, servers = rest.rpartition("@")
    hosts = [
        h.strip().removeprefix("kafkas://").removeprefix("kafka://").rstrip("/")
        for h in servers.split(",")
    ]
    if not all(hosts) or any("@" in h or "/" in h for h in hosts):
        raise ConfigurationError(f"Kafka URL {redact(url)!r} needs {expected}", url=redact(url))
    params = dict(parse_qsl(query, keep_blank_values=True))
    mechanism = params.pop("mechanism", None) or params.pop("sasl_mechanism", None) or "PLAIN"
    if params:
        raise ConfigurationError(
            f"Kafka URL {redact(url)!r}: unknown parameter(s) {', '.join(sorted(params))}; "
            "the only one is mechanism (pass other librdkafka settings as config={...})",
            url=redact(url),
        )
    config: dict[str, Any] = {}
    if at:
        user, colon, password = userinfo.partition(":")
        if not user or not colon:
            shown = redact(url, secrets=(userinfo,))  # a lone user-info may be a password
            raise ConfigurationError(
                f"Kafka URL {shown!r}: the user-info must be user:password (SASL); "
                f"expected {expected}",
                url=shown,
            )
        if mechanism.upper() not in KAFKA_MECHANISMS:
            raise ConfigurationError(
                f"Kafka URL {redact(url)!r}: mechanism must be one of "
                f"{', '.join(KAFKA_MECHANISMS)}, got {mechanism!r}",
                url=redact(url),
            )
        config = {
            "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism.upper(),
            "sasl.username": unquote(user),
            "sasl.password": unquote(password),
        }
        remember_secrets(config)
    elif tls:
        config = {"security.protocol": "SSL"}
    return [",".join(hosts)], {"config": config} if config else {}


def _mqtt(url: str) -> tuple[list[Any], dict[str, Any]]:
    parts = urlsplit(url)
    tls = parts.scheme.lower() == "mqtts"
    implied: dict[str, Any] = {"tls": tls} if tls else {}
    if parts.username:
        implied["username"] = unquote(parts.username)
        implied["password"] = unquote(parts.password) if parts.password else None
    return [parts.hostname or "127.0.0.1", parts.port or (8883 if tls else 1883)], implied


def _file(url: str) -> tuple[list[Any], dict[str, Any]]:
    path = url.partition(":")[2]
    if path.startswith("//"):
        path = urlsplit(url).path
    if not path:
        raise ConfigurationError(
            f"file URL {redact(url)!r} needs a path: file:/var/log/outbox.jsonl"
        )
    return [unquote(path)], {}


def _aws(url: str) -> tuple[list[Any], dict[str, Any]]:
    """``sqs://[REGION][?endpoint=URL][&destination=TEMPLATE]`` (and ``sns://``): the region,
    else AWS's default (``AWS_DEFAULT_REGION``, the profile); ``endpoint`` for a local or
    private endpoint; ``destination`` for the topics ``destinations`` does not map
    (``{topic}.fifo``)."""
    parts = urlsplit(url)
    if parts.username or parts.password or parts.path.strip("/"):
        raise ConfigurationError(
            f"{parts.scheme} URL needs the form {parts.scheme}://[REGION][?endpoint=URL]: "
            "credentials come from AWS's default chain, queues and topics from destinations",
            scheme=parts.scheme,
        )
    implied: dict[str, Any] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        option = {"endpoint": "endpoint_url", "region": "region",
                  "destination": "default_destination"}.get(name)  # fmt: skip
        if option is None or not value:
            raise ConfigurationError(
                f"{parts.scheme} URL option {name!r} is not known or empty (endpoint=URL, "
                "region=NAME, destination=TEMPLATE)",
                option=name,
            )
        implied[option] = value
    region = parts.hostname or implied.pop("region", None)
    return [region], implied


def _none(_url: str) -> tuple[list[Any], dict[str, Any]]:
    return [], {}


_BUILDERS: dict[str, tuple[str, str, Callable[[str], tuple[list[Any], dict[str, Any]]]]] = {
    "nats": ("nats", "NatsPublisher", _nats),
    "amqp": ("rabbitmq", "RabbitMQPublisher", _whole),
    "amqps": ("rabbitmq", "RabbitMQPublisher", _whole),
    "kafka": ("kafka", "KafkaPublisher", _kafka),
    "kafkas": ("kafka", "KafkaPublisher", _kafka),
    "redis": ("redis", "RedisPublisher", _whole),
    "rediss": ("redis", "RedisPublisher", _whole),
    "mqtt": ("mqtt", "MqttPublisher", _mqtt),
    "mqtts": ("mqtt", "MqttPublisher", _mqtt),
    "stdout": ("stdout", "StdoutPublisher", _none),
    "file": ("file", "FilePublisher", _file),
    "memory": ("memory", "MemoryPublisher", _none),
    "amqp1": ("amqp1", "Amqp1Publisher", _whole),
    "amqp1s": ("amqp1", "Amqp1Publisher", _whole),
}
_BUILDERS["sqs"] = ("sqs", "SqsPublisher", _aws)
_BUILDERS["sns"] = ("sqs", "SnsPublisher", _aws)
