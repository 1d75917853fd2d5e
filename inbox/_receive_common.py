"""What ``receive`` and ``record`` decide, for both flavours: the message's ref, the verdicts,
and the decisions as a small generator of statements (:func:`_record_steps`).

The I/O is in ``inbox/_receive_async.py``, written once as async code; the sync flavour
``inbox/_receive_sync.py`` is generated from it (``tools/async_to_sync.py``).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeAlias

import psycopg
from psycopg import errors as pg_errors
from psycopg.types.json import Jsonb

from inbox._statements import InboxStatements
from inbox.exceptions import ConcurrentDeliveryError, OutOfOrderError
from outbox.exceptions import InvalidMessageError
from outbox.kit import MAX_KEY_BYTES, MAX_TOPIC_BYTES, check_text
from outbox.kit import AsyncRaw as AsyncRaw
from outbox.kit import translate as translate_database_error

__all__ = [
    "AsyncRaw",
    "MessageRef",
    "Raw",
    "Step",
    "Steps",
    "Verdict",
    "as_ref",
    "held_params",
    "invalid_ref",
    "receive_answer",
    "translate",
]

#: What the sync calls run their statements on (the async calls: :data:`AsyncRaw`).
Raw: TypeAlias = "psycopg.Connection[Any]"

#: One statement to run and its parameters; the generator is sent the statement's first row
#: (None: no row), or ``(row count,)`` for a statement that returns no rows (no RETURNING).
Step = tuple[bytes, dict[str, Any]]
Steps = Generator[Step, dict[str, Any] | None, Any]


class Verdict(enum.Enum):
    """What the inbox says about a delivery, decided in the caller's transaction."""

    #: first delivery (and next in line, when ordered): apply the effect now
    PROCESS = "process"
    #: already processed (or dead) for this consumer: no effect, acknowledge
    DUPLICATE = "duplicate"
    #: ordered: older than the key's last applied message: no effect, acknowledge
    STALE = "stale"
    #: ordered: a predecessor is missing: nothing was recorded, redeliver later
    OUT_OF_ORDER = "out_of_order"
    #: ordered, key held behind a dead message (on_dead="hold"): kept in the database, applied
    #: once an operator retries or purges the dead message; no effect now, acknowledge
    PARKED = "parked"


@dataclass(slots=True)
class MessageRef:
    """What the inbox needs of a message: its id, topic, key and per-key sequence number.
    Made once per message on the consumer's hot path and never changed after: not frozen
    because a frozen dataclass's constructor costs several times a plain one's."""

    consumer: str
    id: uuid.UUID
    topic: str
    key: str
    seq: int | None
    #: the publishing database (the envelope's origin); '' for a message without one
    origin: str = ""

    def params(self, **extra: Any) -> dict[str, Any]:
        base = {
            "consumer": self.consumer,
            "id": self.id,
            "topic": self.topic,
            "key": self.key,
            "seq": self.seq,
            "origin": self.origin,
        }
        return base | extra if extra else base


#: Consumer names and topics that passed check_text (both have MAX_TOPIC_BYTES): a process
#: has a few of each, so each is checked once, not per message. Bounded against a caller that
#: makes a new name per message.
_CHECKED_NAMES: set[str] = set()
_MAX_CHECKED_NAMES = 1024


def _checked_name(value: Any, what: str) -> None:
    if value.__class__ is str and value in _CHECKED_NAMES:
        return
    check_text(value, what, MAX_TOPIC_BYTES)
    if value.__class__ is str and len(_CHECKED_NAMES) < _MAX_CHECKED_NAMES:
        _CHECKED_NAMES.add(value)


def as_ref(consumer: str, message: Any, *, ordered: bool = False) -> MessageRef:
    """Validate ``message`` (an Envelope or any object with id/topic/key/seq) for ``consumer``."""
    _checked_name(consumer, "consumer")
    try:
        msg_id, topic, key = message.id, message.topic, message.key
    except AttributeError:
        missing = [a for a in ("id", "topic", "key") if not hasattr(message, a)]
        raise InvalidMessageError(
            f"{type(message).__name__} has no {', '.join(missing)}: pass an "
            "outbox.envelope.Envelope (or an object with id, topic, key and seq)"
        ) from None
    if not isinstance(msg_id, uuid.UUID):
        try:
            msg_id = uuid.UUID(str(msg_id))
        except ValueError as exc:
            raise InvalidMessageError(f"message id {message.id!r} is not a UUID") from exc
    seq = getattr(message, "seq", None)
    if seq is not None and (
        isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < 2**63
    ):
        raise InvalidMessageError(
            f"message seq must be a positive int below 2**63 (a PostgreSQL bigint), not {seq!r}"
        )
    if ordered and seq is None:
        raise InvalidMessageError(
            f"message {msg_id} has no seq: the order guard (ordered=True) needs the per-key "
            "sequence number the outbox assigns"
        )
    _checked_name(topic, "message topic")
    check_text(key, "message key", MAX_KEY_BYTES)
    origin = getattr(message, "origin", None)
    if origin:
        _checked_name(origin, "message origin")
        return MessageRef(consumer, msg_id, topic, key, seq, origin)
    return MessageRef(consumer, msg_id, topic, key, seq)


def _storable(value: object, max_bytes: int) -> str:
    """Text a PostgreSQL text column takes: NUL and unpaired surrogates replaced, cut to size."""
    text = value if isinstance(value, str) else ""
    cleaned = text.replace("\x00", "\ufffd").encode("utf-8", "replace")[:max_bytes]
    return cleaned.decode("utf-8", "ignore").strip() or "(invalid)"


