"""The handler runner: one transaction per delivery, recorded, handled, committed; an outcome.

Both twins share the pure parts (configuration, failure steps, outcome mapping); each twin
only opens the transaction and awaits (or not) the handler.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from inbox._batch import Plan, batch_steps
from inbox._hold import (
    held_envelope,
    release_done_steps,
    release_failure_steps,
    release_steps,
    runner_actor,
)
from inbox._metrics import InboxMetrics
from inbox._receive import (
    MessageRef,
    Steps,
    Verdict,
    as_ref,
    held_params,
    record_on,
    record_on_async,
    run_steps,
    run_steps_async,
)
from inbox._statements import InboxStatements, inbox_statements
from inbox._tracing import trace_delivery
from inbox._transactions import (
    AsyncTransactions,
    Transactions,
    async_transactions,
    sync_transactions,
)
from inbox.exceptions import ConcurrentDeliveryError
from outbox._connections import resolve_async, resolve_sync
from outbox.envelope import shown
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
#: ``batch_handler(target, messages)``: apply the effects of a whole batch (a list) at once.
BatchHandler = Callable[[Any, list[Any]], object]
AsyncBatchHandler = Callable[[Any, list[Any]], Awaitable[object]]
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


@dataclass(frozen=True)
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
    """What both twins share: validated configuration, the handler, the transaction factory."""

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

    def check(self, message: Any) -> None:
        """Raise :class:`~outbox.InvalidMessageError` when this runner cannot record
        ``message`` (no UUID id, a blank or oversized topic or key, a bad or, when ordered,
        missing seq)."""
        as_ref(self._cfg.consumer, message, ordered=self._cfg.ordered)

    def _observed(
        self, result: Result, message: Any, start_ns: int | None = None, batch_size: int = 1
    ) -> Result:
        """Count the delivery in the metrics and record its span (from ``start_ns``)."""
        self.metrics.delivered(
            self._cfg.consumer, result.outcome.value, result.handler_seconds, message
        )
        if start_ns is not None:
            trace_delivery(self._cfg.consumer, message, result.outcome.value, result.error,
                           start_ns, time.time_ns(), batch_size)  # fmt: skip
        return result

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


class HandlerRunner(_RunnerBase):
    """Run ``handler`` once per message and consumer, each delivery in its own transaction.

    ``transactions``: a psycopg_pool.ConnectionPool, a SQLAlchemy Engine or sessionmaker, or a
    callable returning a transaction context manager. ``handler(target, message)`` applies the
    effect (:data:`Handler`). After ``max_attempts`` failed deliveries (handler exceptions; not
    concurrency conflicts) the message is recorded dead with its error and reported DEAD, to be
    acknowledged; ``None`` retries forever.

    ``on_dead`` (ordered only): ``"skip"`` moves the key on past a dead message; ``"hold"``
    parks the key's later messages (recorded, kept, acknowledged, not applied) until an
    operator retries or purges the dead message (``outbox inbox dead retry|purge``); then
    :meth:`resolve_held` applies the decision and the parked messages in seq order.
    """

    _factory = staticmethod(sync_transactions)
    _handler: Handler
    _transactions: Transactions

    def handle(self, message: Any, *, also: Also | None = None) -> Result:
        """Process one delivery of ``message``; never raises for a handler failure."""
        start_ns = time.time_ns()
        return self._observed(self._handle(message, also), message, start_ns)

    def handle_batch(
        self, messages: Sequence[Any], *, also: BatchAlso | None = None
    ) -> list[Result]:
        """Process a batch of deliveries in **one** transaction; one result per message, in
        order. Never raises for a handler failure.

        The inbox records of the whole batch are written in one statement each step;
        duplicates, stale and (ordered) out-of-order messages are settled without reaching the
        handler; the handler is called once per message to apply (an ordered consumer's in seq
        order per key), or the batch handler once with their list; one commit. A message whose
        handler raises is taken out (its attempt counted, dead after ``max_attempts``, as with
        :meth:`handle`) and the rest of the batch is applied again without it. Any other
        failure (a conflict, a lost connection, a batch handler's exception) falls back to one
        transaction per message, which isolates the culprit. ``also(target, acks)`` is
        committed with the batch. A message that is not a valid envelope raises
        :class:`~outbox.InvalidMessageError` before anything is written.
        """
        cfg = self._cfg
        start_ns = time.time_ns()
        refs = [as_ref(cfg.consumer, m, ordered=cfg.ordered) for m in messages]
        results: dict[int, Result] = {}
        pending = list(range(len(messages)))
        while pending:
            try:
                results.update(self._batch(refs, messages, pending, results, also))
                break
            except _HandlerFailed as failed:
                culprits = _culprits(refs, pending, failed.index)
                result = self._fail(refs[failed.index], messages[failed.index], failed.error, None)
                for j in culprits:
                    results[j] = replace(result, handler_seconds=failed.took)
                pending = [j for j in pending if j not in culprits]
            except Exception as exc:
                log.warning("inbox: a batch of %d failed, one by one now: %s", len(pending), exc)
                for j in pending:
                    results[j] = self._handle(messages[j], None)
                break
        size = len(messages)
        return [self._observed(results[i], m, start_ns, size) for i, m in enumerate(messages)]

    def _batch(
        self,
        refs: list[MessageRef],
        messages: Sequence[Any],
        pending: list[int],
        settled: dict[int, Result],
        also: BatchAlso | None,
    ) -> dict[int, Result]:
        cfg = self._cfg
        took: dict[int, float] = {}
        with self._transactions() as target:
            raw = resolve_sync(target)
            steps = batch_steps(
                cfg.stmts, cfg.consumer, [refs[i] for i in pending],
                [messages[i] for i in pending], cfg.ordered,
            )  # fmt: skip
            plan: Plan = run_steps(raw, cfg.stmts, steps, all_rows=True)
            order = _batch_order(cfg, refs, plan, pending)
            if self._batch_handler is not None and order:
                started = time.perf_counter()
                self._batch_handler(target, [messages[pending[k]] for k in order])
                took = dict.fromkeys(order, (time.perf_counter() - started) / len(order))
            else:
                for k in order:
                    started = time.perf_counter()
                    try:
                        self._handler(target, messages[pending[k]])
                    except Exception as exc:
                        raise _HandlerFailed(
                            pending[k], exc, time.perf_counter() - started
                        ) from exc
                    took[k] = time.perf_counter() - started
            if also is not None:
                also(target, _acks(pending, plan, settled, len(messages)))
        return _batch_results(refs, pending, plan, took)

    def refresh_key_gauges(
        self, min_age: dt.timedelta = dt.timedelta(minutes=1)
    ) -> tuple[int, int]:
        """Count this consumer's blocked keys (waiting at least ``min_age``) and held keys into
        the metrics' gauges; returns both counts."""
        params = {"consumer": self._cfg.consumer, "min_age": min_age}
        with self._transactions() as target:
            row = resolve_sync(target).execute(self._cfg.stmts.key_gauges, params).fetchone()
        return self._gauges(row)

    def _handle(self, message: Any, also: Also | None) -> Result:
        cfg = self._cfg
        ref = as_ref(cfg.consumer, message, ordered=cfg.ordered)
        started = took = None
        try:
            with self._transactions() as target:
                raw = resolve_sync(target)
                verdict = record_on(raw, cfg.stmts, ref, cfg.ordered, message)
                if verdict is Verdict.PROCESS:
                    started = time.perf_counter()
                    self._handler(target, message)
                    took = time.perf_counter() - started
                if also is not None and verdict is not Verdict.OUT_OF_ORDER:
                    also(target)
        except Exception as exc:
            if started is not None and took is None:  # the handler raised
                took = time.perf_counter() - started
            return replace(self._fail(ref, message, exc, also), handler_seconds=took)
        return Result(_FROM_VERDICT[verdict], ref.id, handler_seconds=took)

    def resolve_held(self, *, limit: int = 100) -> list[Result]:
        """Apply operators' decisions on held dead messages, then every parked message whose
        turn has come, in seq order, each in its own transaction. Returns their results."""
        cfg = self._cfg
        params = {"consumer": cfg.consumer, "limit": limit}
        results: list[Result] = []
        with self._transactions() as target:
            decided = resolve_sync(target).execute(cfg.stmts.held_decided, params).fetchall()
        for row in decided:
            if row[9] == "purge":
                self._purge(held_envelope(row))
            elif (result := self._release(message := held_envelope(row), "dead")) is not None:
                results.append(self._observed(result, message))
        tried: set[uuid.UUID] = set()
        while True:  # a released message makes its successor ready: ask again until none
            with self._transactions() as target:
                rows = resolve_sync(target).execute(cfg.stmts.parked_ready, params).fetchall()
            ready = [held_envelope(r) for r in rows if r[0] not in tried]
            if not ready:
                return results
            for message in ready:
                tried.add(message.id)
                if (result := self._release(message, "parked")) is not None:
                    results.append(self._observed(result, message))

    def _purge(self, message: Any) -> None:
        cfg = self._cfg
        ref = as_ref(cfg.consumer, message, ordered=True)
        with self._transactions() as target:
            raw = resolve_sync(target)
            done = raw.execute(cfg.stmts.purge_apply, ref.params()).fetchone()
            if done is not None:
                audit = ref.params(
                    actor=runner_actor(cfg.consumer), action="purged", error=None, reason=None
                )
                raw.execute(cfg.stmts.audit, audit)
        if done is None:
            log.warning("inbox: purge of %s found its key no longer held at it", ref.id)

    def _release(self, message: Any, from_status: str) -> Result | None:
        cfg = self._cfg
        ref = as_ref(cfg.consumer, message, ordered=True)
        actor = runner_actor(cfg.consumer)
        try:
            with self._transactions() as target:
                raw = resolve_sync(target)
                steps = release_steps(cfg.stmts, ref, message, from_status)
                verdict = run_steps(raw, cfg.stmts, steps)
                if verdict not in (Verdict.PROCESS, Verdict.STALE):
                    raise _NotNow  # roll back: not its turn, or released elsewhere
                if verdict is Verdict.PROCESS:
                    self._handler(target, message)
                run_steps(raw, cfg.stmts, release_done_steps(cfg.stmts, ref, from_status, actor))
        except _NotNow:
            return None
        except Exception as exc:
            if _is_transient(exc):
                return Result(Outcome.FAILED, ref.id, error=exc)
            try:
                with self._transactions() as target:
                    error = _describe(exc)
                    steps = release_failure_steps(
                        cfg.stmts, ref, message, error, cfg.max_attempts, from_status, actor
                    )
                    row = run_steps(resolve_sync(target), cfg.stmts, steps)
            except Exception as record_exc:
                log.warning("inbox: could not record the failure of %s: %s", ref.id, record_exc)
                return Result(Outcome.FAILED, ref.id, error=exc)
            return self._release_result(ref, exc, row)
        return Result(_FROM_VERDICT[verdict], ref.id)

    def _fail(self, ref: MessageRef, message: Any, exc: Exception, also: Also | None) -> Result:
        if _is_transient(exc):
            return Result(Outcome.FAILED, ref.id, error=exc)
        cfg = self._cfg
        try:
            with self._transactions() as target:
                raw = resolve_sync(target)
                steps = _failure_steps(cfg.stmts, ref, exc, cfg, message)
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
        start_ns = time.time_ns()
        return self._observed(await self._handle(message, also), message, start_ns)

    async def handle_batch(
        self, messages: Sequence[Any], *, also: AsyncBatchAlso | None = None
    ) -> list[Result]:
        """Async twin of :meth:`HandlerRunner.handle_batch`."""
        cfg = self._cfg
        start_ns = time.time_ns()
        refs = [as_ref(cfg.consumer, m, ordered=cfg.ordered) for m in messages]
        results: dict[int, Result] = {}
        pending = list(range(len(messages)))
        while pending:
            try:
                results.update(await self._batch(refs, messages, pending, results, also))
                break
            except _HandlerFailed as failed:
                culprits = _culprits(refs, pending, failed.index)
                result = await self._fail(
                    refs[failed.index], messages[failed.index], failed.error, None
                )
                for j in culprits:
                    results[j] = replace(result, handler_seconds=failed.took)
                pending = [j for j in pending if j not in culprits]
            except Exception as exc:
                log.warning("inbox: a batch of %d failed, one by one now: %s", len(pending), exc)
                for j in pending:
                    results[j] = await self._handle(messages[j], None)
                break
        size = len(messages)
        return [self._observed(results[i], m, start_ns, size) for i, m in enumerate(messages)]

    async def _batch(
        self,
        refs: list[MessageRef],
        messages: Sequence[Any],
        pending: list[int],
        settled: dict[int, Result],
        also: AsyncBatchAlso | None,
    ) -> dict[int, Result]:
        cfg = self._cfg
        took: dict[int, float] = {}
        async with self._transactions() as target:
            raw = await resolve_async(target)
            steps = batch_steps(
                cfg.stmts, cfg.consumer, [refs[i] for i in pending],
                [messages[i] for i in pending], cfg.ordered,
            )  # fmt: skip
            plan: Plan = await run_steps_async(raw, cfg.stmts, steps, all_rows=True)
            order = _batch_order(cfg, refs, plan, pending)
            if self._batch_handler is not None and order:
                started = time.perf_counter()
                await self._batch_handler(target, [messages[pending[k]] for k in order])
                took = dict.fromkeys(order, (time.perf_counter() - started) / len(order))
            else:
                for k in order:
                    started = time.perf_counter()
                    try:
                        await self._handler(target, messages[pending[k]])
                    except Exception as exc:
                        raise _HandlerFailed(
                            pending[k], exc, time.perf_counter() - started
                        ) from exc
                    took[k] = time.perf_counter() - started
            if also is not None:
                await also(target, _acks(pending, plan, settled, len(messages)))
        return _batch_results(refs, pending, plan, took)

    async def refresh_key_gauges(
        self, min_age: dt.timedelta = dt.timedelta(minutes=1)
    ) -> tuple[int, int]:
        """Async twin of :meth:`HandlerRunner.refresh_key_gauges`."""
        params = {"consumer": self._cfg.consumer, "min_age": min_age}
        async with self._transactions() as target:
            raw = await resolve_async(target)
            row = await (await raw.execute(self._cfg.stmts.key_gauges, params)).fetchone()
        return self._gauges(row)

    async def _handle(self, message: Any, also: AsyncAlso | None) -> Result:
        cfg = self._cfg
        ref = as_ref(cfg.consumer, message, ordered=cfg.ordered)
        started = took = None
        try:
            async with self._transactions() as target:
                raw = await resolve_async(target)
                verdict = await record_on_async(raw, cfg.stmts, ref, cfg.ordered, message)
                if verdict is Verdict.PROCESS:
                    started = time.perf_counter()
                    await self._handler(target, message)
                    took = time.perf_counter() - started
                if also is not None and verdict is not Verdict.OUT_OF_ORDER:
                    await also(target)
        except Exception as exc:
            if started is not None and took is None:  # the handler raised
                took = time.perf_counter() - started
            return replace(await self._fail(ref, message, exc, also), handler_seconds=took)
        return Result(_FROM_VERDICT[verdict], ref.id, handler_seconds=took)

    async def settle_invalid(
        self, ref: MessageRef, message: Any, exc: BaseException, *, also: AsyncAlso | None = None
    ) -> Result:
        """Record a message that is not a valid envelope as dead at once, with the reason, and
        apply the consumer's ``on_dead`` to its key when its seq is known (no retry can fix
        it). Commits ``also`` with it (Kafka offsets). A message that could not be decoded at
        all (``message`` None) keeps nothing to retry, so under ``hold`` its key is not held
        but stays where it is: ``outbox inbox blocked`` shows it waiting behind this message."""
        cfg = self._cfg
        moves = ref.seq is not None and not (cfg.on_dead == "hold" and message is None)
        dead = replace(cfg, max_attempts=1, ordered=cfg.ordered and moves)
        async with self._transactions() as target:
            raw = await resolve_async(target)
            steps = _failure_steps(cfg.stmts, ref, exc, dead, message)
            row = await run_steps_async(raw, cfg.stmts, steps)
            if also is not None:
                await also(target)
        return _failure_result(ref, exc, row)

    async def resolve_held(self, *, limit: int = 100) -> list[Result]:
        """Async twin of :meth:`HandlerRunner.resolve_held`."""
        cfg = self._cfg
        params = {"consumer": cfg.consumer, "limit": limit}
        results: list[Result] = []
        async with self._transactions() as target:
            raw = await resolve_async(target)
            decided = await (await raw.execute(cfg.stmts.held_decided, params)).fetchall()
        for row in decided:
            if row[9] == "purge":
                await self._purge(held_envelope(row))
            elif result := await self._release(message := held_envelope(row), "dead"):
                results.append(self._observed(result, message))
        tried: set[uuid.UUID] = set()
        while True:  # a released message makes its successor ready: ask again until none
            async with self._transactions() as target:
                raw = await resolve_async(target)
                rows = await (await raw.execute(cfg.stmts.parked_ready, params)).fetchall()
            ready = [held_envelope(r) for r in rows if r[0] not in tried]
            if not ready:
                return results
            for message in ready:
                tried.add(message.id)
                if (result := await self._release(message, "parked")) is not None:
                    results.append(self._observed(result, message))

    async def _purge(self, message: Any) -> None:
        cfg = self._cfg
        ref = as_ref(cfg.consumer, message, ordered=True)
        async with self._transactions() as target:
            raw = await resolve_async(target)
            done = await (await raw.execute(cfg.stmts.purge_apply, ref.params())).fetchone()
            if done is not None:
                audit = ref.params(
                    actor=runner_actor(cfg.consumer), action="purged", error=None, reason=None
                )
                await raw.execute(cfg.stmts.audit, audit)
        if done is None:
            log.warning("inbox: purge of %s found its key no longer held at it", ref.id)

    async def _release(self, message: Any, from_status: str) -> Result | None:
        cfg = self._cfg
        ref = as_ref(cfg.consumer, message, ordered=True)
        actor = runner_actor(cfg.consumer)
        try:
            async with self._transactions() as target:
                raw = await resolve_async(target)
                steps = release_steps(cfg.stmts, ref, message, from_status)
                verdict = await run_steps_async(raw, cfg.stmts, steps)
                if verdict not in (Verdict.PROCESS, Verdict.STALE):
                    raise _NotNow  # roll back: not its turn, or released elsewhere
                if verdict is Verdict.PROCESS:
                    await self._handler(target, message)
                done = release_done_steps(cfg.stmts, ref, from_status, actor)
                await run_steps_async(raw, cfg.stmts, done)
        except _NotNow:
            return None
        except Exception as exc:
            if _is_transient(exc):
                return Result(Outcome.FAILED, ref.id, error=exc)
            try:
                async with self._transactions() as target:
                    error = _describe(exc)
                    steps = release_failure_steps(
                        cfg.stmts, ref, message, error, cfg.max_attempts, from_status, actor
                    )
                    row = await run_steps_async(await resolve_async(target), cfg.stmts, steps)
            except Exception as record_exc:
                log.warning("inbox: could not record the failure of %s: %s", ref.id, record_exc)
                return Result(Outcome.FAILED, ref.id, error=exc)
            return self._release_result(ref, exc, row)
        return Result(_FROM_VERDICT[verdict], ref.id)

    async def _fail(
        self, ref: MessageRef, message: Any, exc: Exception, also: AsyncAlso | None
    ) -> Result:
        if _is_transient(exc):
            return Result(Outcome.FAILED, ref.id, error=exc)
        cfg = self._cfg
        try:
            async with self._transactions() as target:
                raw = await resolve_async(target)
                steps = _failure_steps(cfg.stmts, ref, exc, cfg, message)
                row = await run_steps_async(raw, cfg.stmts, steps)
                if also is not None and row[1] == "dead":
                    await also(target)
        except Exception as record_exc:
            log.warning("inbox: could not record the failure of %s: %s", ref.id, record_exc)
            return Result(Outcome.FAILED, ref.id, error=exc)
        return _failure_result(ref, exc, row)
