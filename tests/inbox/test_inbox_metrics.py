"""The consumer's Prometheus metrics, counted by real runners on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from inbox import AsyncHandlerRunner, HandlerRunner, InboxMetrics, Outcome
from tests.inbox.inbox_helpers import Flaky, apply_effect, make_envelope


def _count(registry: CollectorRegistry, outcome: str, consumer: str = "c") -> float:
    value = registry.get_sample_value(
        "inbox_deliveries_total", {"consumer": consumer, "outcome": outcome}
    )
    return value or 0.0


def _gauge(registry: CollectorRegistry, name: str, consumer: str = "c") -> float | None:
    return registry.get_sample_value(name, {"consumer": consumer})


def test_every_delivery_is_counted_by_outcome(pool: ConnectionPool) -> None:
    registry = CollectorRegistry()
    runner = HandlerRunner(
        pool, Flaky(failures=1), consumer="c", max_attempts=5,
        metrics=InboxMetrics.prometheus(registry),
    )  # fmt: skip
    msg = make_envelope(created_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=3))
    outcomes = [runner.handle(msg).outcome for _ in range(3)]
    assert outcomes == [Outcome.FAILED, Outcome.PROCESSED, Outcome.DUPLICATE]
    assert [_count(registry, o) for o in ("failed", "processed", "duplicate", "dead")] == [
        1, 1, 1, 0,
    ]  # fmt: skip
    # the handler ran twice (one failure, one success); duplicates never reach it
    assert registry.get_sample_value("inbox_handler_seconds_count", {"consumer": "c"}) == 2
    # the lag is observed once, for the processed delivery: at least the 3 s it was old
    assert registry.get_sample_value("inbox_end_to_end_lag_seconds_count", {"consumer": "c"}) == 1
    lag = registry.get_sample_value("inbox_end_to_end_lag_seconds_sum", {"consumer": "c"})
    assert lag is not None
    assert 3.0 <= lag < 60.0


def test_ordered_outcomes_and_gauges(pool: ConnectionPool) -> None:
    registry = CollectorRegistry()

    def handler(conn: Any, msg: Any) -> None:
        if msg.payload == b"poison":
            raise ValueError("cannot parse")
        apply_effect(conn, "c", msg)

    runner = HandlerRunner(
        pool, handler, consumer="c", ordered=True, max_attempts=1, on_dead="hold",
        metrics=InboxMetrics.prometheus(registry),
    )  # fmt: skip
    assert runner.handle(make_envelope(key="a", seq=2)).outcome is Outcome.OUT_OF_ORDER
    # the key waits for seq 1: with no minimum age it counts as blocked already
    assert runner.refresh_key_gauges(min_age=dt.timedelta(0)) == (1, 0)
    assert _gauge(registry, "inbox_blocked_keys") == 1
    # ...but not with the default minute
    assert runner.refresh_key_gauges() == (0, 0)
    assert _gauge(registry, "inbox_blocked_keys") == 0

    assert runner.handle(make_envelope(key="b", seq=1, payload=b"poison")).outcome is (Outcome.DEAD)
    assert runner.handle(make_envelope(key="b", seq=2)).outcome is Outcome.PARKED
    assert runner.refresh_key_gauges()[1] == 1
    assert _gauge(registry, "inbox_held_keys") == 1
    counted = {o: _count(registry, o) for o in ("out_of_order", "dead", "parked", "processed")}
    assert counted == {"out_of_order": 1, "dead": 1, "parked": 1, "processed": 0}


def test_async_runner_counts_too(effects_url: str) -> None:
    registry = CollectorRegistry()

    async def handler(conn: Any, msg: Any) -> None:
        await conn.execute(
            "INSERT INTO effects (consumer, message_id, key, seq) VALUES (%s, %s, %s, %s)",
            ("c", msg.id, msg.key, msg.seq),
        )

    async def main() -> list[Outcome]:
        async with AsyncConnectionPool(effects_url, open=False) as apool:
            runner = AsyncHandlerRunner(
                apool, handler, consumer="c", metrics=InboxMetrics.prometheus(registry)
            )
            msg = make_envelope()
            outcomes = [(await runner.handle(msg)).outcome for _ in range(2)]
            assert await runner.refresh_key_gauges() == (0, 0)
            return outcomes

    assert asyncio.run(main()) == [Outcome.PROCESSED, Outcome.DUPLICATE]
    assert (_count(registry, "processed"), _count(registry, "duplicate")) == (1, 1)
    assert _gauge(registry, "inbox_held_keys") == 0


def test_disabled_metrics_record_nothing(pool: ConnectionPool) -> None:
    runner = HandlerRunner(pool, Flaky(failures=0), consumer="c")
    assert not runner.metrics.enabled
    assert runner.handle(make_envelope()).outcome is Outcome.PROCESSED


def test_a_runner_declares_its_counters_at_zero(pool: ConnectionPool) -> None:
    """An alert's increase() misses a counter series born at 1: the runner creates every
    outcome's and every refusal reason's series at 0 before the first delivery."""
    from outbox.envelope import REFUSAL_REASONS

    registry = CollectorRegistry()
    HandlerRunner(pool, Flaky(failures=0), consumer="c", metrics=InboxMetrics.prometheus(registry))
    for outcome in Outcome:
        assert registry.get_sample_value(
            "inbox_deliveries_total", {"consumer": "c", "outcome": outcome.value}
        ) == 0
    for reason in REFUSAL_REASONS:
        assert registry.get_sample_value(
            "inbox_refused_total", {"consumer": "c", "reason": reason}
        ) == 0


def test_a_batch_counts_each_delivery(pool: ConnectionPool) -> None:
    """handle_batch counts every message of the batch by its own outcome, as handle does."""
    registry = CollectorRegistry()
    runner = HandlerRunner(
        pool, lambda conn, msg: apply_effect(conn, "c", msg), consumer="c", ordered=True,
        metrics=InboxMetrics.prometheus(registry),
    )  # fmt: skip
    first, second, gap = (make_envelope(key="b", seq=s) for s in (1, 2, 4))
    results = runner.handle_batch([first, second, first, gap])
    assert [r.outcome for r in results] == [
        Outcome.PROCESSED, Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.OUT_OF_ORDER,
    ]  # fmt: skip
    assert [_count(registry, o) for o in ("processed", "duplicate", "out_of_order")] == [2, 1, 1]
    assert registry.get_sample_value("inbox_handler_seconds_count", {"consumer": "c"}) == 2
