"""``publish`` and ``publish_async``: write messages in the caller's transaction.

Both twins share the pure parts (validation, parameters, result checks); each twin is only the
I/O. There is deliberately no variant that opens its own transaction: a message written apart
from the business rows would defeat the pattern.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from outbox._capture import (
    MODE_WAL,
    encode_record,
    known_mode,
    remember_mode,
    slot_check_due,
    slot_checked,
)
from outbox._connections import AsyncTarget, Target, resolve_async, resolve_sync
from outbox._errors import translate
from outbox._message import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Message,
    PreparedMessage,
    prepare,
    prepare_fields,
)
from outbox._statements import ProducerStatements, producer_statements
from outbox._wakeup import ring_after_commit
from outbox.exceptions import OutboxError

__all__ = ["publish", "publish_async", "publish_batch", "publish_batch_async"]


@dataclass(slots=True)
class _Batch:
    ids: list[uuid.UUID]  # one per input message, in order
    lock_keys: list[int]
    single: PreparedMessage | None  # the fast path: exactly one distinct message
    rows: list[PreparedMessage]  # the distinct messages, in order

    @classmethod
    def one(cls, p: PreparedMessage) -> _Batch:
        """The batch of one message (every ``publish()``): nothing to deduplicate or sort."""
        return cls([p.id], [_lock_key(p.id)] if p.idempotent else [], p, [p])

    def wal_statement(
        self, stmts: ProducerStatements, checked: bool
    ) -> tuple[bytes, dict[str, Any]]:
        """The WAL emit statement and its parameters: each distinct message as a record.
        ``checked``: the variant that also checks the slot (outbox/_statements.py)."""
        if self.single is not None:
            stmt = stmts.wal_emit_one_checked if checked else stmts.wal_emit_one
            return stmt, {"record": _record(self.single)}
        stmt = stmts.wal_emit_checked if checked else stmts.wal_emit
        return stmt, {"records": [_record(p) for p in self.rows]}

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
    """One distinct message as a WAL record."""
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


def _build(messages: Iterable[Message], max_payload_bytes: int) -> _Batch:
    """Validate everything first: a bad message raises before any statement is sent."""
    prepared: list[PreparedMessage] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise OutboxError(
                f"messages[{index}] is a {type(message).__name__}; pass outbox.Message objects"
            )
        prepared.append(prepare(message, max_payload_bytes=max_payload_bytes))
    if len(prepared) == 1:
        return _Batch.one(prepared[0])
    ids = [p.id for p in prepared]
    unique: dict[uuid.UUID, PreparedMessage] = {}
    for p in prepared:  # the same idempotency key twice in one batch is one message
        unique.setdefault(p.id, p)
    rows = list(unique.values())
    lock_keys = sorted({_lock_key(p.id) for p in rows if p.idempotent})
    return _Batch(
        ids=ids,
        lock_keys=lock_keys,
        single=rows[0] if len(rows) == 1 else None,
        rows=rows,
    )


def _tx_ids(rows: Sequence[tuple[Any, ...]]) -> list[str]:
    """Check the insert's result; return the writing transaction ids for the doorbell."""
    tx_ids: set[str] = set()
    for msg_id, seq, tx_id, fresh, *_ in rows:
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
    return sorted(tx_ids)


def publish_batch(
    target: Target,
    messages: Iterable[Message],
    *,
    schema: str | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    wakeup: bool = False,
) -> list[uuid.UUID]:
    """Write ``messages`` in ``target``'s transaction, in one round trip; return their ids.

    ``target`` is a SQLAlchemy ``Session`` or ``Connection``, or a ``psycopg.Connection``.
    Messages become visible to the relay only when the caller commits; a rollback removes
    them. A polling relay sees the commit by itself (its commit watch, ``relay._watch``): the
    write costs one ``nextval`` more and nothing after the commit. ``wakeup=True`` also rings
    this process's doorbell (``outbox._wakeup``: a NOTIFY from a background thread once the
    transaction has committed), for relays that run without the watch; it costs the producer
    a check and a NOTIFY per few milliseconds of commits.
    """
    return _write(target, _build(messages, max_payload_bytes), schema, wakeup)


