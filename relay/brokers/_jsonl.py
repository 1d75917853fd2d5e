"""JSON-lines rendering shared by the ``stdout:`` and ``file:`` debugging sinks.

One line per message: ``{"destination": ..., "headers": {...}, "payload": "<text>"}``, or
``"payload_base64"`` instead of ``"payload"`` when the body is not valid UTF-8. Read a line back
with :func:`decode_line`.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from outbox.envelope import Envelope

__all__ = ["decode_line", "encode_line"]


def encode_line(env: Envelope, destination: str) -> str:
    doc: dict[str, Any] = {"destination": destination, "headers": env.to_headers()}
    try:
        doc["payload"] = env.payload.decode("utf-8")
    except UnicodeDecodeError:
        doc["payload_base64"] = base64.b64encode(env.payload).decode("ascii")
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"


def decode_line(line: str) -> tuple[str, Envelope]:
    """``(destination, envelope)`` from one line written by a sink."""
    doc = json.loads(line)
    if "payload" in doc:
        payload = doc["payload"].encode("utf-8")
    else:
        payload = base64.b64decode(doc["payload_base64"])
    return doc["destination"], Envelope.from_headers(doc["headers"], payload)
