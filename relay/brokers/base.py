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

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError

__all__ = ["DEFAULT_ACK_TIMEOUT", "BrokerFeatures", "Destinations", "Publisher"]

WILDCARD = "*"

#: every adapter's default ``timeout`` (seconds): shorter than the relay's default
#: publish_timeout (10 s), with room for the rest of the batch (claim, mark)
DEFAULT_ACK_TIMEOUT = 8.0


class Destinations:
    """Maps an outbox topic to a broker destination (subject, stream, exchange/routing key...).

    Look-up order: an exact entry for the topic; else the ``"*"`` entry, a template in which
    ``{topic}`` is replaced by the topic (``{"*": "events.{topic}"}``); else the topic itself.
    """

    __slots__ = ("_default", "_exact")

    def __init__(self, mapping: Mapping[str, str] | None = None) -> None:
        mapping = dict(mapping or {})
        for topic, dest in mapping.items():
            if not isinstance(dest, str) or not dest:
                raise ConfigurationError(
                    f"destination for topic {topic!r} must be a non-empty string, got {dest!r}",
                    topic=topic,
                )
        default = mapping.pop(WILDCARD, None)
        if default is not None:
            fields = {f for _, f, _, _ in string.Formatter().parse(default) if f is not None}
            if fields - {"topic"}:
                raise ConfigurationError(
                    f"the '*' destination template {default!r} may only use {{topic}}",
                    template=default,
                )
        self._exact = mapping
        self._default = default

    def __call__(self, topic: str) -> str:
        dest = self._exact.get(topic)
        if dest is not None:
            return dest
        if self._default is not None:
            return self._default.format(topic=topic)
        return topic

    def __repr__(self) -> str:
        extra = {WILDCARD: self._default} if self._default is not None else {}
        return f"Destinations({ {**self._exact, **extra}!r})"


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
