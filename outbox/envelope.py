"""The envelope every broker carries: the one contract between the relay and the consumers.

The relay turns an outbox row into an :class:`Envelope` and maps it onto a broker's message
(headers or properties plus body); a consumer runner maps the broker's message back with
:meth:`Envelope.from_headers`. User headers travel unchanged beside the reserved ones below,
which ``publish`` refuses as user header names.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from outbox._limits import (
    DEFAULT_MAX_RECEIVE_BYTES,
    MAX_CONTENT_TYPE_BYTES,
    MAX_CREATED_AT_CHARS,
    MAX_HEADER_NAME_BYTES,
    MAX_HEADER_VALUE_BYTES,
    MAX_KEY_BYTES,
    MAX_RECEIVED_HEADERS,
    MAX_SEQ_DIGITS,
    MAX_TOPIC_BYTES,
)
from outbox.exceptions import InvalidMessageError

__all__ = [
    "HEADER_CONTENT_TYPE",
    "HEADER_CREATED_AT",
    "HEADER_ID",
    "HEADER_KEY",
    "HEADER_ORIGIN",
    "HEADER_REPLAY",
    "HEADER_SEQ",
    "HEADER_TOPIC",
    "HEADER_TRACEPARENT",
    "REFUSAL_REASONS",
    "RESERVED_PREFIX",
    "Envelope",
    "is_reserved_header",
    "shown",
]

RESERVED_PREFIX = "outbox-"
HEADER_ID = "outbox-id"
HEADER_TOPIC = "outbox-topic"
HEADER_KEY = "outbox-key"
HEADER_SEQ = "outbox-seq"
HEADER_CREATED_AT = "outbox-created-at"
#: the database the message came from (its outbox identity); absent on messages of a database
#: without one, and on every message published before origins existed
HEADER_ORIGIN = "outbox-origin"
HEADER_CONTENT_TYPE = "content-type"
HEADER_TRACEPARENT = "traceparent"
#: set by ``outbox replay`` on what it re-publishes: the replay's token, which the wire formats
#: add to the broker's dedup id (a replay is not a duplicate of the original inside the
#: broker's window); a reserved header, so consumers never see it, and the envelope's id, the
#: inbox's dedup key, stays the original's
HEADER_REPLAY = "outbox-replay"
#: ``payload`` is the body's field in a Redis Streams entry; ``nats-msg-id`` is JetStream's dedup
#: header. Neither may be a user header, and neither is returned as one.
_RESERVED_EXACT = frozenset({HEADER_CONTENT_TYPE, HEADER_TRACEPARENT, "payload", "nats-msg-id"})

#: Why a decoder refuses a broker message: the ``reason`` of its :class:`InvalidMessageError`
#: and the ``reason`` label of the consumers' ``inbox_refused`` counter (a closed set, so the
#: label's cardinality is bounded). ``invalid``: refused by the inbox's own checks after
#: decoding; ``error``: an unexpected exception while decoding or handling (a bug, logged
#: with its traceback).
REFUSAL_REASONS = frozenset({
    "too_many_headers", "bad_header", "missing_header", "bad_id", "bad_topic", "bad_key",
    "bad_seq", "bad_created_at", "payload_too_large", "not_utf8", "bad_format", "invalid",
    "error",
    # a claim check reference (outbox.claimcheck) that cannot be resolved to its payload
    "claim_check_invalid", "claim_check_missing", "claim_check_mismatch",
    "claim_check_too_large", "claim_check_unresolvable",
})  # fmt: skip


def is_reserved_header(name: str) -> bool:
    """True for header names the envelope itself uses (case-insensitive)."""
    lowered = name.lower()
    return lowered.startswith(RESERVED_PREFIX) or lowered in _RESERVED_EXACT


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message as it travels: stable id, ordering key and per-key sequence, headers, body."""

    id: uuid.UUID
    topic: str
    key: str
    seq: int
    payload: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    traceparent: str | None = None
    created_at: dt.datetime | None = None
    #: the publishing database's identity (``outbox_identity``, or the relay's ``origin``
    #: setting): an ordered consumer keeps one position per (origin, topic, key)
    origin: str | None = None

    def to_headers(self) -> dict[str, str]:
        """User headers plus the reserved envelope headers, all text."""
        out = dict(self.headers)
        out[HEADER_ID] = str(self.id)
        out[HEADER_TOPIC] = self.topic
        out[HEADER_KEY] = self.key
        out[HEADER_SEQ] = str(self.seq)
        out[HEADER_CONTENT_TYPE] = self.content_type
        if self.traceparent:
            out[HEADER_TRACEPARENT] = self.traceparent
        if self.created_at is not None:
            out[HEADER_CREATED_AT] = self.created_at.isoformat()
        if self.origin:
            out[HEADER_ORIGIN] = self.origin
        return out

    @classmethod
    def from_headers(
        cls,
        headers: Mapping[str, str],
        payload: bytes,
        *,
        max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
    ) -> Envelope:
        """Rebuild an envelope from broker headers, or raise :class:`InvalidMessageError`
        naming what is wrong (its ``reason`` is one of :data:`REFUSAL_REASONS`).

        The input may be hostile: every bound (``outbox._limits``) is checked before the work
        that grows with it, and what is shown of a value in the error is cut short and escaped.
        What could be read of the message (id, topic, key, seq) rides on the error, so a
        consumer can record it dead.
        """
        lowered, user = _split_headers(headers)
        try:
            raw_id, topic = lowered[HEADER_ID], lowered[HEADER_TOPIC]
            key, raw_seq = lowered[HEADER_KEY], lowered[HEADER_SEQ]
        except KeyError:
            missing = [h for h in (HEADER_ID, HEADER_TOPIC, HEADER_KEY, HEADER_SEQ)
                       if h not in lowered]  # fmt: skip
            raise InvalidMessageError(
                f"broker message lacks the outbox header(s) {', '.join(missing)}: it was not "
                "published by the outbox relay",
                missing=missing,
                reason="missing_header",
            ) from None
        # What is known of the message rides on the error, so a consumer can record it dead.
        known: dict[str, object] = {"topic": topic, "key": key}
        known["message_id"] = msg_id = _read_id(raw_id, known)
        _check_text(HEADER_TOPIC, topic, MAX_TOPIC_BYTES, "bad_topic", known)
        _check_text(HEADER_KEY, key, MAX_KEY_BYTES, "bad_key", known)
        known["seq"] = seq = _read_seq(raw_seq, known)
        created = lowered.get(HEADER_CREATED_AT)
        created_at = _read_created_at(created, known) if created else None
        content_type = lowered.get(HEADER_CONTENT_TYPE, "application/json")
        if len(content_type) * 4 > MAX_CONTENT_TYPE_BYTES and _too_long(
            content_type, MAX_CONTENT_TYPE_BYTES
        ):
            raise InvalidMessageError(
                f"malformed header {HEADER_CONTENT_TYPE}={shown(content_type)}: longer than "
                f"{MAX_CONTENT_TYPE_BYTES} bytes",
                reason="bad_header",
                **known,
            )
        if len(payload) > max_payload_bytes:
            raise InvalidMessageError(
                f"broker message body is {len(payload)} bytes, above the consumer's "
                f"max_payload_bytes={max_payload_bytes}: raise it if your producers publish "
                "larger messages",
                reason="payload_too_large",
                **known,
            )
        origin = lowered.get(HEADER_ORIGIN) or None
        if origin is not None:
            _check_text(HEADER_ORIGIN, origin, MAX_ORIGIN_BYTES, "bad_header", known)
        return cls(msg_id, topic, key, seq, bytes(payload), content_type, user,
                   lowered.get(HEADER_TRACEPARENT), created_at, origin)  # fmt: skip


