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

from outbox.exceptions import InvalidMessageError

__all__ = [
    "HEADER_CONTENT_TYPE",
    "HEADER_CREATED_AT",
    "HEADER_ID",
    "HEADER_KEY",
    "HEADER_SEQ",
    "HEADER_TOPIC",
    "HEADER_TRACEPARENT",
    "RESERVED_PREFIX",
    "Envelope",
    "is_reserved_header",
]

RESERVED_PREFIX = "outbox-"
HEADER_ID = "outbox-id"
HEADER_TOPIC = "outbox-topic"
HEADER_KEY = "outbox-key"
HEADER_SEQ = "outbox-seq"
HEADER_CREATED_AT = "outbox-created-at"
HEADER_CONTENT_TYPE = "content-type"
HEADER_TRACEPARENT = "traceparent"
#: ``payload`` is the body's field in a Redis Streams entry; ``nats-msg-id`` is JetStream's dedup
#: header. Neither may be a user header, and neither is returned as one.
_RESERVED_EXACT = frozenset({HEADER_CONTENT_TYPE, HEADER_TRACEPARENT, "payload", "nats-msg-id"})


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
        return out

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], payload: bytes) -> Envelope:
        """Rebuild an envelope from broker headers; a clear error names a missing field."""
        lowered = {k.lower(): v for k, v in headers.items()}
        missing = [h for h in (HEADER_ID, HEADER_TOPIC, HEADER_KEY, HEADER_SEQ) if h not in lowered]
        if missing:
            raise InvalidMessageError(
                f"broker message lacks the outbox header(s) {', '.join(missing)}: it was not "
                "published by the outbox relay",
                missing=missing,
            )
        # What is known of the message rides on the error, so a consumer can record it dead.
        known: dict[str, object] = {"topic": lowered[HEADER_TOPIC], "key": lowered[HEADER_KEY]}
        try:
            known["message_id"] = msg_id = uuid.UUID(lowered[HEADER_ID])
        except ValueError as exc:
            raise InvalidMessageError(
                f"malformed outbox header {HEADER_ID}={lowered[HEADER_ID]!r}: not a UUID", **known
            ) from exc
        raw_seq = lowered[HEADER_SEQ]
        if not (raw_seq.isascii() and raw_seq.isdigit()):
            raise InvalidMessageError(
                f"malformed outbox header {HEADER_SEQ}={raw_seq!r}: not a positive integer",
                **known,
            )
        known["seq"] = seq = int(raw_seq)
        created = lowered.get(HEADER_CREATED_AT)
        try:
            created_at = dt.datetime.fromisoformat(created) if created else None
        except ValueError as exc:
            raise InvalidMessageError(
                f"malformed outbox header {HEADER_CREATED_AT}={created!r}: not an ISO 8601 time",
                **known,
            ) from exc
        return cls(
            id=msg_id,
            topic=lowered[HEADER_TOPIC],
            key=lowered[HEADER_KEY],
            seq=seq,
            payload=bytes(payload),
            content_type=lowered.get(HEADER_CONTENT_TYPE, "application/json"),
            headers={k: v for k, v in headers.items() if not is_reserved_header(k)},
            traceparent=lowered.get(HEADER_TRACEPARENT),
            created_at=created_at,
        )
