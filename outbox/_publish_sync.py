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

from outbox._connections import Target, resolve_sync
from outbox._errors import translate
from outbox._message import DEFAULT_MAX_PAYLOAD_BYTES, Message, prepare_fields
from outbox._publish_common import Batch, build
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
    commits; a rollback removes them. Each message is one row of the outbox's ledger
    (``outbox_wal_pending``), in both capture modes: the relay numbers it per (topic, key) and
    publishes it once the transaction has committed. ``wakeup=True`` also rings this
    process's doorbell (``outbox._wakeup``: a NOTIFY from a background thread once the
    transaction has committed), so a polling relay looks at once instead of at its next poll;
    it costs the producer one round trip, a check and a NOTIFY per few milliseconds of commits.
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
            cur.execute(*batch.statement(stmts))
            if wakeup:
                cur.execute(stmts.current_xact)
                row = cur.fetchone()
                if row is not None:
                    ring_after_commit(target, raw, [str(row[0])])
    except pg_errors.UndefinedTable as exc:
        raise translate(exc, schema=schema) from exc
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
