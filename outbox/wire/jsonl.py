"""JSON lines, for the ``stdout:`` and ``file:`` debugging sinks: one message per line.

``{"destination": ..., "headers": {...}, "payload": "<text>"}``, with ``"payload_base64"``
instead of ``"payload"`` when the body is not valid UTF-8.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from outbox.envelope import Envelope

__all__ = ["decode", "encode"]


def encode(envelope: Envelope, destination: str) -> str:
    """One line, ending in a newline."""
    doc: dict[str, Any] = {"destination": destination, "headers": envelope.to_headers()}
    try:
        doc["payload"] = envelope.payload.decode("utf-8")
    except UnicodeDecodeError:
        doc["payload_base64"] = base64.b64encode(envelope.payload).decode("ascii")
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"


def decode(line: str) -> tuple[str, Envelope]:
    """``(destination, envelope)`` from one line written by a sink."""
    doc = json.loads(line)
    if "payload" in doc:
        payload = doc["payload"].encode("utf-8")
    else:
        payload = base64.b64decode(doc["payload_base64"])
    return doc["destination"], Envelope.from_headers(doc["headers"], payload)
