"""The contract every broker adapter fulfils, and how the envelope maps onto each broker.

How an envelope maps onto each broker's message (headers, id, key, content type, trace
context) is :mod:`outbox.wire`, one module per broker that the inbox's consumers decode with;
adapters send exactly what ``outbox.wire.<broker>.encode`` returns. What is the adapter's is
the delivery: NATS waits for the PubAck; RabbitMQ uses publisher confirms, persistent delivery
and ``mandatory=True`` (an unroutable message is a PermanentPublishError, never dropped);
Kafka runs an idempotent producer with ``acks=all``; Redis appends with one pipelined round trip;
MQTT publishes at QoS 1 (QoS 0 for at-most-once topics).

The destination of an envelope is chosen by :class:`Destinations` (topic -> destination).
"""

from __future__ import annotations

import fnmatch
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from outbox.kit import check_partitions, partition_for, topic_problem
from relay.exceptions import DestinationRefusedError

__all__ = [
    "DEFAULT_ACK_TIMEOUT",
    "RESERVED_DESTINATIONS",
    "BrokerFeatures",
    "Destinations",
    "Publisher",
    "glob_matches",
    "mqtt_topic_matches",
    "nats_subject_matches",
]

WILDCARD = "*"

#: every adapter's default ``timeout`` (seconds): shorter than the relay's default
#: publish_timeout (10 s), with room for the rest of the batch (claim, mark)
DEFAULT_ACK_TIMEOUT = 8.0


#: Per broker, prefixes of its own addresses (API subjects, system topics, internal topics,
#: reserved exchanges). A destination whose start comes from the topic (no ``"*"`` template,
#: or one that starts with ``{topic}``) is refused when it starts with one. A template's own
#: text (``amq.topic/{topic}``) and an exact entry of ``destinations`` are the operator's and
#: may name anything.
RESERVED_DESTINATIONS: dict[str, tuple[str, ...]] = {
    "nats": ("$", "_INBOX", "_R_"),
    "mqtt": ("$",),
    "kafka": ("__", "_confluent", "_schemas"),
    "rabbitmq": ("amq.",),
    "amqp1": ("$", "amq.", "/"),
    "redis": ("__",),
}

#: Per broker, the characters that would make a topic used as its destination name an address
#: of the broker's rather than a name (RabbitMQ: ``exchange/routing_key``).
ADDRESS_SEPARATORS: dict[str, str] = {"rabbitmq": "/"}


def glob_matches(pattern: str, name: str) -> bool:
    """Shell-style matching (``orders-*``), case-sensitive."""
    return fnmatch.fnmatchcase(name, pattern)


def mqtt_topic_matches(pattern: str, topic: str) -> bool:
    """MQTT filter matching: ``+`` is one level, a final ``#`` any number of levels."""
    want, have = pattern.split("/"), topic.split("/")
    for i, level in enumerate(want):
        if level == "#" and i == len(want) - 1:
            return True
        if i >= len(have) or (level != "+" and level != have[i]):
            return False
    return len(want) == len(have)


