"""Brokers as plug-ins: what a broker declares, and how the relay and the inbox find it.

A broker is one :class:`BrokerPlugin`: its URL schemes, how a URL becomes the publisher's
arguments, the publisher (the relay's side, :class:`relay.brokers.Publisher`), the consumer
(the inbox's side, a subclass of :class:`inbox.BrokerConsumer`), the wire codec (a module with
``encode`` and ``decode``, like :mod:`outbox.wire.redis`) and, for the contract suite
(:mod:`relay.contract`), a harness that reads back what was published. What differs between
brokers is declared by each publisher as its :class:`BrokerFeatures` (``publisher.features``).

Every broker, the built-in ones included, registers through the entry-point group
``outbox_inbox.brokers`` (:data:`ENTRY_POINT_GROUP`): a name, and the ``module:attribute`` of
its BrokerPlugin. A package outside this repository adds a broker by declaring one in its own
``pyproject.toml``::

    [project.entry-points."outbox_inbox.brokers"]
    redis-list = "outbox_redis_list:PLUGIN"

The plug-in's parts are named by ``module:attribute`` strings and imported only when used, so
this module (the ground floor) names the relay's and the inbox's classes without importing
them, and a broker's client library is imported only by the process that uses that broker.

A plug-in that fails to load, is not a BrokerPlugin, or claims a scheme another plug-in claims
is left out with one warning line naming it (:func:`problems`); the other brokers work. A
built-in broker keeps its schemes over a third party's claim; two third parties claiming one
scheme both lose it, and a URL of that scheme is refused naming both.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from outbox.exceptions import ConfigurationError

__all__ = [
    "BUILT_IN",
    "ENTRY_POINT_GROUP",
    "BrokerFeatures",
    "BrokerPlugin",
    "UrlParser",
    "plugin_for_scheme",
    "plugins",
    "problems",
    "schemes",
]

#: the entry-point group every broker registers in
ENTRY_POINT_GROUP = "outbox_inbox.brokers"
#: the distribution whose brokers are the built-in ones
BUILT_IN = "outbox-inbox"

_log = logging.getLogger("outbox.brokers")

#: ``url -> (positional arguments, keyword options)`` of the publisher
UrlParser = Callable[[str], tuple[list[Any], dict[str, Any]]]


@dataclass(frozen=True)
class BrokerFeatures:
    """What differs between brokers, so the relay, the contract suite and the docs need not
    guess. Each publisher declares its own as ``features``."""

    name: str
    #: the broker drops a re-sent message with the same id within a window (seconds), or 0
    dedup_window_seconds: float
    #: the broker keeps the order of messages of one key as published
    keeps_key_order: bool
    #: user headers travel with the message
    headers: bool
    #: largest body the broker accepts by default, in bytes (0: unknown)
    max_payload_bytes: int
    #: the adapter's ``timeout``: how long it (and its client) may keep a message it was given
    #: before reporting it failed, in seconds; None when it keeps nothing (memory, stdout, file).
    #: The relay refuses to start unless this is shorter than its publish budget: a message the
    #: client still holds after the relay gave up on it could reach the broker after the key's
    #: later rows, published meanwhile by another relay.
    ack_timeout_seconds: float | None = None


@dataclass(frozen=True)
class BrokerPlugin:
    """One broker: the registration a plug-in's entry point names.

    The parts are ``"module:attribute"`` strings (``codec`` a module), imported when used:

    * ``publisher``: a class (or factory) building a :class:`relay.brokers.Publisher` from the
      URL parser's positional arguments and keyword-only options (``destinations``,
      ``timeout``, ... : its keyword-only parameters are the broker's settings);
    * ``url_parser``: ``url -> (args, options)`` (:data:`UrlParser`); None passes the whole
      URL as the one positional argument;
    * ``consumer``: a subclass of :class:`inbox.BrokerConsumer` implementing ``_consume``;
    * ``codec``: a module with ``encode(envelope, ...)`` and ``decode(...)`` (the wire format,
      shared by both sides);
    * ``harness``: a :class:`relay.contract.Harness` subclass for the contract suite.
    """

    name: str
    schemes: tuple[str, ...]
    publisher: str
    codec: str | None = None
    consumer: str | None = None
    url_parser: str | None = None
    harness: str | None = None
    #: the URL is written ``scheme:...`` (a path or nothing), not ``scheme://host``
    opaque: bool = False
    #: shown in ``outbox relay --help`` (False: the tests' in-memory broker)
    listed: bool = True
    #: the distribution that registered it (filled in by discovery)
    distribution: str = field(default="", compare=False)

    def load(self, part: str) -> Any:
        """The object ``part`` (``"publisher"``, ``"consumer"``, ...) names, imported now."""
        ref = getattr(self, part)
        if not ref:
            raise ConfigurationError(f"broker plug-in {self.name!r} declares no {part}")
        module, _, attribute = ref.partition(":")
        try:
            loaded = importlib.import_module(module)
            return getattr(loaded, attribute) if attribute else loaded
        except ConfigurationError:
            raise  # a MissingDependencyError names its extra
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(
                f"broker plug-in {self.name!r} ({self.distribution or '?'}): its {part} "
                f"{ref!r} cannot be loaded: {type(exc).__name__}: {exc}",
                plugin=self.name,
            ) from None

    def parse_url(self, url: str) -> tuple[list[Any], dict[str, Any]]:
        """The publisher's positional arguments and implied options for ``url``."""
        if self.url_parser is None:
            return [url], {}
        parser: UrlParser = self.load("url_parser")
        return parser(url)


