"""How each built-in broker's URL becomes its publisher's arguments: ``url -> (positional
arguments, implied options)``, named by the brokers' registrations (relay/brokers/plugins.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from outbox.exceptions import ConfigurationError
from outbox.kit import redact, remember_secrets

__all__ = [
    "KAFKA_MECHANISMS",
    "aws_url",
    "file_url",
    "kafka_url",
    "mqtt_url",
    "nats_url",
    "no_arguments",
    "whole_url",
]


def whole_url(url: str) -> tuple[list[Any], dict[str, Any]]:
    return [url], {}


def nats_url(url: str) -> tuple[list[Any], dict[str, Any]]:
    return [[u.strip() for u in url.split(",") if u.strip()]], {}


#: SASL mechanisms librdkafka accepts with a user name and a password
KAFKA_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def kafka_url(url: str) -> tuple[list[Any], dict[str, Any]]:
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


def mqtt_url(url: str) -> tuple[list[Any], dict[str, Any]]:
    parts = urlsplit(url)
    tls = parts.scheme.lower() == "mqtts"
    implied: dict[str, Any] = {"tls": tls} if tls else {}
    if parts.username:
        implied["username"] = unquote(parts.username)
        implied["password"] = unquote(parts.password) if parts.password else None
    return [parts.hostname or "127.0.0.1", parts.port or (8883 if tls else 1883)], implied


def file_url(url: str) -> tuple[list[Any], dict[str, Any]]:
    path = url.partition(":")[2]
    if path.startswith("//"):
        path = urlsplit(url).path
    if not path:
        raise ConfigurationError(
            f"file URL {redact(url)!r} needs a path: file:/var/log/outbox.jsonl"
        )
    return [unquote(path)], {}


def aws_url(url: str) -> tuple[list[Any], dict[str, Any]]:
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


def no_arguments(_url: str) -> tuple[list[Any], dict[str, Any]]:
    return [], {}
