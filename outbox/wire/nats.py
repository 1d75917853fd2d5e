"""NATS JetStream: the envelope headers plus ``Nats-Msg-Id`` (JetStream's dedup), body = payload.

JetStream drops a message whose ``Nats-Msg-Id`` it has seen within the stream's duplicate
window, so a re-sent message (same outbox id) is stored once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES
from outbox.envelope import HEADER_ID, HEADER_REPLAY, Envelope
from outbox.wire import cloudevents as ce
from outbox.wire._text import total

__all__ = ["MSG_ID_HEADER", "NatsMessage", "decode", "encode"]

#: JetStream's dedup header; it carries the outbox id.
MSG_ID_HEADER = "Nats-Msg-Id"


@dataclass(frozen=True, slots=True)
class NatsMessage:
    """What the relay publishes: ``js.publish(subject, data, headers=headers)``."""

    headers: dict[str, str]
    data: bytes


def encode(envelope: Envelope, cloudevents: ce.CloudEvents | None = None) -> NatsMessage:
    """The message; a CloudEvent (NATS binding: ``ce-`` headers) when ``cloudevents`` covers
    the topic."""
    if cloudevents is not None and cloudevents.applies(envelope.topic):
        if cloudevents.structured:
            event = cloudevents.structured_headers(envelope)
            event[MSG_ID_HEADER] = str(envelope.id)
            return NatsMessage(headers=event, data=cloudevents.structured_body(envelope))
        event = cloudevents.headers(envelope, ce.HTTP_LIKE)
        event[MSG_ID_HEADER] = str(envelope.id)
        return NatsMessage(headers=event, data=envelope.payload)
    headers = envelope.to_headers()
    headers[MSG_ID_HEADER] = headers[HEADER_ID]  # the id's text, made once
    replay = headers.get(HEADER_REPLAY)
    if replay:  # outbox replay: not a duplicate of the original within the stream's window
        headers[MSG_ID_HEADER] += f":{replay}"
    return NatsMessage(headers=headers, data=envelope.payload)


@total
def decode(
    headers: Mapping[str, str] | None,
    data: bytes,
    *,
    max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
) -> Envelope:
    """The envelope of a received message (``msg.headers``, ``msg.data``); raises
    :class:`~outbox.exceptions.InvalidMessageError` for anything else.

    ``Nats-Msg-Id`` is JetStream's and is not returned as a user header.
    """
    headers = headers or {}
    if ce.detect(headers, ce.HTTP_LIKE):
        return ce.decode(headers, data, ce.HTTP_LIKE, max_payload_bytes=max_payload_bytes)
    return Envelope.from_headers(headers, data, max_payload_bytes=max_payload_bytes)