#: an origin is at most this long (outbox_identity's check)
MAX_ORIGIN_BYTES = 255

_NAME_CHARS = MAX_HEADER_NAME_BYTES // 4
_VALUE_CHARS = MAX_HEADER_VALUE_BYTES // 4


def _split_headers(headers: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The headers by lower-cased name, and the user headers (not reserved) by their own name;
    each checked to be text within the bounds. One pass: this runs for every message."""
    if len(headers) > MAX_RECEIVED_HEADERS:
        raise InvalidMessageError(
            f"broker message has {len(headers)} headers, above the maximum of "
            f"{MAX_RECEIVED_HEADERS}: it was not published by the outbox relay",
            reason="too_many_headers",
        )
    lowered: dict[str, str] = {}
    user: dict[str, str] = {}
    for name, value in headers.items():
        if not (name.__class__ is str and value.__class__ is str):
            raise InvalidMessageError(
                f"broker message header {shown(name)} is not text", reason="bad_header"
            )
        # text of a quarter of the bound in characters is within it in bytes: one len()
        # each decides the common case
        if (len(name) > _NAME_CHARS or len(value) > _VALUE_CHARS) and (
            _too_long(name, MAX_HEADER_NAME_BYTES) or _too_long(value, MAX_HEADER_VALUE_BYTES)
        ):
            raise InvalidMessageError(
                f"broker message header {shown(name)} is longer than the maximum "
                f"({MAX_HEADER_NAME_BYTES} bytes a name, {MAX_HEADER_VALUE_BYTES} a value)",
                reason="bad_header",
            )
        lowered[low := name.lower()] = value
        if not (low.startswith(RESERVED_PREFIX) or low in _RESERVED_EXACT):  # is_reserved_header
            user[name] = value
    return lowered, user


def _read_id(raw_id: str, known: dict[str, object]) -> uuid.UUID:
    try:
        return uuid.UUID(raw_id)
    except ValueError as exc:
        raise InvalidMessageError(
            f"malformed outbox header {HEADER_ID}={shown(raw_id)}: not a UUID",
            reason="bad_id",
            **known,
        ) from exc


def _check_text(name: str, text: str, limit: int, reason: str, known: dict[str, object]) -> None:
    """The topic or the key: non-blank text without NUL of at most ``limit`` bytes."""
    if not text.strip() or "\x00" in text or _too_long(text, limit):
        raise InvalidMessageError(
            f"malformed outbox header {name}={shown(text)}: must be non-blank text "
            f"without NUL of at most {limit} bytes (what publish() accepts)",
            reason=reason,
            **known,
        )


def _read_seq(raw_seq: str, known: dict[str, object]) -> int:
    # digits only (no sign, space, '_' or other script), counted before int() reads them
    if not (raw_seq.isascii() and raw_seq.isdigit()) or len(raw_seq) > MAX_SEQ_DIGITS:
        raise InvalidMessageError(
            f"malformed outbox header {HEADER_SEQ}={shown(raw_seq)}: not a positive integer "
            f"of at most {MAX_SEQ_DIGITS} digits",
            reason="bad_seq",
            **known,
        )
    seq = int(raw_seq)
    if not 1 <= seq < 2**63:
        raise InvalidMessageError(
            f"malformed outbox header {HEADER_SEQ}={shown(raw_seq)}: seq must be a positive "
            "int below 2**63 (a PostgreSQL bigint)",
            reason="bad_seq",
            **known,
        )
    return seq


def _read_created_at(created: str | None, known: dict[str, object]) -> dt.datetime | None:
    if not created:
        return None
    try:
        if len(created) > MAX_CREATED_AT_CHARS:
            raise ValueError("too long")
        return dt.datetime.fromisoformat(created)
    except ValueError as exc:
        raise InvalidMessageError(
            f"malformed outbox header {HEADER_CREATED_AT}={shown(created)}: not an ISO 8601 time",
            reason="bad_created_at",
            **known,
        ) from exc


def _too_long(text: str, max_bytes: int) -> bool:
    """True when ``text`` is more than ``max_bytes`` in UTF-8 (a lone surrogate counts 3)."""
    if len(text) > max_bytes:
        return True
    if len(text) * 4 <= max_bytes or text.isascii():
        return False
    return len(text.encode("utf-8", "surrogatepass")) > max_bytes


def shown(value: object, limit: int = 48) -> str:
    """``value`` as an error or a log line may show it: escaped (``repr``: no control character
    reaches a terminal) and cut to about ``limit`` characters (no hostile megabyte in a log)."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} long)"
    text = repr(value)
    return text if len(text) <= 4 * limit else text[: 4 * limit] + "..."
