"""The handler runners' shared parts: configuration, outcomes, failure steps, results.

The runners are written once, as :class:`~inbox.AsyncHandlerRunner` in
``inbox/_runner_async.py``; :class:`~inbox.HandlerRunner` (``inbox/_runner_sync.py``) is
generated from it by ``tools/async_to_sync.py``. Both only open the transaction and await (or
not) the handler; what they decide is here.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
from psycopg import errors as pg_errors

from inbox._batch import Plan
from inbox._metrics import InboxMetrics
from inbox._receive import MessageRef, Steps, Verdict, as_ref, held_params
from inbox._statements import InboxStatements, inbox_statements
from inbox._tracing import trace_delivery, tracing
from inbox.exceptions import ConcurrentDeliveryError
from outbox.envelope import shown
from outbox.exceptions import ConfigurationError

__all__ = [
    "Also",
    "AsyncAlso",
    "AsyncBatchAlso",
    "BatchAlso",
    "HeldRow",
    "Outcome",
    "Result",
]

log = logging.getLogger("inbox.runner")

#: ``also(target)``: extra work committed with every acknowledged outcome (Kafka offsets).
Also = Callable[[Any], object]
AsyncAlso = Callable[[Any], Awaitable[object]]
#: ``also(target, acks)``, committed with a batch: ``acks[i]`` says whether the batch's i-th
#: message will be acknowledged (Kafka offsets).
BatchAlso = Callable[[Any, list[bool]], object]
AsyncBatchAlso = Callable[[Any, list[bool]], Awaitable[object]]

_MAX_ERROR_CHARS = 4000


class Outcome(enum.Enum):
    """What became of one delivery."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    STALE = "stale"
    OUT_OF_ORDER = "out_of_order"
    FAILED = "failed"
    DEAD = "dead"
    #: kept in the database behind its key's held dead message (on_dead="hold"); acknowledged
    PARKED = "parked"

    @property
    def ack(self) -> bool:
        """True when the broker message may be acknowledged (settled in the database)."""
        return self not in (Outcome.OUT_OF_ORDER, Outcome.FAILED)


_FROM_VERDICT = {
    Verdict.PROCESS: Outcome.PROCESSED,
    Verdict.DUPLICATE: Outcome.DUPLICATE,
    Verdict.STALE: Outcome.STALE,
    Verdict.OUT_OF_ORDER: Outcome.OUT_OF_ORDER,
    Verdict.PARKED: Outcome.PARKED,
}

#: what becomes of an ordered key when one of its messages goes dead
ON_DEAD = ("skip", "hold")


class HeldRow(NamedTuple):
    """A row of inbox_held_decided (with its ``decision``) or inbox_parked_ready (without),
    read by name; a tuple, as :func:`~inbox._hold.held_envelope` takes it."""

    message_id: uuid.UUID
    topic: str
    key: str
    seq: int
    payload: bytes
    content_type: str
    headers: Any
    traceparent: str | None
    created_at: dt.datetime
    origin: str = ""
    decision: str | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of one delivery, with the failed attempts so far and the error, if any."""

    outcome: Outcome
    message_id: uuid.UUID
    attempts: int | None = None
    error: BaseException | None = None
    #: seconds the handler ran, to its return or its exception (None when it did not run)
    handler_seconds: float | None = None


# Server states that mean the session is gone (class 08 too): the next delivery may succeed.
_CONNECTION_LOST = ("57P01", "57P02", "57P03")  # admin shutdown, crash, cannot connect now


def _is_transient(exc: BaseException) -> bool:
    """Concurrency conflicts and lost connections: retry without counting an attempt.

    Any other database error counts, even an ``OperationalError`` such as a statement timeout
    (57014) or a program limit (54xxx): it would fail the same way on every delivery, and an
    uncounted failure would never reach ``max_attempts`` (an ordered key would be stuck).
    """
    cause = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver error
    if isinstance(exc, ConcurrentDeliveryError):
        return True
    conflicts = (
        pg_errors.SerializationFailure,
        pg_errors.DeadlockDetected,
        pg_errors.LockNotAvailable,
    )
    if isinstance(cause, conflicts):
        return True
    if isinstance(cause, psycopg.OperationalError):
        state = cause.sqlstate  # None: raised by the client, the connection broke
        return state is None or state.startswith("08") or state in _CONNECTION_LOST
    return False


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]


def _failure_steps(
    stmts: InboxStatements, ref: MessageRef, exc: BaseException, cfg: _Config, message: Any
) -> Steps:
    params = ref.params(error=_describe(exc), max_attempts=cfg.max_attempts)
    row = yield stmts.record_failure, params
    if row is None:  # processed concurrently by another delivery
        return None, "processed"
    attempts, status = int(row[0]), str(row[1])
    if status == "dead" and cfg.ordered:
        if cfg.on_dead == "hold":
            yield stmts.hold_key, held_params(ref, message)
        else:
            yield stmts.position_skip, ref.params()
    return attempts, status


def _failure_result(ref: MessageRef, exc: BaseException, row: tuple[int | None, str]) -> Result:
    attempts, status = row
    if status == "processed":
        return Result(Outcome.DUPLICATE, ref.id)
    outcome = Outcome.DEAD if status == "dead" else Outcome.FAILED
    if outcome is Outcome.DEAD:
        # the error may carry what a hostile message held: escaped and cut short
        log.error("inbox: message %s is dead after %s attempts: %s", ref.id, attempts,
                  shown(str(exc), 300))  # fmt: skip
    return Result(outcome, ref.id, attempts, exc)


@dataclass(frozen=True)
class _Config:
    consumer: str
    ordered: bool
    max_attempts: int
    stmts: InboxStatements
    on_dead: str = "skip"


class _NotNow(Exception):
    """Raised inside a release transaction to roll it back: not this message's turn."""