def nats_subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` is one token, a final ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, part in enumerate(want):
        if part == ">" and i == len(want) - 1:
            return len(have) > i
        if i >= len(have) or (part != "*" and part != have[i]):
            return False
    return len(want) == len(have)


class Destinations:
    """Maps an outbox topic to a broker destination (subject, stream, exchange/routing key...).

    Look-up order: an exact entry for the topic; else the ``"*"`` entry, a template in which
    ``{topic}`` is replaced by the topic (``{"*": "events.{topic}"}``); else the topic itself.

    Partitions: ``partitions`` maps a topic (or ``"*"``, every other topic) to a partition
    count; a destination (template or exact entry) may then hold ``{partition}``, replaced by
    :func:`outbox.partition_for` of the message's key: the relay computes it, a producer
    cannot choose it. A ``{partition}`` destination needs a count for its topic (checked
    here, at start), and a topic given a count needs ``{partition}`` in its destination.

    A topic is a name, never an address (docs/explanation/security.md): every topic must
    follow the grammar of ``outbox._topic`` (rows written by older writers, or inserted
    directly, are checked here), and a destination made by the default mapping must not start
    with one of ``reserved`` (the broker's own prefixes, :data:`RESERVED_DESTINATIONS`) and,
    when ``allow`` is given, must match one of its patterns (``matches(pattern, destination)``,
    shell-style globs unless the broker has its own wildcards). Otherwise the call raises
    DestinationRefusedError: the relay pauses that topic, nothing is sent.
    """

    __slots__ = (
        "_allow",
        "_default",
        "_exact",
        "_matches",
        "_partitions",
        "_reserved",
        "_separators",
    )

    def __init__(
        self,
        mapping: Mapping[str, str] | None = None,
        *,
        broker: str | None = None,
        allow: Sequence[str] | None = None,
        matches: Callable[[str, str], bool] | None = None,
        partitions: Mapping[str, int] | None = None,
    ) -> None:
        mapping = dict(mapping or {})
        for topic, dest in mapping.items():
            if not isinstance(dest, str) or not dest:
                raise ConfigurationError(
                    f"destination for topic {topic!r} must be a non-empty string, got {dest!r}",
                    topic=topic,
                )
        self._partitions = check_partition_counts(partitions)
        default = mapping.pop(WILDCARD, None)
        if default is not None:
            _check_template(default, "the '*' destination template", {"topic", "partition"})
        for topic, dest in mapping.items():
            if "{" in dest or "}" in dest:
                _check_template(dest, f"the destination of topic {topic!r}", {"partition"})
        _check_partitioned(mapping, default, self._partitions)
        if allow is not None and (
            isinstance(allow, str) or not all(isinstance(p, str) and p for p in allow)
        ):
            raise ConfigurationError(
                f"allowed_destinations must be a list of non-empty patterns, got {allow!r}",
                allow=allow,
            )
        self._exact = mapping
        self._default = default
        topic_first = default is None or default.startswith("{topic")
        self._reserved = RESERVED_DESTINATIONS.get(broker or "", ()) if topic_first else ()
        self._separators = ADDRESS_SEPARATORS.get(broker or "", "") if topic_first else ""
        self._allow = tuple(allow) if allow is not None else None
        self._matches = matches or glob_matches

    def partitions_of(self, topic: str) -> int | None:
        """The partition count of ``topic``'s destination, or None when it is not split."""
        return self._partitions.get(topic, self._partitions.get(WILDCARD))

    def __call__(self, topic: str, key: str | None = None) -> str:
        """The destination of a message of ``topic`` and ``key`` (the key is needed only by a
        partitioned topic; without it, partition 0's destination is given)."""
        problem = topic_problem(topic)
        if problem is not None:
            reason = f"{problem}; not sent"
            raise DestinationRefusedError(reason, reason=reason, destination=None)
        count = self.partitions_of(topic)
        partition = 0 if count is None or key is None else partition_for(key, count)
        return self.partition(topic, partition)

    def partition(self, topic: str, partition: int) -> str:
        """The destination of ``topic``'s partition ``partition`` (``relay check`` lists them)."""
        dest = self._exact.get(topic)
        if dest is not None:
            return dest.format(partition=partition) if "{" in dest else dest
        if self._default is None:
            dest = topic
        else:  # a checked template: only {topic} and {partition}
            dest = self._default.format(topic=topic, partition=partition)
        refusal = self._refusal(topic, dest)
        if refusal is not None:
            raise DestinationRefusedError(refusal, reason=refusal, destination=dest)
        return dest

    def _refusal(self, topic: str, dest: str) -> str | None:
        for char in self._separators:
            if char in topic:
                return (
                    f"topic {topic!r} holds {char!r}, which would make it a broker address "
                    f"({dest!r}); not sent (map the topic to a destination in destinations)"
                )
        for prefix in self._reserved:
            if dest.startswith(prefix):
                return (
                    f"destination {dest!r} starts with {prefix!r}, which the broker keeps for "
                    "itself; not sent (map the topic to a destination in destinations)"
                )
        if self._allow is not None and not any(self._matches(p, dest) for p in self._allow):
            return (
                f"destination {dest!r} is not among the allowed destinations "
                f"({', '.join(self._allow)}); not sent (map the topic in destinations, or "
                "widen allowed_destinations)"
            )
        return None

    def __repr__(self) -> str:
        extra = {WILDCARD: self._default} if self._default is not None else {}
        parts = f", partitions={dict(self._partitions)!r}" if self._partitions else ""
        return f"Destinations({ {**self._exact, **extra}!r}{parts})"


def check_partition_counts(partitions: Mapping[str, int] | None) -> dict[str, int]:
    """``partitions`` (topic or "*" -> count) checked: each count 1..MAX_PARTITIONS."""
    if partitions is None:
        return {}
    if not isinstance(partitions, Mapping):
        raise ConfigurationError(
            f"partitions must be a table of topic = count, got {partitions!r}"
        )
    return {
        str(topic): check_partitions(count, f"the partition count of {topic!r}")
        for topic, count in partitions.items()
    }


def _check_template(template: str, what: str, allowed: set[str]) -> None:
    """Only ``allowed`` plain fields (no attribute, index, conversion or format spec)."""
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as exc:
        raise ConfigurationError(
            f"{what} {template!r} is not a template: {exc}", template=template
        ) from None
    if any(name not in allowed or spec or conv for name, spec, conv in fields):
        names = " and ".join(f"{{{n}}}" for n in sorted(allowed, reverse=True))
        raise ConfigurationError(f"{what} {template!r} may only use {names}", template=template)


def _check_partitioned(
    exact: Mapping[str, str], default: str | None, partitions: Mapping[str, int]
) -> None:
    """A ``{partition}`` destination has a count; a count has a ``{partition}`` destination."""
    star = partitions.get(WILDCARD)
    for topic, dest in exact.items():
        has = "{partition}" in dest
        if has and topic not in partitions and star is None:
            raise ConfigurationError(
                f"the destination of topic {topic!r} ({dest!r}) holds {{partition}} but the "
                f"topic has no partition count: add {topic} = N to [broker.partitions]",
                topic=topic,
            )
        if not has and topic in partitions:
            raise ConfigurationError(
                f"topic {topic!r} has {partitions[topic]} partitions but its destination "
                f"{dest!r} has no {{partition}} placeholder",
                topic=topic,
            )
    default_has = default is not None and "{partition}" in default
    if default_has and star is None:
        raise ConfigurationError(
            f"the '*' destination template {default!r} holds {{partition}}: give the other "
            'topics a partition count too ("*" = N in [broker.partitions])'
        )
    for topic in partitions:
        if topic not in exact and not default_has:
            raise ConfigurationError(
                f"topic {topic!r} has a partition count but its destination (the '*' template "
                f"{default!r}) has no {{partition}} placeholder"
                if default is not None
                else f"topic {topic!r} has a partition count but no destination with "
                "{partition} (e.g. \"*\" = \"events.{topic}.p{partition}\")",
                topic=topic,
            )


@dataclass(frozen=True)
class BrokerFeatures:
    """What differs between brokers, so the relay and the docs need not guess."""

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


@runtime_checkable
class Publisher(Protocol):
    """A broker adapter.

    Contract:
    * ``start`` connects; it may be called again after ``close``.
    * ``publish_batch`` sends every envelope (to its destination, see :class:`Destinations`)
      with as many in flight as the broker allows, *keeping the given order for envelopes of
      the same key*, and waits for the broker's acknowledgement of each. It returns one entry
      per envelope, in input order: ``None`` when the broker confirmed it, else the exception
      (:class:`~relay.exceptions.RetryablePublishError` when it may succeed later — timeouts,
      connection loss, a nack — or :class:`~relay.exceptions.PermanentPublishError` when it
      never will — too large, unroutable, rejected). It does not raise for a single message;
      it raises RetryablePublishError only when nothing could be attempted (not connected).
    * Re-sending an envelope (same id) is always allowed: the relay is at-least-once.
    * ``close`` flushes and disconnects; idempotent.
    """

    features: BrokerFeatures

    async def start(self) -> None: ...

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]: ...

    async def close(self) -> None: ...