def invalid_ref(
    consumer: str, msg_id: object, topic: object, key: object, seq: object
) -> MessageRef | None:
    """A ref to record an invalid broker message under (dead), from what could be read of it;
    None without a readable id. Text is made storable; a seq out of range is left out."""
    try:
        parsed = msg_id if isinstance(msg_id, uuid.UUID) else uuid.UUID(str(msg_id))
    except ValueError:
        return None
    valid_seq = (
        seq if isinstance(seq, int) and not isinstance(seq, bool) and 1 <= seq < 2**63 else None
    )
    return MessageRef(
        consumer,
        parsed,
        _storable(topic, MAX_TOPIC_BYTES),
        _storable(key, MAX_KEY_BYTES),
        valid_seq,
    )


def decide(last_seq: int, seq: int) -> Verdict:
    """The order guard: apply only the next message of a key."""
    if seq <= last_seq:
        return Verdict.STALE
    if seq > last_seq + 1:
        return Verdict.OUT_OF_ORDER
    return Verdict.PROCESS


def held_params(ref: MessageRef, message: Any) -> dict[str, Any]:
    """What inbox_held keeps of a message to apply it later: the envelope's fields."""
    payload = getattr(message, "payload", b"")
    return ref.params(
        payload=bytes(payload) if isinstance(payload, bytes | bytearray | memoryview) else b"",
        content_type=str(getattr(message, "content_type", None) or "application/json"),
        headers=Jsonb(dict(getattr(message, "headers", None) or {})),
        traceparent=getattr(message, "traceparent", None),
        created_at=getattr(message, "created_at", None),
    )


def _record_steps(
    stmts: InboxStatements, ref: MessageRef, ordered: bool, message: Any = None
) -> Steps:
    params = ref.params()
    inserted = yield stmts.record, params
    return (yield from _decision_steps(stmts, ref, ordered, message, params, inserted))


def _decision_steps(
    stmts: InboxStatements,
    ref: MessageRef,
    ordered: bool,
    message: Any,
    params: dict[str, Any],
    inserted: dict[str, Any] | None,
) -> Steps:
    """What follows inbox_record, given what it returned (``{"rowcount": n}``)."""
    if inserted is None or inserted["rowcount"] == 0:
        noted = yield stmts.note_duplicate, params
        if not ordered:
            return Verdict.DUPLICATE
        if noted is not None and noted["status"] == "parked":
            return Verdict.DUPLICATE  # kept in inbox_held: applied from there, in turn
        return (yield from _ordered_duplicate_steps(stmts, ref))
    if not ordered:
        return Verdict.PROCESS
    position = yield stmts.position_lock, params
    assert position is not None
    assert ref.seq is not None
    held = position["held_seq"]
    if held is not None and ref.seq >= int(held):
        yield stmts.park, held_params(ref, message)
        return Verdict.PARKED
    verdict = decide(int(position["last_seq"]), ref.seq)
    follow_up = {
        Verdict.PROCESS: stmts.position_advance,
        Verdict.STALE: stmts.mark_stale,
        Verdict.OUT_OF_ORDER: stmts.forget,
    }[verdict]
    yield follow_up, params
    return verdict


def _ordered_duplicate_steps(stmts: InboxStatements, ref: MessageRef) -> Steps:
    """A known id for an ordered consumer. A redelivery carries the seq it had (at most the
    key's position): a duplicate. The same id under a *later* seq is a message the producer
    re-created with the same idempotency key after outbox retention had deleted the first one
    (the outbox remembers an idempotency key only as long as its row): its effect is applied
    already, but its seq still moves the key on, in turn, or every later message of the key
    would wait for it forever."""
    params = ref.params()
    position = yield stmts.position_lock, params
    assert position is not None
    assert ref.seq is not None
    if position["held_seq"] is not None and ref.seq >= int(position["held_seq"]):
        return Verdict.DUPLICATE  # the key is held at or before it: the hold decides its turn
    verdict = decide(int(position["last_seq"]), ref.seq)
    if verdict is Verdict.OUT_OF_ORDER:
        return Verdict.OUT_OF_ORDER  # not yet its turn: redelivered, and moved on then
    if verdict is Verdict.PROCESS:
        yield stmts.position_advance, params
    return Verdict.DUPLICATE


def translate(exc: psycopg.Error, stmts: InboxStatements) -> Exception:
    """Turn the driver errors a consumer can act on into inbox errors; others unchanged."""
    translated = translate_database_error(exc, schema=stmts.schema)
    if translated is not exc:
        return translated
    if isinstance(
        exc,
        pg_errors.SerializationFailure | pg_errors.DeadlockDetected | pg_errors.LockNotAvailable,
    ):
        return ConcurrentDeliveryError(
            f"{type(exc).__name__} ({exc.sqlstate}): another transaction handled this message "
            "or key at the same time. Roll back and deliver the message again; the retry sees "
            "the other transaction's outcome",
            sqlstate=exc.sqlstate,
        )
    return exc


def receive_answer(verdict: Verdict, ref: Any) -> bool:
    """``receive``'s answer for a verdict other than PROCESS: False, or OutOfOrderError."""
    if verdict is Verdict.OUT_OF_ORDER:
        raise OutOfOrderError(
            f"message {ref.id} (seq {ref.seq} of key {ref.key!r} on {ref.topic!r}) arrived "
            "before its predecessor: roll back and let the broker deliver it again later",
            message_id=ref.id,
            seq=ref.seq,
        )
    return verdict is Verdict.PROCESS