class _HandlerFailed(Exception):
    """Raised inside a batch transaction to roll it back: the handler failed on one message."""

    def __init__(self, index: int, error: Exception, took: float) -> None:
        super().__init__(str(error))
        self.index, self.error, self.took = index, error, took


def _batch_order(cfg: _Config, refs: list[MessageRef], plan: Plan, pending: list[int]) -> list[int]:
    """The batch's messages to apply, as positions in ``pending``: an ordered consumer's in seq
    order per key (the order the plan decided them in), others in arrival order."""
    chosen = [k for k, v in enumerate(plan.verdicts) if v is Verdict.PROCESS]
    if cfg.ordered:
        chosen.sort(key=lambda k: (refs[pending[k]].topic, refs[pending[k]].key,
                                   refs[pending[k]].seq or 0))  # fmt: skip
    return chosen


def _batch_results(
    refs: list[MessageRef], pending: list[int], plan: Plan, took: dict[int, float]
) -> dict[int, Result]:
    return {
        i: Result(_FROM_VERDICT[v], refs[i].id, handler_seconds=took.get(k))
        for k, (i, v) in enumerate(zip(pending, plan.verdicts, strict=True))
    }


def _acks(pending: list[int], plan: Plan, settled: dict[int, Result], size: int) -> list[bool]:
    acks = [settled[i].outcome.ack if i in settled else False for i in range(size)]
    for i, verdict in zip(pending, plan.verdicts, strict=True):
        acks[i] = _FROM_VERDICT[verdict].ack
    return acks


def _culprits(refs: list[MessageRef], pending: list[int], index: int) -> list[int]:
    """The failed message and its copies in the batch: they share its result."""
    return [j for j in pending if refs[j].id == refs[index].id]


def _config(
    consumer: str, ordered: bool, max_attempts: int | None, schema: str | None, on_dead: str
) -> _Config:
    if not isinstance(consumer, str) or not consumer:
        raise ConfigurationError(f"consumer must be a non-empty name, not {consumer!r}")
    if on_dead not in ON_DEAD:
        raise ConfigurationError(
            f"on_dead must be 'skip' (the key moves on past a dead message) or 'hold' (the "
            f"key waits until an operator retries or purges it), not {on_dead!r}"
        )
    if on_dead == "hold" and not ordered:
        raise ConfigurationError(
            "on_dead='hold' needs ordered=True: a key is held in the order the outbox gave "
            "its messages (seq), which only an ordered consumer follows"
        )
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise ConfigurationError(
            f"max_attempts must be a positive int (or None: never dead), not {max_attempts!r}"
        )
    limit = 2**31 - 1 if max_attempts is None else max_attempts
    return _Config(consumer, ordered, limit, inbox_statements(schema), on_dead)


