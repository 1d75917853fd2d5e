"""The ledger's record: what a writer writes, what the relay decodes. One home.

In both capture modes (docs/explanation/capture.md) a writer inserts a message as one row of
the ledger, ``outbox_wal_pending``: its id and its record (below), no counter, no lock, no mode
to read. After commit the relay gives the message its per-key ``seq``, records it in
``outbox_messages`` and deletes the ledger row, in one transaction: in 'wal' mode it decodes the
insert from its replication slot (pgoutput), in commit order; in 'polling' mode its ledger
reader (relay/_ledger.py) reads the committed rows, in the order they became visible and, within
one read, the order they were written. The row outlives any slot: a relay whose slot is gone
publishes what the table holds. Writers of older versions emitted the same record as a
transactional logical message (``pg_logical_emit_message(true, PREFIX, record)``); the relay
still decodes those.

Record format v1 (big-endian): version (1 byte, 1), flags (1 byte: 1 = the id comes from an
idempotency key, 2 = ``available_at`` is set), the id (16 bytes), ``available_at`` in Unix
microseconds (8 bytes, 0 when unset), then six fields, each a 4-byte length and that many
bytes: topic, key, content type, traceparent (empty: none), headers (JSON object text),
payload. ``outbox_publish()`` (migrations outbox_0010, outbox_0017, outbox_0024) builds the
same bytes in SQL.
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from outbox._limits import (
    MAX_CONTENT_TYPE_BYTES,
    MAX_HEADER_NAME_BYTES,
    MAX_HEADER_VALUE_BYTES,
    MAX_HEADERS,
    MAX_KEY_BYTES,
    MAX_TOPIC_BYTES,
)
from outbox.exceptions import InvalidMessageError

__all__ = [
    "MODE_POLLING",
    "MODE_WAL",
    "PREFIX",
    "RecordError",
    "WalRecord",
    "decode_record",
    "encode_record",
]

#: the logical message prefix; the version travels in the record too
PREFIX = "outbox.v1"
MODE_POLLING = "polling"
MODE_WAL = "wal"

_VERSION = 1
_IDEMPOTENT = 1
_HAS_AVAILABLE_AT = 2
_HEAD = struct.Struct(">BB16sq")
_LENGTH = struct.Struct(">I")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(slots=True)
class WalRecord:
    """One message as the relay decodes it from the WAL. Made once per message on the relay's
    hot path and never changed after (not frozen: a frozen dataclass's constructor is slower)."""

    id: uuid.UUID
    topic: str
    key: str
    content_type: str
    traceparent: str | None
    headers: str  # JSON object text, as outbox_messages.headers takes it
    payload: bytes
    available_at: dt.datetime | None
    idempotent: bool


def encode_record(
    id: uuid.UUID,
    topic: str,
    key: str,
    content_type: str,
    traceparent: str | None,
    headers: str,
    payload: bytes,
    available_at: dt.datetime | None,
    idempotent: bool,
) -> bytes:
    """The bytes of one message's logical message."""
    flags = _IDEMPOTENT if idempotent else 0
    micros = 0
    if available_at is not None:
        flags |= _HAS_AVAILABLE_AT
        micros = (available_at - _EPOCH) // dt.timedelta(microseconds=1)
    t, k, c, h = topic.encode(), key.encode(), content_type.encode(), headers.encode()
    tp = traceparent.encode() if traceparent else b""
    size = _LENGTH.pack
    return b"".join(
        (
            _HEAD.pack(_VERSION, flags, id.bytes, micros),
            size(len(t)), t,
            size(len(k)), k,
            size(len(c)), c,
            size(len(tp)), tp,
            size(len(h)), h,
            size(len(payload)), payload,
        )
    )  # fmt: skip


class RecordError(InvalidMessageError):
    """A logical message under our prefix that is not a valid record (never written by us)."""

    def __init__(self, message: str | None = None, **data: Any) -> None:
        super().__init__(message, **{"reason": "bad_format", **data})


def decode_record(data: bytes) -> WalRecord:
    """Parse one record; :class:`RecordError` names what is wrong with a malformed one."""
    end = len(data)
    if end < _HEAD.size:
        raise RecordError(f"record of {end} bytes is shorter than its header")
    version, flags, raw_id, micros = _HEAD.unpack_from(data, 0)
    if version != _VERSION:
        raise RecordError(f"record version {version} is not {_VERSION}: upgrade the relay")
    fields: list[bytes] = []
    offset = _HEAD.size
    unpack = _LENGTH.unpack_from
    for _ in range(6):
        if offset + 4 > end:
            raise RecordError("record ends inside a field length")
        (size,) = unpack(data, offset)
        offset += 4
        if offset + size > end:
            raise RecordError("record ends inside a field")
        fields.append(data[offset : offset + size])
        offset += size
    if offset != end:
        raise RecordError(f"{end - offset} bytes after the record's last field")
    try:
        topic = fields[0].decode()
        key = fields[1].decode()
        content_type = fields[2].decode()
        traceparent = fields[3].decode()
        headers = fields[4].decode()
    except UnicodeDecodeError as exc:
        raise RecordError(f"a text field is not UTF-8: {exc}") from exc
    # What the relay would fail to write (a NUL in a text column, an index entry too large)
    # would fail its batch on every retry: refused here, with publish()'s own bounds.
    for name, value, size, limit in (
        ("topic", topic, len(fields[0]), MAX_TOPIC_BYTES),
        ("key", key, len(fields[1]), MAX_KEY_BYTES),
    ):
        if not value.strip() or "\x00" in value or size > limit:
            raise RecordError(f"the {name} is blank, has a NUL or is longer than {limit} bytes")
    if len(fields[2]) > MAX_CONTENT_TYPE_BYTES or "\x00" in content_type:
        raise RecordError(f"the content type has a NUL or is over {MAX_CONTENT_TYPE_BYTES} bytes")
    if len(fields[3]) > MAX_HEADER_VALUE_BYTES or "\x00" in traceparent:
        raise RecordError(f"the traceparent has a NUL or is over {MAX_HEADER_VALUE_BYTES} bytes")
    if headers not in ("", "{}"):
        _check_headers(fields[4])
    available_at = None
    if flags & _HAS_AVAILABLE_AT:
        try:
            available_at = _EPOCH + dt.timedelta(microseconds=micros)
        except OverflowError as exc:
            raise RecordError(f"available_at of {micros} microseconds is out of range") from exc
    # positional: the order of WalRecord's fields
    return WalRecord(
        uuid.UUID(bytes=raw_id),
        topic,
        key,
        content_type,
        traceparent or None,
        headers,
        fields[5],
        available_at,
        bool(flags & _IDEMPOTENT),
    )


def _check_headers(raw: bytes) -> None:
    """The headers field is a JSON object of at most MAX_HEADERS text values (publish()'s
    bounds), without NUL (which a jsonb column refuses)."""
    limit = MAX_HEADERS * (MAX_HEADER_NAME_BYTES + MAX_HEADER_VALUE_BYTES) * 6 + 2
    if len(raw) > limit:
        raise RecordError(f"the headers are {len(raw)} bytes, more than any publish() writes")
    try:
        headers = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"the headers are not JSON: {exc}") from exc
    if not isinstance(headers, dict) or len(headers) > MAX_HEADERS:
        raise RecordError(f"the headers are not a JSON object of at most {MAX_HEADERS} entries")
    for name, value in headers.items():
        if (
            not isinstance(value, str)
            or "\x00" in name
            or "\x00" in value
            or len(name.encode("utf-8", "surrogatepass")) > MAX_HEADER_NAME_BYTES
            or len(value.encode("utf-8", "surrogatepass")) > MAX_HEADER_VALUE_BYTES
        ):
            raise RecordError(
                "a header is not text without NUL within publish()'s bounds "
                f"({MAX_HEADER_NAME_BYTES} bytes a name, {MAX_HEADER_VALUE_BYTES} a value)"
            )
