"""An OpenTelemetry span per delivery, continuing the producer's trace from the message's
``traceparent``.

Only when ``opentelemetry-api`` is installed and an SDK is configured; otherwise nothing is
built. The span covers the delivery's transaction (for a batch: the batch's transaction, with
``messaging.batch.message_count``) and is recorded once the outcome is known, so it carries
the outcome and, for a failure, the error.
"""

from __future__ import annotations

from typing import Any

__all__ = ["trace_delivery", "tracing"]

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the otel extra is not installed
    trace = None  # type: ignore[assignment]


def tracing() -> bool:
    """True when spans are recorded: opentelemetry-api installed and an SDK configured. A
    batch asks once, then records its deliveries with ``check=False``."""
    return trace is not None and not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    )


def trace_delivery(
    consumer: str,
    message: Any,
    outcome: str,
    error: BaseException | None,
    start_ns: int,
    end_ns: int,
    batch_size: int = 1,
    *,
    check: bool = True,
) -> None:
    """Record the span ``<topic> process`` (kind CONSUMER) of one delivery; ``check=False``
    when the caller has just seen :func:`tracing` return True."""
    if check and not tracing():
        return
    traceparent = getattr(message, "traceparent", None)
    parent = (
        TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        if traceparent
        else None
    )
    attributes: dict[str, str | int] = {
        "messaging.operation.type": "process",
        "messaging.destination.name": str(getattr(message, "topic", "")),
        "messaging.consumer.group.name": consumer,
        "messaging.message.id": str(getattr(message, "id", "")),
        "outbox.key": str(getattr(message, "key", "")),
        "inbox.outcome": outcome,
    }
    seq = getattr(message, "seq", None)
    if isinstance(seq, int):
        attributes["outbox.seq"] = seq
    if batch_size > 1:
        attributes["messaging.batch.message_count"] = batch_size
    tracer = trace.get_tracer("outbox-inbox.inbox")
    span = tracer.start_span(
        f"{attributes['messaging.destination.name']} process",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        start_time=start_ns,
    )
    if error is not None:
        span.record_exception(error)
        if outcome in ("failed", "dead"):
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}"))
    span.end(end_time=end_ns)