class _RunnerBase:
    """What both flavours share: validated configuration, the handler, the transaction factory."""

    #: turns the ``transactions`` argument into a factory of transaction context managers
    _factory: Callable[[Any], Any]

    def __init__(
        self,
        transactions: Any,
        handler: Any = None,
        *,
        consumer: str,
        ordered: bool = False,
        max_attempts: int | None = 5,
        schema: str | None = None,
        on_dead: str = "skip",
        metrics: InboxMetrics | None = None,
        batch_handler: Any = None,
    ) -> None:
        self._cfg = _config(consumer, ordered, max_attempts, schema, on_dead)
        if (handler is None) == (batch_handler is None):
            raise ConfigurationError(
                "pass exactly one of handler (called once per message) and batch_handler "
                "(called once per batch with the list of messages to apply)"
            )
        self._transactions = type(self)._factory(transactions)
        #: the batch handler, when given; a single message is a batch of one
        self._batch_handler = batch_handler
        self._handler = handler or (lambda target, message: batch_handler(target, [message]))
        #: counts outcomes, times handlers, and the gauges of blocked and held keys
        self.metrics = metrics or InboxMetrics.disabled()
        self.metrics.declare(consumer, (o.value for o in Outcome))

    @property
    def consumer(self) -> str:
        return self._cfg.consumer

    def check(self, message: Any) -> MessageRef:
        """Raise :class:`~outbox.InvalidMessageError` when this runner cannot record
        ``message`` (no UUID id, a blank or oversized topic or key, a bad or, when ordered,
        missing seq); otherwise return what the inbox records of it."""
        return as_ref(self._cfg.consumer, message, ordered=self._cfg.ordered)

    def _observed(
        self, result: Result, message: Any, start_ns: int | None = None, batch_size: int = 1
    ) -> Result:
        """Count the delivery in the metrics and record its span (from ``start_ns``)."""
        if self.metrics.enabled:
            self.metrics.delivered(
                self._cfg.consumer, result.outcome.value, result.handler_seconds, message
            )
        if start_ns is not None:
            trace_delivery(self._cfg.consumer, message, result.outcome.value, result.error,
                           start_ns, time.time_ns(), batch_size)  # fmt: skip
        return result

    def _observed_batch(
        self, results: dict[int, Result], messages: Sequence[Any], start_ns: int
    ) -> list[Result]:
        """The batch's results in order, each counted and traced as :meth:`_observed` does;
        whether metrics and tracing are on is asked once per batch, not per message."""
        ordered = [results[i] for i in range(len(messages))]
        consumer = self._cfg.consumer
        if self.metrics.enabled:
            for result, message in zip(ordered, messages, strict=True):
                self.metrics.delivered(
                    consumer, result.outcome.value, result.handler_seconds, message
                )
        if tracing():
            end_ns, size = time.time_ns(), len(messages)
            for result, message in zip(ordered, messages, strict=True):
                trace_delivery(consumer, message, result.outcome.value, result.error,
                               start_ns, end_ns, size, check=False)  # fmt: skip
        return ordered

    def _gauges(self, row: tuple[Any, ...] | None) -> tuple[int, int]:
        blocked, held = (int(row[0]), int(row[1])) if row else (0, 0)
        self.metrics.blocked_keys.labels(self._cfg.consumer).set(blocked)
        self.metrics.held_keys.labels(self._cfg.consumer).set(held)
        return blocked, held

    @property
    def holds(self) -> bool:
        """True when a dead message holds its key (on_dead="hold"): call ``resolve_held``."""
        return self._cfg.on_dead == "hold"

    def _release_result(
        self, ref: MessageRef, exc: BaseException, row: tuple[int | None, str]
    ) -> Result:
        if row[1] == "dead":
            log.error("inbox: released %s is dead and holds key %s: %s", ref.id, shown(ref.key),
                      shown(str(exc), 300))  # fmt: skip
            return Result(Outcome.DEAD, ref.id, row[0], exc)
        if row[1] == "processed":
            return Result(Outcome.DUPLICATE, ref.id)
        return Result(Outcome.FAILED, ref.id, row[0], exc)
