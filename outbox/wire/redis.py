"""Redis Streams: one ``XADD`` entry per message, its fields the envelope headers plus
``payload`` (the body).

A user header named ``payload`` would collide with the body; ``publish()`` refuses that name
(it is reserved), and :func:`encode` refuses an envelope built by hand with it.
"""

from __future__ import annotations

from collections.abc import Mapping

from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.wire._text import text

__all__ = ["PAYLOAD_FIELD", "decode", "encode"]

#: The field holding the body; every other field is a header.
PAYLOAD_FIELD = "payload"


def encode(envelope: Envelope) -> dict[str, str | bytes]:
    """The entry's fields, for ``XADD stream * field value ...``."""
    if PAYLOAD_FIELD in envelope.headers:
        raise InvalidMessageError(
            f"a user header named {PAYLOAD_FIELD!r} would overwrite the body field on Redis: "
            "rename the header",
            message_id=envelope.id,
            topic=envelope.topic,
            key=envelope.key,
        )
    return {**envelope.to_headers(), PAYLOAD_FIELD: envelope.payload}


def decode(fields: Mapping[object, object]) -> Envelope:
    """The envelope of a stream entry (its fields as ``XREADGROUP`` returns them, bytes or str)."""
    headers: dict[str, str] = {}
    payload = b""
    for name, value in fields.items():
        field = text(name)
        if field == PAYLOAD_FIELD:
            payload = value if isinstance(value, bytes) else text(value).encode()
        else:
            headers[field] = text(value)
    return Envelope.from_headers(headers, payload)
