"""Broker message -> Envelope, exactly inverting the relay's wire mapping.

The mapping is written down in ``relay/brokers/base.py`` (body = payload; envelope headers from
``Envelope.to_headers()`` as the broker's headers/properties/fields). Each decoder is pure, so
it is tested without a broker; a message lacking the outbox headers raises
:class:`~outbox.InvalidMessageError` naming what is missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from outbox.envelope import Envelope

__all__ = [
    "REDIS_PAYLOAD_FIELD",
    "decode_kafka",
    "decode_mqtt",
    "decode_nats",
    "decode_rabbitmq",
    "decode_redis",
]

#: The Redis Streams field holding the body; every other field is a header.
REDIS_PAYLOAD_FIELD = "payload"


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    return str(value)


def decode_nats(headers: Mapping[str, str] | None, data: bytes) -> Envelope:
    """JetStream: envelope headers (plus ``Nats-Msg-Id``, a user header here) and the body."""
    return Envelope.from_headers(dict(headers or {}), data)


def decode_rabbitmq(headers: Mapping[str, Any] | None, body: bytes) -> Envelope:
    """RabbitMQ: the ``headers`` table (values may arrive as bytes) and the body."""
    return Envelope.from_headers({k: _text(v) for k, v in (headers or {}).items()}, body)


def decode_kafka(
    headers: Iterable[tuple[str, bytes | None]] | None, value: bytes | None
) -> Envelope:
    """Kafka: record headers as UTF-8 bytes, the value is the body."""
    decoded = {k: _text(v) for k, v in (headers or []) if v is not None}
    return Envelope.from_headers(decoded, value or b"")


def decode_redis(fields: Mapping[Any, Any]) -> Envelope:
    """Redis Streams: every field except ``payload`` is a header."""
    headers: dict[str, str] = {}
    payload = b""
    for name, value in fields.items():
        key = _text(name)
        if key == REDIS_PAYLOAD_FIELD:
            payload = value if isinstance(value, bytes) else _text(value).encode()
        else:
            headers[key] = _text(value)
    return Envelope.from_headers(headers, payload)


def decode_mqtt(user_properties: Iterable[tuple[str, str]] | None, payload: bytes) -> Envelope:
    """MQTT 5: envelope headers as user properties, the payload is the body."""
    return Envelope.from_headers(dict(user_properties or []), payload)
