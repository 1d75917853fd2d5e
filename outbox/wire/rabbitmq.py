"""RabbitMQ: the envelope headers as the ``headers`` table, ``message_id`` = the outbox id,
``content_type`` = the envelope's, body = payload.

Delivery mode (persistent by default) and ``mandatory`` are the adapter's settings, not part of
the message's mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES, MAX_RECEIVED_HEADERS
from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.wire import cloudevents as ce
from outbox.wire._text import text, total

__all__ = ["RabbitMessage", "decode", "encode"]


@dataclass(frozen=True, slots=True)
class RabbitMessage:
    """What the relay publishes: a message with these properties and this body."""

    body: bytes
    message_id: str
    content_type: str
    headers: dict[str, str]


def encode(envelope: Envelope, cloudevents: ce.CloudEvents | None = None) -> RabbitMessage:
    """The message; a CloudEvent (RabbitMQ binding: ``ce-`` headers, the ``content_type``
    property) when ``cloudevents`` covers the topic."""
    if cloudevents is not None and cloudevents.applies(envelope.topic):
        if cloudevents.structured:
            return RabbitMessage(
                body=cloudevents.structured_body(envelope),
                message_id=str(envelope.id),
                content_type=ce.STRUCTURED_CONTENT_TYPE,
                headers=cloudevents.structured_headers(envelope),
            )
        return RabbitMessage(
            body=envelope.payload,
            message_id=str(envelope.id),
            content_type=envelope.content_type,
            headers=cloudevents.headers(envelope, ce.RABBITMQ),
        )
    return RabbitMessage(
        body=envelope.payload,
        message_id=str(envelope.id),
        content_type=envelope.content_type,
        headers=envelope.to_headers(),
    )


@total
def decode(
    headers: Mapping[str, object] | None,
    body: bytes,
    *,
    max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
    content_type: str | None = None,
) -> Envelope:
    """The envelope of a received message (``message.headers``, ``message.body``, and
    ``message.content_type`` for a CloudEvent); raises
    :class:`~outbox.exceptions.InvalidMessageError` for anything else.

    Header values may come back as bytes (AMQP long strings); they are read as UTF-8.
    """
    table = headers or {}
    if len(table) > MAX_RECEIVED_HEADERS:  # before any value is converted
        raise InvalidMessageError(
            f"broker message has {len(table)} headers, above the maximum of "
            f"{MAX_RECEIVED_HEADERS}: it was not published by the outbox relay",
            reason="too_many_headers",
        )
    decoded = {text(k): text(v) for k, v in table.items()}
    if ce.detect(decoded, ce.RABBITMQ):
        return ce.decode(decoded, body, ce.RABBITMQ, max_payload_bytes=max_payload_bytes,
                         content_type=content_type)  # fmt: skip
    return Envelope.from_headers(decoded, body, max_payload_bytes=max_payload_bytes)
