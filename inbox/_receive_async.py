"""``receive_async`` and ``record_async``: the inbox record in the caller's transaction.

The decisions are :func:`~inbox._receive_common._record_steps`; this module only runs the
statements they yield. The common case, a new message for an unordered consumer, is one
statement, run without the generator (:func:`record_on_async`): the per-message path of
``receive_async`` and of the runners.

Both flavours are written once, as async code, in ``inbox/_receive_async.py``;
``inbox/_receive_sync.py`` is generated from it by ``tools/async_to_sync.py``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import psycopg

from inbox._receive_common import (
    AsyncRaw,
    MessageRef,
    Step,
    Verdict,
    _decision_steps,
    as_ref,
    receive_answer,
    translate,
)
from inbox._statements import InboxStatements, inbox_statements
from outbox.kit import AsyncpgConnection, AsyncTarget, resolve_async, row_by_name, rows_by_name

__all__ = ["receive_async", "record_async", "record_on_async", "run_steps_async"]


async def run_steps_async(
    raw: AsyncRaw,
    stmts: InboxStatements,
    steps: Generator[Step, Any, Any],
    *,
    all_rows: bool = False,
) -> Any:
    """Run a statement generator on a driver connection; return its result. Each statement's
    first row (None: no row) is sent back, or ``(row count,)`` when it returns no rows; with
    ``all_rows`` (batches) the list of its rows. Errors are psycopg's classes (asyncpg's are
    raised as psycopg's class of the same SQLSTATE: see ``outbox/_asyncpg.py``)."""
    try:
        async with raw.cursor() as cur:
            step = next(steps)
            while True:
                await cur.execute(step[0], step[1])
                if all_rows:
                    rows = rows_by_name(cur, await cur.fetchall()) if cur.description else []
                    step = steps.send(rows)
                elif cur.description:
                    step = steps.send(row_by_name(cur, await cur.fetchone()))
                else:
                    step = steps.send({"rowcount": cur.rowcount})
    except StopIteration as done:
        return done.value
    except psycopg.Error as exc:
        raise translate(exc, stmts) from exc


async def record_on_async(
    raw: AsyncRaw,
    stmts: InboxStatements,
    ref: MessageRef,
    ordered: bool,
    message: Any = None,
) -> Verdict:
    """The inbox record's steps on a driver connection, with their common case run directly: a
    new message for an unordered consumer is inbox_record alone (one statement, one round
    trip, no generator to drive). The other cases (a duplicate, an ordered consumer) go on
    with the same steps, from the row count inbox_record gave."""
    try:
        if isinstance(raw, AsyncpgConnection):  # async-only: asyncpg's wrapper takes names
            async with raw.cursor() as wrapped:
                await wrapped.execute(stmts.record, ref.params())
                inserted = wrapped.rowcount
        else:
            inserted = (
                await raw.execute(
                    stmts.record_args, (ref.consumer, ref.id, ref.topic, ref.key, ref.seq)
                )
            ).rowcount
    except psycopg.Error as exc:
        raise translate(exc, stmts) from exc
    if inserted != 0 and not ordered:
        return Verdict.PROCESS
    steps = _decision_steps(stmts, ref, ordered, message, ref.params(), {"rowcount": inserted})
    verdict: Verdict = await run_steps_async(raw, stmts, steps)
    return verdict


async def record_async(
    target: AsyncTarget,
    *,
    consumer: str,
    message: Any,
    ordered: bool = False,
    schema: str | None = None,
) -> Verdict:
    """Record ``message`` for ``consumer`` in ``target``'s transaction and say what to do.

    Call it first in the transaction that applies the message's effect. See :class:`Verdict`.
    With ``ordered`` the per-key order guard is applied (the key's position is locked until
    the transaction ends). OUT_OF_ORDER leaves no record: roll back and redeliver later.
    """
    ref = as_ref(consumer, message, ordered=ordered)
    stmts = inbox_statements(schema)
    return await record_on_async(await resolve_async(target), stmts, ref, ordered, message)


async def receive_async(
    target: AsyncTarget,
    *,
    consumer: str,
    message: Any,
    ordered: bool = False,
    schema: str | None = None,
) -> bool:
    """Record ``message`` as processed by ``consumer`` in ``target``'s transaction.

    Returns True when the caller must apply the effect now (in the same transaction), False
    for a duplicate (or, with ``ordered``, a stale message, or one parked behind a held dead
    message of its key): apply nothing, commit, ack.
    A duplicate is never an exception. With ``ordered``, a message ahead of a gap raises
    :class:`~inbox.OutOfOrderError` (nothing recorded): roll back and redeliver later.
    ``target``: a SQLAlchemy AsyncSession or AsyncConnection, or a psycopg AsyncConnection,
    inside a transaction.
    """
    # record_async(), unfolded: this runs once per message
    ref = as_ref(consumer, message, ordered=ordered)
    raw = await resolve_async(target)
    verdict = await record_on_async(raw, inbox_statements(schema), ref, ordered, message)
    return verdict is Verdict.PROCESS or receive_answer(verdict, message)
