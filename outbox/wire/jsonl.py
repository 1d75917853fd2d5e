"""JSON lines, for the ``stdout:`` and ``file:`` debugging sinks: one message per line.

``{"destination": ..., "headers": {...}, "payload": "<text>"}``, with ``"payload_base64"``
instead of ``"payload"`` when the body is not valid UTF-8.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from outbox._limits import (
    DEFAULT_MAX_RECEIVE_BYTES,
    MAX_HEADER_NAME_BYTES,
    MAX_HEADER_VALUE_BYTES,
    MAX_RECEIVED_HEADERS,
)
from outbox.envelope import Envelope
from outbox.exceptions import InvalidMessageError
from outbox.wire._text import total

__all__ = ["decode", "encode"]


def encode(envelope: Envelope, destination: str) -> str:
    """One line, ending in a newline."""
    doc: dict[str, Any] = {"destination": destination, "headers": envelope.to_headers()}
    try:
        doc["payload"] = envelope.payload.decode("utf-8")
    except UnicodeDecodeError:
        doc["payload_base64"] = base64.b64encode(envelope.payload).decode("ascii")
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"


@total
def decode(
    line: str, *, max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES
) -> tuple[str, Envelope]:
    """``(destination, envelope)`` from one line written by a sink; raises
    :class:`~outbox.exceptions.InvalidMessageError` for anything else."""
    # base64 makes a body a third larger, JSON escapes up to six times; the headers' bound
    limit = 6 * max_payload_bytes + MAX_RECEIVED_HEADERS * (
        MAX_HEADER_NAME_BYTES + MAX_HEADER_VALUE_BYTES
    )
    if len(line) > limit:
        raise InvalidMessageError(
            f"line of {len(line)} characters is longer than any message a sink writes "
            f"with max_payload_bytes={max_payload_bytes}",
            reason="payload_too_large",
        )
    doc = json.loads(line)  # RecursionError on deep nesting: total() refuses it
    if not isinstance(doc, dict) or not isinstance(doc.get("headers"), dict):
        raise InvalidMessageError(
            'line is not a sink\'s message: {"destination", "headers", "payload"}',
            reason="bad_format",
        )
    destination = doc.get("destination")
    if not isinstance(destination, str):
        raise InvalidMessageError("line has no destination text", reason="bad_format")
    if isinstance(doc.get("payload"), str):
        payload = doc["payload"].encode("utf-8")
    elif isinstance(doc.get("payload_base64"), str):
        payload = base64.b64decode(doc["payload_base64"], validate=True)
    else:
        raise InvalidMessageError("line has no payload text", reason="bad_format")
    envelope = Envelope.from_headers(doc["headers"], payload, max_payload_bytes=max_payload_bytes)
    return destination, envelope
