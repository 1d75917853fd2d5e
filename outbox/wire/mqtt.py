"""MQTT 5: payload = body, the envelope headers as user properties, the content type as the
``content_type`` property.

QoS (1, or 0 for at-most-once topics) is the adapter's setting, not part of the mapping.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES
from outbox.envelope import Envelope
from outbox.wire import cloudevents as ce
from outbox.wire._text import bounded, text, total

__all__ = ["MqttMessage", "decode", "encode"]


@dataclass(frozen=True, slots=True)
class MqttMessage:
    """What the relay publishes: a PUBLISH with this payload and these properties."""

    payload: bytes
    user_properties: list[tuple[str, str]]
    content_type: str


def encode(envelope: Envelope, cloudevents: ce.CloudEvents | None = None) -> MqttMessage:
    """The PUBLISH; a CloudEvent (MQTT 5 binding: attributes as user properties by their own
    names, ``datacontenttype`` as the content type) when ``cloudevents`` covers the topic."""
    if cloudevents is not None and cloudevents.applies(envelope.topic):
        if cloudevents.structured:
            return MqttMessage(
                payload=cloudevents.structured_body(envelope),
                user_properties=list(cloudevents.structured_headers(envelope).items()),
                content_type=ce.STRUCTURED_CONTENT_TYPE,
            )
        return MqttMessage(
            payload=envelope.payload,
            user_properties=list(cloudevents.headers(envelope, ce.MQTT).items()),
            content_type=envelope.content_type,
        )
    return MqttMessage(
        payload=envelope.payload,
        user_properties=list(envelope.to_headers().items()),
        content_type=envelope.content_type,
    )


@total
def decode(
    user_properties: Iterable[tuple[str, str]] | None,
    payload: bytes,
    *,
    max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
    content_type: str | None = None,
) -> Envelope:
    """The envelope of a received PUBLISH (its ``UserProperty`` list and payload, and its
    content type property for a CloudEvent); raises
    :class:`~outbox.exceptions.InvalidMessageError` for anything else."""
    decoded = {text(name): text(v) for name, v in bounded(user_properties or [])}
    if ce.detect(decoded, ce.MQTT):
        return ce.decode(decoded, payload, ce.MQTT, max_payload_bytes=max_payload_bytes,
                         content_type=content_type)  # fmt: skip
    return Envelope.from_headers(decoded, payload, max_payload_bytes=max_payload_bytes)
