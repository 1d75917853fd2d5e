# This file is generated from outbox/_publish_async.py by tools/async_to_sync.py: do not edit it.
"""``publish`` and ``publish_batch``: write messages in the caller's transaction.

There is deliberately no variant that opens its own transaction: a message written apart
from the business rows would defeat the pattern.

Both flavours are written once, as async code, in ``outbox/_publish_async.py``;
``outbox/_publish_sync.py`` is generated from it by ``tools/async_to_sync.py``. What both do
before and after their I/O is ``outbox/_publish_common.py``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from psycopg import errors as pg_errors

from outbox._capture import MODE_WAL, known_mode, remember_mode
from outbox._connections import Target, resolve_sync
from outbox._errors import translate
from outbox._message import DEFAULT_MAX_PAYLOAD_BYTES, Message, prepare_fields
from outbox._publish_common import Batch, build, checked_rows
from outbox._statements import producer_statements
from outbox._wakeup import ring_after_commit

__all__ = ["publish", "publish_batch"]


def publish_batch(
    target: Target,
    messages: Iterable[Message],
    *,
    schema: str | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    wakeup: bool = False,
) -> list[uuid.UUID]:
    """Write ``messages`` in ``target``'s transaction, in one round trip; return their ids.

    ``target`` is a SQLAlchemy ``Session`` or ``Connection``, or a
    ``psycopg.Connection``. Messages become visible to the relay only when the caller
    commits; a rollback removes them. A polling relay sees the commit by itself (its commit
    watch, ``relay._watch``): the write costs one ``nextval`` more and nothing after the
    commit. ``wakeup=True`` also rings this process's doorbell (``outbox._wakeup``: a NOTIFY
    from a background thread once the transaction has committed), for relays that run without
    the watch; it costs the producer a check and a NOTIFY per few milliseconds of commits.
    """
    return _write(target, build(messages, max_payload_bytes), schema, wakeup)


def _write(target: Target, batch: Batch, schema: str | None, wakeup: bool) -> list[uuid.UUID]:
    """:func:`publish_batch`'s I/O, once the batch is validated."""
    if not batch.ids:
        return []
    raw = resolve_sync(target)
    stmts = producer_statements(schema)
    try:
        with raw.cursor() as cur:
            if known_mode(raw) in (MODE_WAL, None):
                cur.execute(*batch.wal_statement(stmts))
                if cur.rowcount == len(batch.rows):
                    return batch.ids  # the relay publishes them after commit
                cur.execute(stmts.capture_mode)
                row = cur.fetchone()
                if row is not None and row[0] == MODE_WAL:
                    # the others were pending already: an idempotency key published again
                    # before the relay recorded it, a no-op (the first write wins)
                    remember_mode(raw, MODE_WAL)
                    return batch.ids
                remember_mode(raw, None)  # not in 'wal' mode (any more): rows
            if batch.lock_keys:
                cur.execute(stmts.idempotency_lock, batch.lock_params())
            cur.execute(*batch.statement(stmts))
            rows = cur.fetchall()
    except pg_errors.UndefinedTable as exc:
        raise translate(exc, schema=schema) from exc
    tx_ids, mode = checked_rows(rows)
    if rows:
        remember_mode(raw, mode)
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
    batch = Batch.one(prepare_fields(*fields, available_at, max_payload_bytes))
    ids = _write(target, batch, schema, wakeup)
    return ids[0]
