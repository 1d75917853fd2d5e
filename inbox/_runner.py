"""The handler runner: one transaction per delivery, recorded, handled, committed; an outcome.

Both twins share the pure parts (configuration, failure steps, outcome mapping); each twin
only opens the transaction and awaits (or not) the handler.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from inbox._receive import (
    MessageRef,
    Steps,
    Verdict,
    _record_steps,
    as_ref,
    run_steps,
    run_steps_async,
)
from inbox._statements import InboxStatements, inbox_statements
from inbox._transactions import (
    AsyncTransactions,
    Transactions,
    async_transactions,
    sync_transactions,
)
from inbox.exceptions import ConcurrentDeliveryError
from outbox._connections import resolve_async, resolve_sync
from outbox.exceptions import ConfigurationError

__all__ = ["AsyncHandlerRunner", "HandlerRunner", "Outcome", "Result"]

log = logging.getLogger("inbox.runner")

#: ``handler(target, message)``: apply the effect through ``target`` (the transaction's
#: Session, Connection or psycopg connection). Raise to fail the delivery.
Handler = Callable[[Any, Any], object]
AsyncHandler = Callable[[Any, Any], Awaitable[object]]
#: ``also(target)``: extra work committed with every acknowledged outcome (Kafka offsets).
Also = Callable[[Any], object]
AsyncAlso = Callable[[Any], Awaitable[object]]

_MAX_ERROR_CHARS = 4000


class Outcome(enum.Enum):
    """What became of one delivery."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    STALE = "stale"
    OUT_OF_ORDER = "out_of_order"
    FAILED = "failed"
    DEAD = "dead"

    @property
    def ack(self) -> bool:
        """True when the broker message may be acknowledged (settled in the database)."""
        return self not in (Outcome.OUT_OF_ORDER, Outcome.FAILED)


_FROM_VERDICT = {
    Verdict.PROCESS: Outcome.PROCESSED,
    Verdict.DUPLICATE: Outcome.DUPLICATE,
    Verdict.STALE: Outcome.STALE,
    Verdict.OUT_OF_ORDER: Outcome.OUT_OF_ORDER,
}


@dataclass(frozen=True)
class Result:
    """The outcome of one delivery, with the failed attempts so far and the error, if any."""

    outcome: Outcome
    message_id: uuid.UUID
    attempts: int | None = None
    error: BaseException | None = None


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
    stmts: InboxStatements, ref: MessageRef, exc: BaseException, max_attempts: int, ordered: bool
) -> Steps:
    row = yield stmts.record_failure, ref.params(error=_describe(exc), max_attempts=max_attempts)
    if row is None:  # processed concurrently by another delivery
        return None, "processed"
    attempts, status = int(row[0]), str(row[1])
    if status == "dead" and ordered:
        yield stmts.position_skip, ref.params()
    return attempts, status


def _failure_result(ref: MessageRef, exc: BaseException, row: tuple[int | None, str]) -> Result:
    attempts, status = row
    if status == "processed":
        return Result(Outcome.DUPLICATE, ref.id)
    outcome = Outcome.DEAD if status == "dead" else Outcome.FAILED
    if outcome is Outcome.DEAD:
        log.error("inbox: message %s is dead after %s attempts: %s", ref.id, attempts, exc)
    return Result(outcome, ref.id, attempts, exc)


@dataclass(frozen=True)
class _Config:
    consumer: str
    ordered: bool
    max_attempts: int
    stmts: InboxStatements


def _config(consumer: str, ordered: bool, max_attempts: int | None, schema: str | None) -> _Config:
    if not isinstance(consumer, str) or not consumer:
        raise ConfigurationError(f"consumer must be a non-empty name, not {consumer!r}")
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise ConfigurationError(
            f"max_attempts must be a positive int (or None: never dead), not {max_attempts!r}"
        )
    limit = 2**31 - 1 if max_attempts is None else max_attempts
    return _Config(consumer, ordered, limit, inbox_statements(schema))


class _RunnerBase:
    """What both twins share: validated configuration, the handler, the transaction factory."""

    #: turns the ``transactions`` argument into a factory of transaction context managers
    _factory: Callable[[Any], Any]

    def __init__(
        self,
        transactions: Any,
        handler: Any,
        *,
        consumer: str,
        ordered: bool = False,
        max_attempts: int | None = 5,
        schema: str | None = None,
    ) -> None:
        self._cfg = _config(consumer, ordered, max_attempts, schema)
        self._transactions = type(self)._factory(transactions)
        self._handler = handler

    @property
    def consumer(self) -> str:
        return self._cfg.consumer


