"""Key-aware dead letters (``on_dead="hold"``): the statements a runner runs to release.

With ``hold``, an ordered key whose message goes dead is held at that message: the dead
message and every later message of the key are kept whole in ``inbox_held`` (the later ones
recorded ``parked`` and acknowledged at the broker) until an operator decides with
``outbox inbox dead retry`` or ``purge``. The consumer process then applies the decision, and
the parked messages in seq order, each in a transaction of its own (``resolve_held`` on the
runners; the broker consumers call it on a timer). These generators are the statement
sequences of those transactions, shared by the sync and async runners like ``_record_steps``.
"""

from __future__ import annotations

import datetime as dt
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from inbox._receive import MessageRef, Steps, _record_steps, held_params
from inbox._statements import InboxStatements
from outbox.envelope import Envelope

__all__ = [
    "HeldRow",
    "held_envelope",
    "release_done_steps",
    "release_failure_steps",
    "release_steps",
    "runner_actor",
]


def runner_actor(consumer: str) -> str:
    """Who applied a decision, for the audit: the consumer runner on this host."""
    return f"consumer:{consumer}@{socket.gethostname()}"


@dataclass(frozen=True)
class HeldRow:
    """A row of inbox_held_decided (with its ``decision``) or inbox_parked_ready (without):
    the ``held_columns`` of ``inbox/statements.sql``, read by name."""

    message_id: uuid.UUID
    topic: str
    key: str
    seq: int
    payload: bytes
    content_type: str
    headers: Any
    traceparent: str | None
    created_at: dt.datetime
    #: the database the message came from ('' for a message that names none)
    origin: str = ""
    decision: str | None = None


def held_envelope(row: HeldRow) -> Envelope:
    """An Envelope from an ``inbox_held`` row."""
    return Envelope(
        id=row.message_id,
        topic=row.topic,
        key=row.key,
        seq=int(row.seq),
        payload=bytes(row.payload),
        content_type=row.content_type,
        headers=dict(row.headers or {}),
        traceparent=row.traceparent,
        created_at=row.created_at,
        origin=row.origin or None,
    )


def release_steps(stmts: InboxStatements, ref: MessageRef, message: Any, from_status: str) -> Steps:
    """Make a parked (or, retried, the dead) record a first delivery again, then decide it as
    one: PROCESS in turn, STALE if its seq has passed; None if another release took it."""
    row = yield stmts.unsettle, ref.params(from_status=from_status)
    if row is None:
        return None
    if from_status == "dead":
        yield stmts.unhold, ref.params()
    return (yield from _record_steps(stmts, ref, True, message))


def release_done_steps(
    stmts: InboxStatements, ref: MessageRef, from_status: str, actor: str
) -> Steps:
    """In the release transaction, after the effect: drop the held copy; audit a retry."""
    yield stmts.release_done, ref.params()
    if from_status == "dead":
        yield stmts.audit, ref.params(actor=actor, action="retried", error=None, reason=None)
    return None


def release_failure_steps(
    stmts: InboxStatements,
    ref: MessageRef,
    message: Any,
    error: str,
    max_attempts: int,
    from_status: str,
    actor: str,
) -> Steps:
    """In a transaction of its own after a release's handler failed. A retried dead message
    stays dead and holds its key (decision cleared, audited). A parked one counts an attempt
    and is parked again, or goes dead after ``max_attempts`` and then holds its key itself.
    Returns (attempts, status)."""
    if from_status == "dead":
        yield stmts.retry_failed, ref.params(error=error)
        yield stmts.audit, ref.params(actor=actor, action="retry_failed", error=error, reason=None)
        return None, "dead"
    row = yield stmts.unsettle, ref.params(from_status="parked")
    if row is None:
        return None, "processed"
    failed = yield stmts.record_failure, ref.params(error=error, max_attempts=max_attempts)
    assert failed is not None
    attempts, status = int(failed["attempts"]), str(failed["status"])
    if status == "dead":
        yield stmts.hold_key, held_params(ref, message)
    else:
        yield stmts.repark, ref.params()
    return attempts, status
