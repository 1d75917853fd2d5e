"""What ``publish`` and ``publish_batch`` do before and after their I/O, for both flavours:
validation, parameters, result checks.

The I/O is written once, as async code, in ``outbox/_publish_async.py``; the sync flavour
``outbox/_publish_sync.py`` is generated from it by ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from outbox._capture import encode_record
from outbox._message import Message, PreparedMessage, prepare
from outbox._statements import ProducerStatements
from outbox.exceptions import OutboxError

__all__ = ["Batch", "build", "checked_rows"]


@dataclass(slots=True)
class Batch:
    ids: list[uuid.UUID]  # one per input message, in order
    lock_keys: list[int]
    single: PreparedMessage | None  # the fast path: exactly one distinct message
    rows: list[PreparedMessage]  # the distinct messages, in order

    @classmethod
    def one(cls, p: PreparedMessage) -> Batch:
        """The batch of one message (every ``publish()``): nothing to deduplicate or sort."""
        return cls([p.id], [_lock_key(p.id)] if p.idempotent else [], p, [p])

    def wal_statement(self, stmts: ProducerStatements) -> tuple[bytes, dict[str, Any]]:
        """The 'wal' mode insert into outbox_wal_pending and its parameters: each distinct
        message as its id and record."""
        if self.single is not None:
            return stmts.wal_emit_one, {"id": self.single.id, "record": _record(self.single)}
        return stmts.wal_emit, {
            "ids": [p.id for p in self.rows],
            "records": [_record(p) for p in self.rows],
        }

    def lock_params(self) -> dict[str, Any]:
        """Parameters of the idempotency lock: every (topic, key) of the batch, then the ids."""
        pairs = sorted({(p.topic, p.key) for p in self.rows})
        return {
            "row_topics": [t for t, _ in pairs],
            "row_keys": [k for _, k in pairs],
            "lock_keys": self.lock_keys,
        }

    def statement(self, stmts: ProducerStatements) -> tuple[bytes, dict[str, Any]]:
        """The insert statement and its parameters."""
        one = self.single
        if one is None:
            rows = self.rows
            params = {
                "ids": [p.id for p in rows],
                "topics": [p.topic for p in rows],
                "keys": [p.key for p in rows],
                "headers": [p.headers for p in rows],
                "payloads": [p.payload for p in rows],
                "content_types": [p.content_type for p in rows],
                "traceparents": [p.traceparent for p in rows],
                "available_ats": [p.available_at for p in rows],
            }
            return stmts.insert, params
        params = {
            "id": one.id,
            "topic": one.topic,
            "key": one.key,
            "headers": one.headers,
            "payload": one.payload,
            "content_type": one.content_type,
            "traceparent": one.traceparent,
            "available_at": one.available_at,
        }
        return (stmts.insert_one_idempotent if one.idempotent else stmts.insert_one), params


def _record(p: PreparedMessage) -> bytes:
    """One distinct message as a record (outbox/_capture.py)."""
    return encode_record(
        p.id,
        p.topic,
        p.key,
        p.content_type,
        p.traceparent,
        p.headers,
        p.payload,
        p.available_at,
        p.idempotent,
    )


def _lock_key(msg_id: uuid.UUID) -> int:
    """The idempotency lock's key of a derived id: its first four bytes as a signed int4."""
    return int.from_bytes(msg_id.bytes[:4], "big", signed=True)


def build(messages: Iterable[Message], max_payload_bytes: int) -> Batch:
    """Validate everything first: a bad message raises before any statement is sent."""
    prepared: list[PreparedMessage] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise OutboxError(
                f"messages[{index}] is a {type(message).__name__}; pass outbox.Message objects"
            )
        prepared.append(prepare(message, max_payload_bytes=max_payload_bytes))
    if len(prepared) == 1:
        return Batch.one(prepared[0])
    ids = [p.id for p in prepared]
    unique: dict[uuid.UUID, PreparedMessage] = {}
    for p in prepared:  # the same idempotency key twice in one batch is one message
        unique.setdefault(p.id, p)
    rows = list(unique.values())
    lock_keys = sorted({_lock_key(p.id) for p in rows if p.idempotent})
    return Batch(
        ids=ids,
        lock_keys=lock_keys,
        single=rows[0] if len(rows) == 1 else None,
        rows=rows,
    )


def checked_rows(rows: Sequence[tuple[Any, ...]]) -> tuple[list[str], str | None]:
    """Check the insert's result; return the writing transaction ids for the doorbell, and the
    capture mode the insert read (None without rows)."""
    tx_ids: set[str] = set()
    mode = None
    for msg_id, seq, tx_id, fresh, row_mode, _counter in rows:
        mode = row_mode  # read once per statement: the same in every row
        if fresh and seq is None:
            # Only possible if someone inserted this id without the idempotency lock. The
            # sequence number taken for it would leave a gap, so refuse the whole transaction.
            raise OutboxError(
                f"message {msg_id} was inserted concurrently by another writer; roll back and "
                "retry the transaction",
                message_id=msg_id,
            )
        if tx_id is not None:
            tx_ids.add(tx_id)
    return sorted(tx_ids), mode
