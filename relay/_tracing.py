"""An OpenTelemetry span per published batch, linked to each message's stored traceparent.

Only when ``opentelemetry-api`` is installed; otherwise a no-op context manager.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from outbox.envelope import Envelope

__all__ = ["publish_span"]

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the otel extra is not installed
    trace = None  # type: ignore[assignment]

_MAX_LINKS = 128


def _links(envelopes: Sequence[Envelope]) -> list[Any]:
    propagator = TraceContextTextMapPropagator()
    links = []
    for env in envelopes[:_MAX_LINKS]:
        if not env.traceparent:
            continue
        ctx = propagator.extract({"traceparent": env.traceparent})
        span_ctx = trace.get_current_span(ctx).get_span_context()
        if span_ctx.is_valid:
            links.append(trace.Link(span_ctx, {"messaging.message.id": str(env.id)}))
    return links


@contextlib.contextmanager
def publish_span(envelopes: Sequence[Envelope]) -> Iterator[None]:
    """``outbox publish`` span (kind PRODUCER) linked to the producers' traces."""
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        yield  # no SDK configured: skip the cost of building links
        return
    tracer = trace.get_tracer("outbox-inbox.relay")
    attributes: dict[str, int | str] = {
        "messaging.operation.type": "publish",
        "messaging.batch.message_count": len(envelopes),
    }
    with tracer.start_as_current_span(
        "outbox publish",
        kind=trace.SpanKind.PRODUCER,
        links=_links(envelopes),
        attributes=attributes,
    ):
        yield
