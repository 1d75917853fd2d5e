"""The WAL capture mode's record: what a writer emits, what the relay decodes. One home.

In 'wal' mode (docs/explanation/capture.md) a message is not a row: ``publish()`` emits it as a
transactional logical message (``pg_logical_emit_message(true, PREFIX, record)``), which
PostgreSQL writes to the WAL only, and decodes to the relay's replication slot only if the
transaction commits, in commit order. The relay gives it its per-key ``seq`` and records it.

Record format v1 (big-endian): version (1 byte, 1), flags (1 byte: 1 = the id comes from an
idempotency key, 2 = ``available_at`` is set), the id (16 bytes), ``available_at`` in Unix
microseconds (8 bytes, 0 when unset), then six fields, each a 4-byte length and that many
bytes: topic, key, content type, traceparent (empty: none), headers (JSON object text),
payload. ``outbox_publish()`` (migration outbox_0010) builds the same bytes in SQL.

Which mode a database is in is the one row of ``outbox_capture``. A writer learns it from its
own statements: a connection's first publish tries the WAL emit, which emits nothing (and says
so) unless the mode is 'wal'; the polling insert returns the mode, so a switch to 'wal' is seen
at the next publish. So a writer that still believes the
wrong mode never loses a message: a row written in 'wal' mode is published by the relay's
polling loop, which keeps running; a WAL emit refused in 'polling' mode is written as a row.

The emit is also refused in 'wal' mode while the database has no slot that decodes it (the
slot the row names is missing, invalidated, or another database's: outbox/statements.sql):
the writer then writes rows, and tries the WAL again after :data:`REFUSED_RETRY_SECONDS`
rather than on every publish (the row then costs no extra round trip). That slot check reads
the server's whole slot array, so a connection makes it on its first emit and then at most
every :data:`SLOT_CHECK_SECONDS`; the emits in between check the mode only.
"""

from __future__ import annotations

import datetime as dt
import struct
import time
import uuid
import weakref
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
    "REFUSED_RETRY_SECONDS",
    "SLOT_CHECK_SECONDS",
    "RecordError",
    "WalRecord",
    "decode_record",
    "encode_record",
    "known_mode",
    "remember_mode",
    "slot_check_due",
    "slot_checked",
]

#: the logical message prefix; the version travels in the record too
PREFIX = "outbox.v1"
MODE_POLLING = "polling"
MODE_WAL = "wal"
#: after the server refused a WAL emit in 'wal' mode (no slot of this database decodes it), a
#: connection writes rows for this long before it tries the WAL again
REFUSED_RETRY_SECONDS = 1.0
#: how long a connection's emits trust the slot check its last checked emit passed: a slot
#: dropped or invalidated meanwhile costs at most this much more of what it would lose anyway
SLOT_CHECK_SECONDS = 0.1

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


# What each connection last learnt of the mode (weakly keyed: a closed, collected connection
# leaves nothing behind): a mode, or the monotonic time until which it writes rows because its
# emit was refused in 'wal' mode. Only a hint: every statement checks the mode again in the
# server.
_modes: weakref.WeakKeyDictionary[Any, str | float] = weakref.WeakKeyDictionary()


def known_mode(raw: Any) -> str | None:
    """The mode ``raw`` last saw; None before its first publish (which then tries the WAL
    emit first: in 'polling' mode that costs one round trip, once per connection)."""
    mode = _modes.get(raw)
    if isinstance(mode, float):  # refused in 'wal' mode: rows until then, then the WAL again
        if time.monotonic() < mode:
            return MODE_POLLING
        _modes[raw] = MODE_WAL
        return MODE_WAL
    return mode


def remember_mode(raw: Any, mode: str | None, *, refused: bool = False) -> None:
    """Note what ``raw``'s last statement said of the mode (None: not 'wal'). ``refused``: this
    publish's WAL emit was refused, so a 'wal' answer means the database has no usable slot:
    write rows for :data:`REFUSED_RETRY_SECONDS`."""
    if mode != MODE_WAL:
        _modes[raw] = MODE_POLLING
    elif refused:
        _modes[raw] = time.monotonic() + REFUSED_RETRY_SECONDS
    elif not isinstance(_modes.get(raw), float):
        _modes[raw] = MODE_WAL


# Until when each connection's emits may skip the slot check (monotonic time; weakly keyed).
_slot_checked: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def slot_check_due(raw: Any) -> bool:
    """Whether ``raw``'s next emit must check the slot (its first, then every
    :data:`SLOT_CHECK_SECONDS`)."""
    return time.monotonic() >= _slot_checked.get(raw, 0.0)


def slot_checked(raw: Any) -> None:
    """``raw``'s checked emit passed: its emits skip the check for a while."""
    _slot_checked[raw] = time.monotonic() + SLOT_CHECK_SECONDS
