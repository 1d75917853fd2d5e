"""RabbitMQ: the envelope headers as the ``headers`` table, ``message_id`` = the outbox id,
``content_type`` = the envelope's, body = payload.

Delivery mode (persistent by default) and ``mandatory`` are the adapter's settings, not part of
the message's mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from outbox.envelope import Envelope
from outbox.wire._text import text

__all__ = ["RabbitMessage", "decode", "encode"]


@dataclass(frozen=True, slots=True)
class RabbitMessage:
    """What the relay publishes: a message with these properties and this body."""

    body: bytes
    message_id: str
    content_type: str
    headers: dict[str, str]


def encode(envelope: Envelope) -> RabbitMessage:
    return RabbitMessage(
        body=envelope.payload,
        message_id=str(envelope.id),
        content_type=envelope.content_type,
        headers=envelope.to_headers(),
    )


def decode(headers: Mapping[str, object] | None, body: bytes) -> Envelope:
    """The envelope of a received message (``message.headers``, ``message.body``).

    Header values may come back as bytes (AMQP long strings); they are read as UTF-8.
    """
    return Envelope.from_headers({k: text(v) for k, v in (headers or {}).items()}, body)
