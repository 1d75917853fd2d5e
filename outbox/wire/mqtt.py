"""MQTT 5: payload = body, the envelope headers as user properties, the content type as the
``content_type`` property.

QoS (1, or 0 for at-most-once topics) is the adapter's setting, not part of the mapping.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES
from outbox.envelope import Envelope
from outbox.wire._text import bounded, text, total

__all__ = ["MqttMessage", "decode", "encode"]


@dataclass(frozen=True, slots=True)
class MqttMessage:
    """What the relay publishes: a PUBLISH with this payload and these properties."""

    payload: bytes
    user_properties: list[tuple[str, str]]
    content_type: str


def encode(envelope: Envelope) -> MqttMessage:
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
) -> Envelope:
    """The envelope of a received PUBLISH (its ``UserProperty`` list and payload); raises
    :class:`~outbox.exceptions.InvalidMessageError` for anything else."""
    decoded = {text(name): text(v) for name, v in bounded(user_properties or [])}
    return Envelope.from_headers(decoded, payload, max_payload_bytes=max_payload_bytes)