@dataclass
class _Registry:
    by_scheme: dict[str, BrokerPlugin]
    by_name: dict[str, BrokerPlugin]
    problems: list[str]
    #: scheme -> the plug-ins that claimed it (third parties, refused)
    contested: dict[str, list[str]]


def _distribution(point: EntryPoint) -> str:
    name = point.dist.name if point.dist is not None else "?"
    return name.replace("_", "-").lower()


def _loaded(point: EntryPoint) -> BrokerPlugin | str:
    """The plug-in an entry point names, or the one-line problem."""
    dist = _distribution(point)
    where = f"broker plug-in {point.name!r} ({dist}, {point.value})"
    try:
        plugin = point.load()
    except Exception as exc:  # a third party's import may fail in any way
        return f"{where} failed to load: {type(exc).__name__}: {exc}"
    if not isinstance(plugin, BrokerPlugin):
        return f"{where} is a {type(plugin).__name__}, not an outbox.brokers.BrokerPlugin"
    if not plugin.schemes or not all(isinstance(s, str) and s for s in plugin.schemes):
        return f"{where} declares no URL scheme"
    return BrokerPlugin(**{**plugin.__dict__, "distribution": dist})


def _register(registry: _Registry, plugin: BrokerPlugin) -> None:
    builtin = plugin.distribution == BUILT_IN
    for scheme in (s.lower() for s in plugin.schemes):
        holder = registry.by_scheme.get(scheme)
        if scheme in registry.contested:
            registry.contested[scheme].append(plugin.name)
        elif holder is None:
            registry.by_scheme[scheme] = plugin
            continue
        elif holder.distribution == BUILT_IN and not builtin:
            registry.problems.append(
                f"broker plug-in {plugin.name!r} ({plugin.distribution}) claims scheme "
                f"{scheme!r}, a built-in broker's ({holder.name}); its claim is ignored"
            )
            continue
        else:
            del registry.by_scheme[scheme]
            registry.contested[scheme] = [holder.name, plugin.name]
        registry.problems.append(
            f"broker plug-ins {' and '.join(map(repr, registry.contested[scheme]))} both "
            f"claim scheme {scheme!r}; neither is used for it (uninstall one)"
        )


def _discover(points: Iterable[EntryPoint]) -> _Registry:
    registry = _Registry({}, {}, [], {})
    loaded: list[BrokerPlugin] = []
    for point in sorted(points, key=lambda p: _distribution(p) != BUILT_IN):  # stable
        plugin = _loaded(point)
        if isinstance(plugin, str):
            registry.problems.append(plugin)
        elif plugin.name in registry.by_name:
            registry.problems.append(
                f"broker plug-in {plugin.name!r} ({plugin.distribution}) is registered twice; "
                "the second is ignored"
            )
        else:
            registry.by_name[plugin.name] = plugin
            loaded.append(plugin)
    for plugin in loaded:
        _register(registry, plugin)
    for problem in registry.problems:
        _log.warning("%s", problem)
    return registry


@cache
def _registry() -> _Registry:
    return _discover(entry_points(group=ENTRY_POINT_GROUP))


def plugins() -> dict[str, BrokerPlugin]:
    """Every broker that loaded, by its name (built-in ones first)."""
    return dict(_registry().by_name)


def schemes() -> tuple[str, ...]:
    """Every URL scheme a broker serves, built-in brokers' first, in registration order."""
    return tuple(_registry().by_scheme)


def problems() -> list[str]:
    """One line per plug-in left out (failed to load, not a BrokerPlugin, a contested scheme)."""
    return list(_registry().problems)


def plugin_for_scheme(scheme: str) -> BrokerPlugin | None:
    """The broker serving ``scheme``; None for a scheme nobody serves. A scheme two plug-ins
    claim raises ConfigurationError naming both."""
    scheme = scheme.lower()
    registry = _registry()
    contested = registry.contested.get(scheme)
    if contested:
        raise ConfigurationError(
            f"broker URL scheme {scheme!r} is claimed by the plug-ins "
            f"{' and '.join(map(repr, contested))}: uninstall one of them",
            scheme=scheme,
        )
    return registry.by_scheme.get(scheme)
