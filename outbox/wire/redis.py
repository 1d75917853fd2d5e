"""Redis Streams: one ``XADD`` entry per message, its fields the envelope headers plus
``payload`` (the body).

A user header named ``payload`` would collide with the body; ``publish()`` refuses that name
(it is reserved), and :func:`encode` refuses an envelope built by hand with it.
"""

from __future__ import annotations

from collections.abc import Mapping

from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES, MAX_RECEIVED_HEADERS
from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.wire import cloudevents as ce
from outbox.wire._text import text, total

__all__ = ["PAYLOAD_FIELD", "decode", "encode"]

#: The field holding the body; every other field is a header.
PAYLOAD_FIELD = "payload"
_PAYLOAD_BYTES = PAYLOAD_FIELD.encode()


def encode(
    envelope: Envelope, cloudevents: ce.CloudEvents | None = None
) -> dict[str, str | bytes]:
    """The entry's fields, for ``XADD stream * field value ...``; a CloudEvent (``ce_``
    fields) when ``cloudevents`` covers the topic."""
    if PAYLOAD_FIELD in envelope.headers:
        raise InvalidMessageError(
            f"a user header named {PAYLOAD_FIELD!r} would overwrite the body field on Redis: "
            "rename the header",
            message_id=envelope.id,
            topic=envelope.topic,
            key=envelope.key,
        )
    if cloudevents is not None and cloudevents.applies(envelope.topic):
        if cloudevents.structured:
            return {**cloudevents.structured_headers(envelope),
                    PAYLOAD_FIELD: cloudevents.structured_body(envelope)}  # fmt: skip
        return {**cloudevents.headers(envelope, ce.REDIS), PAYLOAD_FIELD: envelope.payload}
    return {**envelope.to_headers(), PAYLOAD_FIELD: envelope.payload}


@total
def decode(
    fields: Mapping[object, object], *, max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES
) -> Envelope:
    """The envelope of a stream entry (its fields as ``XREADGROUP`` returns them, bytes or
    str); raises :class:`~outbox.exceptions.InvalidMessageError` for anything else."""
    if len(fields) > MAX_RECEIVED_HEADERS + 1:  # the headers and the body's field
        raise InvalidMessageError(
            f"stream entry has {len(fields)} fields, above the maximum of "
            f"{MAX_RECEIVED_HEADERS + 1}: it was not published by the outbox relay",
            reason="too_many_headers",
        )
    headers: dict[str, str] = {}
    payload = b""
    for name, value in fields.items():
        if name in (PAYLOAD_FIELD, _PAYLOAD_BYTES):
            # the body as it is (its size is checked with the envelope, not decoded)
            payload = value if isinstance(value, bytes) else str(value).encode()
        else:
            headers[text(name)] = text(value)
    if ce.detect(headers, ce.REDIS):
        return ce.decode(headers, payload, ce.REDIS, max_payload_bytes=max_payload_bytes)
    return Envelope.from_headers(headers, payload, max_payload_bytes=max_payload_bytes)
