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

from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES, MAX_HEADER_VALUE_BYTES, MAX_RECEIVED_HEADERS
from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.wire import cloudevents as ce
from outbox.wire._text import total

__all__ = ["MAX_GROUP_SEQUENCE", "Amqp1Message", "decode", "encode"]

#: AMQP's sequence-no is a 32-bit unsigned integer
MAX_GROUP_SEQUENCE = 2**32 - 1


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


def encode(envelope: Envelope, cloudevents: ce.CloudEvents | None = None) -> Amqp1Message:
    """The message; a CloudEvent (AMQP binding: ``cloudEvents_`` application-properties,
    the ``content-type`` property) when ``cloudevents`` covers the topic."""
    seq = envelope.seq
    ctype = envelope.content_type
    properties: dict[str, str] | None = None
    body = envelope.payload
    if cloudevents is not None and cloudevents.applies(envelope.topic):
        if cloudevents.structured:
            properties = cloudevents.structured_headers(envelope)
            body, ctype = cloudevents.structured_body(envelope), ce.STRUCTURED_CONTENT_TYPE
        else:
            properties = cloudevents.headers(envelope, ce.AMQP)
    return Amqp1Message(
        body=body,
        message_id=str(envelope.id),
        group_id=envelope.key,
        group_sequence=seq if 0 <= seq <= MAX_GROUP_SEQUENCE else None,
        subject=envelope.topic,
        content_type=ctype if ctype.isascii() else None,
        properties=envelope.to_headers() if properties is None else properties,
    )


@total
def decode(
    properties: object,
    body: object,
    *,
    max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
) -> Envelope:
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
    if len(properties) > MAX_RECEIVED_HEADERS:  # before any value is converted
        raise InvalidMessageError(
            f"AMQP message has {len(properties)} application-properties, above the maximum of "
            f"{MAX_RECEIVED_HEADERS}: it was not published by the outbox relay",
            reason="too_many_headers",
        )
    headers = {_text(name): _text(value) for name, value in properties.items()}
    if "cloudEvents:specversion" in headers:  # the binding's other spelling
        headers = {("cloudEvents_" + k[12:] if k.startswith("cloudEvents:") else k): v
                   for k, v in headers.items()}  # fmt: skip
    if ce.detect(headers, ce.AMQP):
        return ce.decode(headers, payload, ce.AMQP, max_payload_bytes=max_payload_bytes)
    return Envelope.from_headers(headers, payload, max_payload_bytes=max_payload_bytes)


def _text(value: object) -> str:
    """A property name or value as text; its size is checked before it is converted."""
    if isinstance(value, str):  # proton's symbol and string are both str
        if len(value) > MAX_HEADER_VALUE_BYTES:
            raise _too_long(len(value))
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        if len(value) > MAX_HEADER_VALUE_BYTES:
            raise _too_long(len(value))
        return bytes(value).decode("utf-8")  # total() turns an error into not_utf8
    if isinstance(value, bool | int | float):
        return str(value)  # proton's integers are at most 64 bits
    raise InvalidMessageError(
        f"AMQP application-property of type {type(value).__name__}: the outbox sends text only",
        reason="bad_format",
    )


def _too_long(length: int) -> InvalidMessageError:
    return InvalidMessageError(
        f"AMQP application-property of {length} characters or bytes, above the maximum of "
        f"{MAX_HEADER_VALUE_BYTES}",
        reason="bad_header",
    )
