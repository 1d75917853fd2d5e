# This file is generated from inbox/_runner_async.py by tools/async_to_sync.py: do not edit it.
"""The handler runner: one transaction per delivery, recorded, handled, committed; an outcome.

Both flavours are written once, as async code, in ``inbox/_runner_async.py``;
``inbox/_runner_sync.py`` is generated from it by ``tools/async_to_sync.py``. What both decide
(configuration, failure steps, outcomes) is ``inbox/_runner_common.py``.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from inbox._batch import Plan, batch_steps
from inbox._handler import BatchHandler, Handler
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
    Verdict,
    as_ref,
    record_on,
    run_steps,
)
from inbox._runner_common import (
    _FROM_VERDICT,
    Also,
    BatchAlso,
    HeldRow,
    Outcome,
    Result,
    _acks,
    _batch_order,
    _batch_results,
    _culprits,
    _describe,
    _failure_result,
    _failure_steps,
    _HandlerFailed,
    _is_transient,
    _NotNow,
    _RunnerBase,
    log,
)
from inbox._transactions import Transactions, TransactionSource, sync_transactions
from outbox.kit import resolve_sync, row_by_name, rows_by_name

__all__ = ["HandlerRunner"]


class HandlerRunner(_RunnerBase):
    """Run ``handler`` once per message and consumer, each delivery in its own transaction.

    ``transactions``: a psycopg_pool.ConnectionPool, a SQLAlchemy Engine or
    sessionmaker, or a callable returning a transaction context manager.
    ``handler(target, message)`` applies the effect (:data:`Handler`). After
    ``max_attempts`` failed deliveries (handler exceptions; not concurrency conflicts) the
    message is recorded dead with its error and reported DEAD, to be acknowledged; ``None``
    retries forever.

    ``on_dead`` (ordered only): ``"skip"`` moves the key on past a dead message; ``"hold"``
    parks the key's later messages (recorded, kept, acknowledged, not applied) until an
    operator retries or purges the dead message (``outbox inbox dead retry|purge``); then
    :meth:`resolve_held` applies the decision and the parked messages in seq order.
    """

    _factory = staticmethod(sync_transactions)
    _handler: Handler[Any]
    _transactions: Transactions

    def __init__(
        self,
        transactions: TransactionSource,
        handler: Handler[Any] | None = None,
        *,
        consumer: str,
        ordered: bool = False,
        max_attempts: int | None = 5,
        schema: str | None = None,
        on_dead: str = "skip",
        metrics: InboxMetrics | None = None,
        batch_handler: BatchHandler[Any] | None = None,
    ) -> None:
        super().__init__(
            transactions,
            handler,
            consumer=consumer,
            ordered=ordered,
            max_attempts=max_attempts,
            schema=schema,
            on_dead=on_dead,
            metrics=metrics,
            batch_handler=batch_handler,
        )

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
        return self._handle_checked(messages, refs, also, start_ns)

    def _handle_checked(
        self,
        messages: Sequence[Any],
        refs: list[MessageRef],
        also: BatchAlso | None = None,
        start_ns: int | None = None,
    ) -> list[Result]:
        """:meth:`handle_batch` of messages whose refs :meth:`check` returned (the broker
        consumers check each message as they decode it, and do not pay for it twice)."""
        if start_ns is None:
            start_ns = time.time_ns()
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
        return self._observed_batch(results, messages, start_ns)

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
            raw = resolve_sync(target)
            cur = raw.execute(self._cfg.stmts.key_gauges, params)
            row = row_by_name(cur, cur.fetchone())
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
            raw = resolve_sync(target)
            cur = raw.execute(cfg.stmts.held_decided, params)
            decided = rows_by_name(cur, cur.fetchall())
        for row in (HeldRow(**values) for values in decided):
            if row.decision == "purge":
                self._purge(held_envelope(row))
            elif (result := self._release(message := held_envelope(row), "dead")) is not None:
                results.append(self._observed(result, message))
        tried: set[uuid.UUID] = set()
        while True:  # a released message makes its successor ready: ask again until none
            with self._transactions() as target:
                raw = resolve_sync(target)
                cur = raw.execute(cfg.stmts.parked_ready, params)
                rows = rows_by_name(cur, cur.fetchall())
            fresh = [
                row for row in (HeldRow(**values) for values in rows) if row.message_id not in tried
            ]
            ready = [held_envelope(row) for row in fresh]
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
                done = release_done_steps(cfg.stmts, ref, from_status, actor)
                run_steps(raw, cfg.stmts, done)
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
