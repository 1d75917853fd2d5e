"""Amazon SQS and SNS: the body is the payload as text, the envelope's fields are message
attributes, the key is the FIFO ``MessageGroupId`` and the id the ``MessageDeduplicationId``.

SNS delivers to SQS queues with ``RawMessageDelivery=true`` exactly what was published (body and
attributes), so one mapping serves both.

Attributes (``DataType`` String; at most nine, under SQS's and SNS's limit of ten):

=====================  =======================================================================
``outbox-id``          the outbox id (also the FIFO ``MessageDeduplicationId``)
``outbox-topic``       the outbox topic
``outbox-key``         the outbox key (the FIFO ``MessageGroupId`` is derived from it, below)
``outbox-seq``         the per-key sequence number, decimal
``outbox-created-at``  ISO 8601, when known
``content-type``       the payload's content type
``traceparent``        W3C trace context, when there is one
``outbox-headers``     the user's headers as one JSON object (names and values of any text:
                       SQS attribute names allow neither spaces nor most punctuation, and ten
                       attributes would not hold them all)
``outbox-body``        ``base64`` when the body is the payload in base64, ``empty`` for an
                       empty payload; absent when the body is the payload's UTF-8 text
=====================  =======================================================================

SQS accepts only XML-safe text in a body (no NUL or other control characters but tab, line feed
and carriage return, and never empty), so a payload that is not such text travels base64.

``MessageGroupId`` allows 1-128 printable ASCII characters without spaces: a key that fits is
used as it is, any other becomes ``sha256-`` and the hex SHA-256 of its UTF-8 bytes. Two keys
sharing a group only share its order, which costs nothing but parallelism.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from outbox.envelope import (
    HEADER_CONTENT_TYPE,
    HEADER_CREATED_AT,
    HEADER_ID,
    HEADER_KEY,
    HEADER_REPLAY,
    HEADER_SEQ,
    HEADER_TOPIC,
    HEADER_TRACEPARENT,
    Envelope,
    is_reserved_header,
)
from outbox.exceptions import InvalidMessageError
from outbox.wire import cloudevents as ce

__all__ = [
    "BODY_ENCODING",
    "HEADERS_ATTRIBUTE",
    "SqsMessage",
    "decode",
    "encode",
    "group_id",
    "size",
]

#: the attribute holding the user's headers (a JSON object)
HEADERS_ATTRIBUTE = "outbox-headers"
#: the attribute saying how the body holds the payload (absent: UTF-8 text)
BODY_ENCODING = "outbox-body"

_FIELDS = (HEADER_ID, HEADER_TOPIC, HEADER_KEY, HEADER_SEQ, HEADER_CREATED_AT,
           HEADER_CONTENT_TYPE, HEADER_TRACEPARENT)  # fmt: skip
# What an SQS body may not hold (XML 1.0's excluded characters); surrogates cannot come from
# decoded UTF-8.
_NOT_BODY_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_MAX_GROUP_ID = 128
#: A message's attributes are bounded by SQS (ten, within the message's size); a decoder
#: handed more is not reading an SQS message.
_MAX_ATTRIBUTES = 64
_MAX_SEQ_DIGITS = 20  # a seq is below 2**63


@dataclass(frozen=True, slots=True)
class SqsMessage:
    """What the relay sends: ``MessageBody``/``Message``, ``MessageAttributes`` in the shape of
    the AWS API (``{"name": {"DataType": "String", "StringValue": "..."}}``), and the FIFO
    ``MessageGroupId`` and ``MessageDeduplicationId`` (sent to FIFO queues and topics only)."""

    body: str
    attributes: dict[str, dict[str, str]]
    group_id: str
    deduplication_id: str


def group_id(key: str) -> str:
    """The FIFO ``MessageGroupId`` of ``key``: the key when SQS allows it, else its hash."""
    if 0 < len(key) <= _MAX_GROUP_ID and key.isascii() and key.isprintable() and " " not in key:
        return key
    return "sha256-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def encode(envelope: Envelope, cloudevents: ce.CloudEvents | None = None) -> SqsMessage:
    """The message for ``envelope``; InvalidMessageError for a field SQS cannot carry (an empty
    topic, key or content type: SQS refuses empty attribute values).

    A CloudEvent when ``cloudevents`` covers the topic: ``ce-<name>`` attributes (the HTTP
    binding's names and percent-encoding) and ``content-type``; in structured mode when asked,
    or when the attributes would be more than SQS's ten."""
    if cloudevents is not None and cloudevents.applies(envelope.topic):
        return _event(envelope, cloudevents)
    headers = envelope.to_headers()
    replay = headers.pop(HEADER_REPLAY, None)  # outbox replay: its own FIFO dedup id
    attributes: dict[str, dict[str, str]] = {}
    for name in _FIELDS:
        value = headers.pop(name, None)
        if value is None:
            continue
        if not value:
            raise InvalidMessageError(
                f"{name} is empty, and SQS and SNS refuse empty attribute values: set it",
                message_id=envelope.id,
                topic=envelope.topic,
                key=envelope.key,
            )
        attributes[name] = {"DataType": "String", "StringValue": value}
    if headers:
        text = orjson.dumps(headers).decode()
        attributes[HEADERS_ATTRIBUTE] = {"DataType": "String", "StringValue": text}
    body = _body(envelope.payload)
    if body is None:
        encoding = "base64" if envelope.payload else "empty"
        attributes[BODY_ENCODING] = {"DataType": "String", "StringValue": encoding}
        body = base64.b64encode(envelope.payload).decode("ascii") or "-"
    return SqsMessage(
        body=body,
        attributes=attributes,
        group_id=group_id(envelope.key),
        deduplication_id=f"{envelope.id}:{replay}" if replay else str(envelope.id),
    )


_MAX_SENT_ATTRIBUTES = 10  # SQS's and SNS's limit


def _event(envelope: Envelope, cloudevents: ce.CloudEvents) -> SqsMessage:
    payload = envelope.payload
    user = {k: v for k, v in envelope.headers.items() if not is_reserved_header(k)}
    attributes: dict[str, dict[str, str]] = {}
    if not cloudevents.structured:
        for name, value in cloudevents.headers(envelope, ce.HTTP_LIKE).items():
            if name not in user:
                attributes[name] = {"DataType": "String", "StringValue": value}
    extra = (1 if user else 0) + (0 if _body(payload) is not None else 1)
    if cloudevents.structured or len(attributes) + extra > _MAX_SENT_ATTRIBUTES:
        payload = cloudevents.structured_body(envelope)
        attributes = {HEADER_CONTENT_TYPE: {"DataType": "String",
                                            "StringValue": ce.STRUCTURED_CONTENT_TYPE}}  # fmt: skip
    if user:
        text = orjson.dumps(user).decode()
        attributes[HEADERS_ATTRIBUTE] = {"DataType": "String", "StringValue": text}
    body = _body(payload)
    if body is None:
        encoding = "base64" if payload else "empty"
        attributes[BODY_ENCODING] = {"DataType": "String", "StringValue": encoding}
        body = base64.b64encode(payload).decode("ascii") or "-"
    return SqsMessage(
        body=body,
        attributes=attributes,
        group_id=group_id(envelope.key),
        deduplication_id=str(envelope.id),
    )


def _decode_event(body: object, attributes: Mapping[Any, Any]) -> Envelope:
    """A CloudEvent: ``ce-`` attributes (binary mode) or a structured body."""
    headers: dict[str, str] = {}
    raw_headers = _string(attributes, HEADERS_ATTRIBUTE)
    if raw_headers is not None:
        headers.update(_user_headers(raw_headers))
    for name in attributes:
        if isinstance(name, str) and (name.startswith("ce-") or name == HEADER_CONTENT_TYPE):
            value = _string(attributes, name)
            if value is not None:
                headers[name] = value
    payload = _payload(body, _string(attributes, BODY_ENCODING), {})
    return ce.decode(headers, payload, ce.HTTP_LIKE)


def _body(payload: bytes) -> str | None:
    """The payload as an SQS body, or None when it cannot be one (then it travels base64)."""
    if not payload:
        return None
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if _NOT_BODY_TEXT.search(text) else text


def size(message: SqsMessage) -> int:
    """The bytes SQS counts against its message size limit: the body and every attribute's
    name, type and value."""
    total = len(message.body.encode())
    for name, attribute in message.attributes.items():
        total += len(name) + len(attribute["DataType"]) + len(attribute["StringValue"].encode())
    return total


def decode(body: object, attributes: object) -> Envelope:
    """The envelope of a received message (``Body`` and ``MessageAttributes`` of
    ``ReceiveMessage`` called with ``MessageAttributeNames=["All"]``).

    Total: anything that is not a message the relay sent raises InvalidMessageError, naming
    what is wrong. Attributes of other names are ignored.
    """
    if attributes is None:
        attributes = {}
    if not isinstance(attributes, Mapping) or len(attributes) > _MAX_ATTRIBUTES:
        raise InvalidMessageError(
            "SQS message attributes are not a mapping of at most "
            f"{_MAX_ATTRIBUTES} attributes: not a message of the outbox relay"
        )
    if "ce-specversion" in attributes or (
        HEADER_ID not in attributes and HEADER_CONTENT_TYPE in attributes
        and _string(attributes, HEADER_CONTENT_TYPE) == ce.STRUCTURED_CONTENT_TYPE
    ):  # fmt: skip
        return _decode_event(body, attributes)
    headers: dict[str, str] = {}
    raw_headers = _string(attributes, HEADERS_ATTRIBUTE)
    if raw_headers is not None:
        headers.update(_user_headers(raw_headers))
    for name in _FIELDS:
        value = _string(attributes, name)
        if value is not None:
            headers[name] = value
    seq = headers.get(HEADER_SEQ, "")
    if len(seq) > _MAX_SEQ_DIGITS:  # int() of a long digit string costs, and raises ValueError
        raise InvalidMessageError(
            f"SQS message attribute {HEADER_SEQ!r} has {len(seq)} characters: not a sequence "
            "number",
            **_known(headers),
        )
    if HEADER_ID not in headers and not isinstance(body, str):
        raise InvalidMessageError("SQS message has no text body and no outbox attributes")
    if not headers:
        raise InvalidMessageError(
            "SQS message lacks the outbox attributes (outbox-id, outbox-topic, outbox-key, "
            "outbox-seq): it was not published by the outbox relay, or it came through SNS "
            "without RawMessageDelivery=true on the subscription (set it)"
        )
    payload = _payload(body, _string(attributes, BODY_ENCODING), headers)
    return Envelope.from_headers(headers, payload)


def _string(attributes: Mapping[Any, Any], name: str) -> str | None:
    attribute = attributes.get(name)
    if attribute is None:
        return None
    value = attribute.get("StringValue") if isinstance(attribute, Mapping) else None
    if not isinstance(value, str):
        raise InvalidMessageError(f"SQS message attribute {name!r} is not a String attribute")
    return value


def _user_headers(raw: str) -> dict[str, str]:
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessageError(
            f"SQS message attribute {HEADERS_ATTRIBUTE!r} is not JSON: {exc}"
        ) from None
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        raise InvalidMessageError(
            f"SQS message attribute {HEADERS_ATTRIBUTE!r} is not a JSON object of text values"
        )
    return {name: value for name, value in parsed.items() if not is_reserved_header(name)}


def _payload(body: object, encoding: str | None, headers: Mapping[str, str]) -> bytes:
    try:
        if not isinstance(body, str):
            raise ValueError("the body is not text")
        if encoding is None:
            return body.encode("utf-8")
        if encoding == "empty":
            return b""
        if encoding == "base64":
            return base64.b64decode(body, validate=True)
        raise ValueError(f"unknown {BODY_ENCODING} {encoding[:40]!r} (base64 or empty)")
    except (ValueError, binascii.Error) as exc:  # UnicodeEncodeError: a lone surrogate
        raise InvalidMessageError(
            f"SQS message body cannot be read: {exc}", **_known(headers)
        ) from None


def _known(headers: Mapping[str, str]) -> dict[str, object]:
    """What can be read of a message, for recording it dead."""
    known: dict[str, object] = {"topic": headers.get(HEADER_TOPIC), "key": headers.get(HEADER_KEY)}
    with contextlib.suppress(ValueError):
        known["message_id"] = uuid.UUID(headers.get(HEADER_ID, ""))
    seq = headers.get(HEADER_SEQ, "")
    if seq.isascii() and seq.isdigit() and len(seq) <= _MAX_SEQ_DIGITS:
        known["seq"] = int(seq)  # so its key moves on past it once it is recorded dead
    return known
