"""Serializing payloads and headers once, in the producer, with errors that say where."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from outbox.exceptions import SerializationError

__all__ = [
    "BYTES_CONTENT_TYPE",
    "JSON_CONTENT_TYPE",
    "JSON_ENCODER",
    "encode_checked_headers",
    "encode_payload",
    "plain_json",
    "to_json_value",
]

JSON_CONTENT_TYPE = "application/json"
BYTES_CONTENT_TYPE = "application/octet-stream"

#: The one JSON encoding of payloads and headers: compact, UTF-8 as it is, no NaN. Plain data
#: (see :func:`_plain`) goes through orjson (:func:`plain_json`), much faster than the
#: standard library on the small objects messages carry; whatever orjson declines (an int
#: beyond 64 bits, nesting deeper than its limit, a lone surrogate) and everything that needs
#: converting first goes through this encoder, made once (json.dumps with arguments builds one
#: per call). The two write the same JSON values; only a float's spelling may differ ("1e16" /
#: "1e+16").
JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)

_HINT = (
    "convert it before publishing (for example str(value) for a Decimal, "
    "value.isoformat() for a time, or pass bytes with a content_type)"
)


def to_json_value(value: Any, where: str) -> Any:
    """Return ``value`` as plain JSON data, or raise SerializationError naming the bad part.

    Accepted: dict with str keys, list, tuple, str, int, finite float, bool, None; and, as
    their standard text forms, uuid.UUID and datetime/date (ISO 8601).
    """
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SerializationError(
                f"{where} is {value!r}, which JSON cannot represent; use null or a string",
                where=where,
                type_name="float",
            )
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SerializationError(
                    f"{where} has a key {k!r} of type {type(k).__name__}; JSON object keys "
                    "must be str",
                    where=where,
                    type_name=type(k).__name__,
                )
            out[k] = to_json_value(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, list | tuple):
        return [to_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    raise SerializationError(
        f"{where} is of type {type(value).__module__}.{type(value).__qualname__}, which "
        f"cannot be serialized to JSON; {_HINT}",
        where=where,
        type_name=type(value).__qualname__,
    )


def _plain(value: Any) -> bool:
    """True if ``value`` is JSON data as it is (exactly dict with str keys, list, tuple, str,
    int, bool, None, finite float): json.dumps takes it unchanged, and the walk of
    :func:`to_json_value` (which names each part for its errors) can be skipped."""
    cls = value.__class__
    if cls is str or cls is int or cls is bool or value is None:
        return True
    if cls is float:
        return math.isfinite(value)
    if cls is dict:
        return all(k.__class__ is str and _plain(v) for k, v in value.items())
    if cls is list or cls is tuple:
        return all(_plain(v) for v in value)
    return False


def plain_json(value: Any) -> bytes | None:
    """``value`` as compact UTF-8 JSON if it is plain data that orjson takes, else None (the
    caller then takes the checked path, which encodes it or says what is wrong)."""
    if _plain(value):
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:
            return None
    return None


def encode_checked_headers(headers: dict[str, str]) -> str:
    """Headers already checked to be a dict of exactly str to str, as JSON object text."""
    return orjson.dumps(headers).decode()


def encode_payload(payload: Any, content_type: str | None) -> tuple[bytes, str]:
    """Serialize a payload: bytes are stored as they are, anything else as UTF-8 JSON."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), content_type or BYTES_CONTENT_TYPE
    fast = plain_json(payload)
    if fast is not None:
        return fast, content_type or JSON_CONTENT_TYPE
    data = payload if _plain(payload) else to_json_value(payload, "payload")
    text = JSON_ENCODER.encode(data)
    try:
        return text.encode("utf-8"), content_type or JSON_CONTENT_TYPE
    except UnicodeEncodeError as exc:
        context = text[max(exc.start - 20, 0) : exc.start]
        raise SerializationError(
            f"payload has a string with a lone surrogate {text[exc.start]!r} (after "
            f"{context!r}), which is not valid Unicode text; decode the bytes it came from "
            "properly, or publish them as a bytes payload",
            where="payload",
            type_name="str",
        ) from exc
