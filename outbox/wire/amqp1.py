"""AMQP 1.0 (Azure Service Bus, ActiveMQ Artemis, Solace, Qpid, RabbitMQ's plugin): the
envelope headers as application-properties, body = one data section holding the payload.

The message's standard properties carry what a broker or another client reads natively:

* ``message-id`` = the outbox id (text: Service Bus's ``MessageId``, its duplicate detection
  key);
* ``group-id`` = the outbox key (Service Bus's ``SessionId``: its sessions are ordered groups);
* ``group-sequence`` = the outbox seq while it fits AMQP's 32-bit sequence number (it is
  omitted above; ``outbox-seq`` always holds it);
* ``subject`` = the outbox topic; ``content-type`` = the envelope's (when it is ASCII, as
  AMQP's symbol type requires; the ``content-type`` application property always holds it).

The inbox reads the envelope from the application-properties alone, so a broker that rewrites
or drops a standard property changes nothing. Durability (the header's ``durable``) is the
adapter's setting, not part of the mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError

__all__ = ["MAX_GROUP_SEQUENCE", "Amqp1Message", "decode", "encode"]

#: AMQP's sequence-no is a 32-bit unsigned integer
MAX_GROUP_SEQUENCE = 2**32 - 1
#: application-properties a decoder reads: the envelope's own, 64 user headers, a few a broker
#: adds; more is not an outbox message and is refused before any value is converted
MAX_PROPERTIES = 80
#: longest property name or value, in characters or bytes
MAX_PROPERTY_LENGTH = 16 * 1024


@dataclass(frozen=True, slots=True)
class Amqp1Message:
    """What the relay sends: a message with these properties, application-properties and body
    (a single data section)."""

    body: bytes
    message_id: str
    group_id: str
    group_sequence: int | None
    subject: str
    content_type: str | None
    properties: dict[str, str]


def encode(envelope: Envelope) -> Amqp1Message:
    seq = envelope.seq
    ctype = envelope.content_type
    return Amqp1Message(
        body=envelope.payload,
        message_id=str(envelope.id),
        group_id=envelope.key,
        group_sequence=seq if 0 <= seq <= MAX_GROUP_SEQUENCE else None,
        subject=envelope.topic,
        content_type=ctype if ctype.isascii() else None,
        properties=envelope.to_headers(),
    )


def decode(properties: object, body: object) -> Envelope:
    """The envelope of a received message (its ``properties`` — proton's name for the
    application-properties map — and its ``body``); raises
    :class:`~outbox.exceptions.InvalidMessageError` for anything else.

    The body must be binary (one data section; proton hands it over as bytes or a memoryview);
    an ``amqp-value`` or ``amqp-sequence`` body is not one the relay sends. Property values that
    are not text (numbers, binary) are read as text; nested maps and lists are refused.
    """
    if body is None:
        payload = b""
    elif isinstance(body, bytes | bytearray | memoryview):
        payload = bytes(body)
    else:
        raise InvalidMessageError(
            f"AMQP message body is an {type(body).__name__}, not a data section: it was not "
            "published by the outbox relay",
            reason="bad_format",
        )
    if properties is None:
        properties = {}
    if not isinstance(properties, Mapping):
        raise InvalidMessageError("AMQP application-properties is not a map", reason="bad_format")
    if len(properties) > MAX_PROPERTIES:  # before any value is converted
        raise InvalidMessageError(
            f"AMQP message has {len(properties)} application-properties, above the maximum of "
            f"{MAX_PROPERTIES}: it was not published by the outbox relay",
            reason="too_many_headers",
        )
    headers: dict[str, str] = {}
    for name, value in properties.items():
        headers[_text(name)] = _text(value)
    return Envelope.from_headers(headers, payload)


def _text(value: object) -> str:
    """A property name or value as text; bounded before it is converted."""
    if isinstance(value, str):  # proton's symbol and string are both str
        if len(value) > MAX_PROPERTY_LENGTH:
            raise _too_long(len(value))
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        if len(value) > MAX_PROPERTY_LENGTH:
            raise _too_long(len(value))
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidMessageError(
                "AMQP application-property is binary that is not UTF-8 text", reason="not_utf8"
            ) from exc
    if isinstance(value, bool | int | float):
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            raise InvalidMessageError("AMQP application-property out of range", reason="bad_format")
        return str(value)
    raise InvalidMessageError(
        f"AMQP application-property of type {type(value).__name__}: the outbox sends text only",
        reason="bad_format",
    )


def _too_long(length: int) -> InvalidMessageError:
    return InvalidMessageError(
        f"AMQP application-property of {length} characters or bytes, above the maximum of "
        f"{MAX_PROPERTY_LENGTH}",
        reason="bad_header",
    )
