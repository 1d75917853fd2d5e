"""One list element per message: a JSON object of the envelope's text headers and the body in
base64. ``decode`` is total: anything else raises InvalidMessageError."""

from __future__ import annotations

import base64
import binascii
import json

from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.kit import DEFAULT_MAX_RECEIVE_BYTES

__all__ = ["decode", "encode"]


def encode(envelope: Envelope) -> bytes:
    """The element RPUSH appends for ``envelope``."""
    body = base64.b64encode(envelope.payload).decode("ascii")
    return json.dumps({"headers": envelope.to_headers(), "body": body}).encode()


def decode(element: bytes, *, max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES) -> Envelope:
    """The envelope of a list element."""
    if len(element) > 2 * max_payload_bytes + 65536:  # base64 and the headers, at most
        raise InvalidMessageError("list element too large", reason="payload_too_large")
    try:
        data = json.loads(element)
        headers, body = data["headers"], base64.b64decode(data["body"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise InvalidMessageError(
            f"list element is not an outbox message: {exc}", reason="bad_format"
        ) from None
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise InvalidMessageError("list element's headers are not text", reason="bad_format")
    return Envelope.from_headers(headers, body, max_payload_bytes=max_payload_bytes)
