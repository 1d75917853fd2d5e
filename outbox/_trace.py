"""Capturing the W3C traceparent of the producer's active span, when OpenTelemetry is there."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["current_traceparent"]


def _load() -> Callable[[], str | None]:
    try:
        from opentelemetry import propagate, trace
    except ImportError:  # opentelemetry-api is an optional extra
        return lambda: None

    def capture() -> str | None:
        if not trace.get_current_span().get_span_context().is_valid:
            return None  # no active span: there is no traceparent to carry (the common case)
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier.get("traceparent")

    return capture


current_traceparent = _load()
