"""Broker adapters: one module per broker, SDKs imported lazily; the URL chooses the adapter.

>>> pub = publisher_for_url("nats://127.0.0.1:4222", destinations={"*": "events.{topic}"})

The URL's scheme chooses the broker among the registered ones (:mod:`outbox.brokers`: the
built-in brokers of relay/brokers/plugins.py and any installed plug-in), so :data:`SCHEMES` is
what is installed, not a list kept here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote

from outbox.brokers import plugin_for_scheme
from outbox.brokers import problems as broker_problems
from outbox.brokers import schemes as broker_schemes
from outbox.exceptions import ConfigurationError, MissingDependencyError
from outbox.kit import redact, remember_secrets
from relay.brokers.base import BrokerFeatures, Destinations, Publisher

__all__ = [
    "BrokerFeatures",
    "Destinations",
    "MissingDependencyError",
    "Publisher",
    "publisher_for_url",
    "scheme_text",
]

#: every URL scheme an installed broker serves (the built-in ones first)
SCHEMES: tuple[str, ...] = broker_schemes()


def scheme_text(scheme: str) -> str:
    """``scheme://`` or, for a broker whose URL is a path or nothing, ``scheme:``."""
    plugin = plugin_for_scheme(scheme)
    return f"{scheme}:" if plugin is not None and plugin.opaque else f"{scheme}://"


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
    plugin = plugin_for_scheme(scheme) if ":" in url else None
    if plugin is None:
        left_out = "".join(f"; {p}" for p in broker_problems())
        raise ConfigurationError(
            f"unknown broker URL {redact(url)!r}: use one of "
            + ", ".join(scheme_text(s) for s in broker_schemes())
            + left_out,
            url=redact(url),
        )
    cls = plugin.load("publisher")
    remember_secrets(url, options.get("config"))  # masked wherever a client's error quotes them
    url, allow = _allow_of(url)
    if allow is not None:
        if not _accepts(cls, "allowed_destinations"):
            raise ConfigurationError(
                f"{scheme}: URLs take no allow= (this adapter sends to one place)", url=redact(url)
            )
        options = {"allowed_destinations": allow, **options}
    args, implied = plugin.parse_url(url)
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