def _write(target: Target, batch: _Batch, schema: str | None, wakeup: bool) -> list[uuid.UUID]:
    """:func:`publish_batch`'s I/O, once the batch is validated."""
    if not batch.ids:
        return []
    raw = resolve_sync(target)
    stmts = producer_statements(schema)
    try:
        with raw.cursor() as cur:
            refused = False
            if known_mode(raw) in (MODE_WAL, None):
                checked = slot_check_due(raw)
                cur.execute(*batch.wal_statement(stmts, checked))
                if cur.rowcount == len(batch.rows):
                    if checked:
                        slot_checked(raw)
                    return batch.ids  # the relay decodes them after commit
                remember_mode(raw, None)  # not in 'wal' mode (any more), or no slot: rows
                refused = True
            if batch.lock_keys:
                cur.execute(stmts.idempotency_lock, batch.lock_params())
            cur.execute(*batch.statement(stmts))
            rows = cur.fetchall()
    except pg_errors.UndefinedTable as exc:
        raise translate(exc, schema=schema) from exc
    if rows:
        remember_mode(raw, rows[0][4], refused=refused)
    tx_ids = _tx_ids(rows)
    if wakeup and tx_ids:
        ring_after_commit(target, raw, tx_ids)
    return batch.ids


async def publish_batch_async(
    target: AsyncTarget,
    messages: Iterable[Message],
    *,
    schema: str | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    wakeup: bool = False,
) -> list[uuid.UUID]:
    """Async twin of :func:`publish_batch` for ``AsyncSession``, ``AsyncConnection`` (SQLAlchemy)
    and ``psycopg.AsyncConnection``."""
    return await _write_async(target, _build(messages, max_payload_bytes), schema, wakeup)


async def _write_async(
    target: AsyncTarget, batch: _Batch, schema: str | None, wakeup: bool
) -> list[uuid.UUID]:
    """:func:`publish_batch_async`'s I/O, once the batch is validated."""
    if not batch.ids:
        return []
    raw = await resolve_async(target)
    stmts = producer_statements(schema)
    try:
        async with raw.cursor() as cur:
            refused = False
            if known_mode(raw) in (MODE_WAL, None):
                checked = slot_check_due(raw)
                await cur.execute(*batch.wal_statement(stmts, checked))
                if cur.rowcount == len(batch.rows):
                    if checked:
                        slot_checked(raw)
                    return batch.ids  # the relay decodes them after commit
                remember_mode(raw, None)
                refused = True
            if batch.lock_keys:
                await cur.execute(stmts.idempotency_lock, batch.lock_params())
            await cur.execute(*batch.statement(stmts))
            rows = await cur.fetchall()
    except pg_errors.UndefinedTable as exc:
        raise translate(exc, schema=schema) from exc
    if rows:
        remember_mode(raw, rows[0][4], refused=refused)
    tx_ids = _tx_ids(rows)
    if wakeup and tx_ids:
        ring_after_commit(target, raw, tx_ids)
    return batch.ids


def publish(
    target: Target,
    *,
    topic: str,
    key: str,
    payload: Any,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    content_type: str | None = None,
    deliver_after: dt.timedelta | None = None,
    available_at: dt.datetime | None = None,
    schema: str | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    wakeup: bool = False,
) -> uuid.UUID:
    """Write one message in ``target``'s transaction and return its id.

    See :class:`outbox.Message` for the fields. Publishing an ``idempotency_key`` that was
    already published on this topic writes nothing and returns the same id, as long as the
    first message is still in the outbox: once retention has deleted it, the same id is
    written again under the key's next seq (an ordered inbox applies it once, in turn).
    """
    fields = (topic, key, payload, headers, idempotency_key, content_type, deliver_after)
    batch = _Batch.one(prepare_fields(*fields, available_at, max_payload_bytes))
    return _write(target, batch, schema, wakeup)[0]


async def publish_async(
    target: AsyncTarget,
    *,
    topic: str,
    key: str,
    payload: Any,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    content_type: str | None = None,
    deliver_after: dt.timedelta | None = None,
    available_at: dt.datetime | None = None,
    schema: str | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    wakeup: bool = False,
) -> uuid.UUID:
    """Async twin of :func:`publish`."""
    fields = (topic, key, payload, headers, idempotency_key, content_type, deliver_after)
    batch = _Batch.one(prepare_fields(*fields, available_at, max_payload_bytes))
    ids = await _write_async(target, batch, schema, wakeup)
    return ids[0]


# psycopg is imported for its types in annotations of the resolved connections.
_ = psycopg
