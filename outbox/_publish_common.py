"""What ``publish`` and ``publish_batch`` do before and after their I/O, for both flavours:
validation, parameters, result checks.

The I/O is written once, as async code, in ``outbox/_publish_async.py``; the sync flavour
``outbox/_publish_sync.py`` is generated from it by ``tools/async_to_sync.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from outbox._capture import encode_record
from outbox._message import Message, PreparedMessage, prepare
from outbox._statements import ProducerStatements
from outbox.exceptions import OutboxError

__all__ = ["Batch", "build"]


@dataclass(slots=True)
class Batch:
    ids: list[uuid.UUID]  # one per input message, in order
    single: PreparedMessage | None  # the fast path: exactly one distinct message
    rows: list[PreparedMessage]  # the distinct messages, in order

    @classmethod
    def one(cls, p: PreparedMessage) -> Batch:
        """The batch of one message (every ``publish()``): nothing to deduplicate or sort."""
        return cls([p.id], p, [p])

    def statement(self, stmts: ProducerStatements) -> tuple[bytes, dict[str, Any]]:
        """The ledger insert (outbox_wal_pending) and its parameters: each distinct message as
        its id and record."""
        one = self.single
        if one is not None:
            query = stmts.ledger_insert_one
            if one.idempotent:
                query = stmts.ledger_insert_one_idempotent
            return query, {"id": one.id, "record": _record(one)}
        return stmts.ledger_insert, {
            "ids": [p.id for p in self.rows],
            "records": [_record(p) for p in self.rows],
        }


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
    return Batch(
        ids=ids,
        single=rows[0] if len(rows) == 1 else None,
        rows=rows,
    )
