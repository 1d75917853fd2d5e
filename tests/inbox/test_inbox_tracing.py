"""A span per delivery that continues the producer's trace (OpenTelemetry SDK, in memory)."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from inbox import HandlerRunner, Outcome
from tests.inbox.inbox_helpers import Flaky, make_envelope

PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{PRODUCER_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inbox import _tracing

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    # the process-wide provider can be set only once: patch the lookups instead (undone after)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(trace, "get_tracer", lambda name: tracer)
    assert _tracing.trace is trace
    return memory


def test_each_delivery_has_a_span_in_the_producers_trace(
    pool: ConnectionPool, exporter: Any
) -> None:
    runner = HandlerRunner(pool, Flaky(failures=1), consumer="billing", max_attempts=5)
    msg = make_envelope(traceparent=TRACEPARENT, seq=7)
    outcomes = [runner.handle(msg).outcome for _ in range(3)]
    assert outcomes == [Outcome.FAILED, Outcome.PROCESSED, Outcome.DUPLICATE]
    spans = exporter.get_finished_spans()
    assert [s.attributes["inbox.outcome"] for s in spans] == ["failed", "processed", "duplicate"]
    for span in spans:
        assert span.name == "orders process"
        assert format(span.context.trace_id, "032x") == PRODUCER_TRACE
        assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
        assert span.attributes["messaging.message.id"] == str(msg.id)
        assert span.attributes["messaging.consumer.group.name"] == "billing"
        assert span.attributes["outbox.seq"] == 7
        assert span.end_time >= span.start_time
    assert spans[0].status.status_code.name == "ERROR"
    assert spans[0].events[0].name == "exception"


def test_a_batch_records_one_span_per_message(pool: ConnectionPool, exporter: Any) -> None:
    runner = HandlerRunner(pool, Flaky(failures=0), consumer="billing")
    traced = make_envelope(key="a", traceparent=TRACEPARENT)
    untraced = make_envelope(key="b")
    runner.handle_batch([traced, untraced])
    spans = {s.attributes["messaging.message.id"]: s for s in exporter.get_finished_spans()}
    assert set(spans) == {str(traced.id), str(untraced.id)}
    assert format(spans[str(traced.id)].context.trace_id, "032x") == PRODUCER_TRACE
    assert spans[str(untraced.id)].parent is None  # no traceparent: a trace of its own
    assert {s.attributes["messaging.batch.message_count"] for s in spans.values()} == {2}