class HandlerRunner(_RunnerBase):
    """Run ``handler`` once per message and consumer, each delivery in its own transaction.

    ``transactions``: a psycopg_pool.ConnectionPool, a SQLAlchemy Engine or sessionmaker, or a
    callable returning a transaction context manager. ``handler(target, message)`` applies the
    effect (:data:`Handler`). After ``max_attempts`` failed deliveries (handler exceptions; not
    concurrency conflicts) the message is recorded dead with its error and reported DEAD, to be
    acknowledged; ``None`` retries forever.
    """

    _factory = staticmethod(sync_transactions)
    _handler: Handler
    _transactions: Transactions

    def handle(self, message: Any, *, also: Also | None = None) -> Result:
        """Process one delivery of ``message``; never raises for a handler failure."""
        cfg = self._cfg
        ref = as_ref(cfg.consumer, message, ordered=cfg.ordered)
        try:
            with self._transactions() as target:
                raw = resolve_sync(target)
                verdict = run_steps(raw, cfg.stmts, _record_steps(cfg.stmts, ref, cfg.ordered))
                if verdict is Verdict.PROCESS:
                    self._handler(target, message)
                if also is not None and verdict is not Verdict.OUT_OF_ORDER:
                    also(target)
        except Exception as exc:
            return self._fail(ref, exc, also)
        return Result(_FROM_VERDICT[verdict], ref.id)

    def _fail(self, ref: MessageRef, exc: Exception, also: Also | None) -> Result:
        if _is_transient(exc):
            return Result(Outcome.FAILED, ref.id, error=exc)
        cfg = self._cfg
        try:
            with self._transactions() as target:
                raw = resolve_sync(target)
                steps = _failure_steps(cfg.stmts, ref, exc, cfg.max_attempts, cfg.ordered)
                row = run_steps(raw, cfg.stmts, steps)
                if also is not None and row[1] == "dead":
                    also(target)
        except Exception as record_exc:
            log.warning("inbox: could not record the failure of %s: %s", ref.id, record_exc)
            return Result(Outcome.FAILED, ref.id, error=exc)
        return _failure_result(ref, exc, row)


class AsyncHandlerRunner(_RunnerBase):
    """Async twin of :class:`HandlerRunner` (AsyncConnectionPool, AsyncEngine,
    async_sessionmaker, or a callable returning an async transaction context manager)."""

    _factory = staticmethod(async_transactions)
    _handler: AsyncHandler
    _transactions: AsyncTransactions

    @property
    def transactions(self) -> AsyncTransactions:
        """The factory of transactions this runner opens (one per delivery)."""
        return self._transactions

    async def handle(self, message: Any, *, also: AsyncAlso | None = None) -> Result:
        """Process one delivery of ``message``; never raises for a handler failure."""
        cfg = self._cfg
        ref = as_ref(cfg.consumer, message, ordered=cfg.ordered)
        try:
            async with self._transactions() as target:
                raw = await resolve_async(target)
                steps = _record_steps(cfg.stmts, ref, cfg.ordered)
                verdict = await run_steps_async(raw, cfg.stmts, steps)
                if verdict is Verdict.PROCESS:
                    await self._handler(target, message)
                if also is not None and verdict is not Verdict.OUT_OF_ORDER:
                    await also(target)
        except Exception as exc:
            return await self._fail(ref, exc, also)
        return Result(_FROM_VERDICT[verdict], ref.id)

    async def _fail(self, ref: MessageRef, exc: Exception, also: AsyncAlso | None) -> Result:
        if _is_transient(exc):
            return Result(Outcome.FAILED, ref.id, error=exc)
        cfg = self._cfg
        try:
            async with self._transactions() as target:
                raw = await resolve_async(target)
                steps = _failure_steps(cfg.stmts, ref, exc, cfg.max_attempts, cfg.ordered)
                row = await run_steps_async(raw, cfg.stmts, steps)
                if also is not None and row[1] == "dead":
                    await also(target)
        except Exception as record_exc:
            log.warning("inbox: could not record the failure of %s: %s", ref.id, record_exc)
            return Result(Outcome.FAILED, ref.id, error=exc)
        return _failure_result(ref, exc, row)
