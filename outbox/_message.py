"""The message a producer writes, and its validation before anything touches the database."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox._ids import id_from_idempotency_key, new_message_id
from outbox._limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_CONTENT_TYPE_BYTES,
    MAX_HEADER_NAME_BYTES,
    MAX_HEADER_VALUE_BYTES,
    MAX_HEADERS,
    MAX_KEY_BYTES,
    MAX_TOPIC_BYTES,
)
from outbox._payload import JSON_ENCODER, encode_checked_headers, encode_payload
from outbox._topic import check_topic
from outbox._trace import current_traceparent
from outbox.envelope import is_reserved_header
from outbox.exceptions import InvalidMessageError, PayloadTooLargeError, SerializationError

#: the one reserved header a publisher sets: outbox.claimcheck.OVERRIDE_HEADER (the relay
#: reads it and removes it before publishing)
_CLAIM_CHECK_OVERRIDE = "outbox-claim-check"

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_KEY_BYTES",
    "MAX_TOPIC_BYTES",
    "Message",
    "PreparedMessage",
    "check_text",
    "check_text_fully",
    "prepare",
    "prepare_fields",
]

# Header names travel as MIME-style names (NATS, and the inbox's own header mapping): no
# whitespace, colon or control character. Values must not break a header line.
_BAD_HEADER_NAME = re.compile(r"[\x00-\x20:\x7f]")
_BAD_HEADER_VALUE = re.compile(r"[\x00\r\n]")


@dataclass(frozen=True, slots=True)
class Message:
    """A message to publish, for :func:`outbox.publish_batch`.

    ``payload`` is JSON data (dict, list, str, numbers, bool, None, and UUID/datetime as text)
    or ``bytes`` stored as they are. ``key`` is the ordering key (an aggregate id): messages of
    one (topic, key) get gapless sequence numbers in commit order and are delivered in that
    order. ``idempotency_key`` derives a stable id, so publishing it again is a no-op while the
    first message is in the outbox (until retention deletes it).
    ``deliver_after`` or ``available_at`` delays delivery.
    """

    topic: str
    key: str
    payload: Any
    headers: Mapping[str, str] | None = None
    idempotency_key: str | None = None
    content_type: str | None = None
    deliver_after: dt.timedelta | None = None
    available_at: dt.datetime | None = None


@dataclass(slots=True)
class PreparedMessage:
    """A validated message, serialized, ready to be bound to the insert statement or encoded
    as a WAL record. Made once per message on the producer's hot path, and never changed after:
    not frozen because a frozen class's constructor is slower than a plain one's."""

    id: uuid.UUID
    topic: str
    key: str
    headers: str
    payload: bytes
    content_type: str
    traceparent: str | None
    available_at: dt.datetime | None
    idempotent: bool = field(default=False)


def check_text(value: object, name: str, max_bytes: int | None = None) -> str:
    """``value`` if it is non-blank UTF-8 text without NUL of at most ``max_bytes`` bytes."""
    # The common case, decided by str's C methods: ASCII (one byte a character, so its length
    # is its size in UTF-8), not blank, no NUL. Anything else takes the checks below.
    if (
        value.__class__ is str
        and value.isascii()
        and (max_bytes is None or len(value) <= max_bytes)
        and value
        and not value.isspace()
        and "\x00" not in value
    ):
        return value
    return check_text_fully(value, name, max_bytes)


def check_text_fully(value: object, name: str, max_bytes: int | None = None) -> str:
    """:func:`check_text` without its fast path: every check, one by one, with its error."""
    if not isinstance(value, str):
        raise InvalidMessageError(
            f"{name} must be a str, got {type(value).__name__} {value!r}; "
            f"for example {name}=str(order.id)",
            field=name,
        )
    if not value.strip():
        raise InvalidMessageError(f"{name} must not be empty or blank", field=name)
    if "\x00" in value:
        raise InvalidMessageError(f"{name} must not contain NUL characters", field=name)
    size = len(_utf8(value, name, InvalidMessageError))
    if max_bytes is not None and size > max_bytes:
        raise InvalidMessageError(
            f"{name} is {size} bytes in UTF-8, above the maximum of {max_bytes}; use a shorter "
            f"identifier (for example a hash of the long one)",
            field=name,
        )
    return value


def _utf8(value: str, name: str, error: type[InvalidMessageError]) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"{name} is not valid Unicode text: it has a lone surrogate {value[exc.start]!r} at "
            f"index {exc.start} (text decoded with errors='surrogateescape' or a broken "
            "UTF-16 pair?); decode the bytes properly, or send them as a bytes payload",
            field=name,
        ) from exc


# Header names that passed every check below, so a name seen before (most services send the
# same few) costs one set lookup. Bounded: past the cap, new names take the full checks.
_CHECKED_NAMES: set[str] = set()
_CHECKED_NAMES_MAX = 1024


def _headers(headers: Mapping[str, str] | None) -> str:
    if headers is None:
        return "{}"
    # The common case: a dict whose names were all checked before and whose values are
    # printable ASCII (no control character at all, so no NUL, CR or LF). Anything else takes
    # the full checks, which decide the same and name what is wrong.
    if headers.__class__ is dict and len(headers) <= MAX_HEADERS:
        for k, v in headers.items():
            if not (
                k in _CHECKED_NAMES
                and k.__class__ is str
                and v.__class__ is str
                and v.isascii()
                and len(v) <= MAX_HEADER_VALUE_BYTES
                and v.isprintable()
            ):
                break
        else:
            return encode_checked_headers(headers)
    return _headers_fully(headers)


def _headers_fully(headers: Mapping[str, str]) -> str:
    """:func:`_headers` without its fast path: every check, one by one, with its error."""
    if not isinstance(headers, Mapping):
        raise SerializationError(
            f"headers must be a mapping of str to str, got {type(headers).__name__}",
            where="headers",
            type_name=type(headers).__name__,
        )
    if len(headers) > MAX_HEADERS:
        raise SerializationError(
            f"{len(headers)} headers, above the maximum of {MAX_HEADERS}: put the data in the "
            "payload instead (consumers refuse a message with more)",
            where="headers",
            type_name="dict",
        )
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise SerializationError(
                f"headers[{k!r}] must map a str to a str (brokers carry headers as text), "
                f"got {type(k).__name__} -> {type(v).__name__}; convert the value with str()",
                where=f"headers[{k!r}]",
                type_name=type(v).__name__,
            )
        if is_reserved_header(k) and k != _CLAIM_CHECK_OVERRIDE:
            raise SerializationError(
                f"headers[{k!r}] uses a name reserved for the envelope (outbox-*, content-type, "
                "traceparent, payload, nats-msg-id); pick another name, or use the "
                "content_type argument",
                where=f"headers[{k!r}]",
                type_name="str",
            )
        if not k or _BAD_HEADER_NAME.search(k):
            raise SerializationError(
                f"header name {k!r} must be non-empty, without whitespace, ':' or control "
                "characters (brokers carry names like HTTP header names); for example "
                "'x-tenant-id'",
                where=f"headers[{k!r}]",
                type_name="str",
            )
        if _BAD_HEADER_VALUE.search(v):
            raise SerializationError(
                f"headers[{k!r}] contains a NUL, CR or LF character, which would break the "
                "broker's header line; encode the value (for example as JSON or base64)",
                where=f"headers[{k!r}]",
                type_name="str",
            )
        for part, text, limit in (
            ("name", k, MAX_HEADER_NAME_BYTES),
            ("value", v, MAX_HEADER_VALUE_BYTES),
        ):
            # ASCII is UTF-8 already, one byte a character
            utf8 = text if text.isascii() else _utf8(text, f"headers[{k!r}]", SerializationError)
            if len(utf8) > limit:
                raise SerializationError(
                    f"headers[{k[:40]!r}] has a {part} of {len(utf8)} bytes in UTF-8, above the "
                    f"maximum of {limit}: put the data in the payload instead (consumers refuse "
                    "a message with a larger header)",
                    where=f"headers[{k[:40]!r}]",
                    type_name="str",
                )
    if len(_CHECKED_NAMES) < _CHECKED_NAMES_MAX:
        _CHECKED_NAMES.update(k for k in headers if k.__class__ is str)
    return JSON_ENCODER.encode(dict(headers))


def _available_at(
    deliver_after: dt.timedelta | None, available_at: dt.datetime | None
) -> dt.datetime | None:
    if deliver_after is not None and available_at is not None:
        raise InvalidMessageError(
            "give either deliver_after or available_at, not both", field="deliver_after"
        )
    if deliver_after is not None:
        if not isinstance(deliver_after, dt.timedelta) or deliver_after < dt.timedelta(0):
            raise InvalidMessageError(
                f"deliver_after must be a non-negative datetime.timedelta, got "
                f"{deliver_after!r}",
                field="deliver_after",
            )
        try:
            return dt.datetime.now(dt.UTC) + deliver_after
        except OverflowError as exc:
            raise InvalidMessageError(
                f"deliver_after {deliver_after!r} is beyond the year 9999",
                field="deliver_after",
            ) from exc
    if available_at is not None:
        if not isinstance(available_at, dt.datetime) or available_at.tzinfo is None:
            raise InvalidMessageError(
                f"available_at must be a timezone-aware datetime, got {available_at!r}; "
                "for example datetime.now(timezone.utc) + timedelta(minutes=5)",
                field="available_at",
            )
        return available_at
    return None


def prepare(
    message: Message, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> PreparedMessage:
    """Validate and serialize ``message``; raise a clear error naming what is wrong."""
    return prepare_fields(
        message.topic,
        message.key,
        message.payload,
        message.headers,
        message.idempotency_key,
        message.content_type,
        message.deliver_after,
        message.available_at,
        max_payload_bytes,
    )


def prepare_fields(
    topic: str,
    key: str,
    payload: Any,
    headers: Mapping[str, str] | None,
    idempotency_key: str | None,
    content_type: str | None,
    deliver_after: dt.timedelta | None,
    available_at: dt.datetime | None,
    max_payload_bytes: int,
) -> PreparedMessage:
    """:func:`prepare` of the fields themselves, for ``publish()``, which has no Message to
    make (one object less per call)."""
    topic = check_topic(check_text(topic, "topic", MAX_TOPIC_BYTES))  # a name, not an address
    key = check_text(key, "key", MAX_KEY_BYTES)
    data, stored_type = encode_payload(payload, content_type)
    headers_json = _headers(headers)
    # Brokers count headers against their limit too (NATS's max_payload does).
    size = len(data)
    if headers_json != "{}":
        size += len(headers_json) if headers_json.isascii() else len(headers_json.encode())
    if size > max_payload_bytes:
        raise PayloadTooLargeError(
            f"payload of topic {topic!r} is {size} bytes serialized (with its headers), above "
            f"the maximum of {max_payload_bytes}; store large data elsewhere and publish a "
            "reference to it, or raise max_payload_bytes if every broker you use accepts it",
            size=size,
            limit=max_payload_bytes,
        )
    if content_type is not None:
        check_text(content_type, "content_type", MAX_CONTENT_TYPE_BYTES)
    if idempotency_key is None:
        msg_id = new_message_id()
    else:
        msg_id = id_from_idempotency_key(topic, check_text(idempotency_key, "idempotency_key"))
    at = None if deliver_after is None and available_at is None else (
        _available_at(deliver_after, available_at)
    )
    # positional: the order of PreparedMessage's fields
    return PreparedMessage(
        msg_id,
        topic,
        key,
        headers_json,
        data,
        stored_type,
        current_traceparent(),
        at,
        idempotency_key is not None,
    )
