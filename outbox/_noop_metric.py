"""A metric that records nothing: what the relay's and the inbox's metrics use when no
Prometheus registry is given, so the code that counts never asks whether metrics are on."""

from __future__ import annotations

from typing import Any

__all__ = ["NoopMetric"]


class NoopMetric:
    """Takes the calls of a prometheus_client Counter, Gauge or Histogram; does nothing."""

    def labels(self, *args: Any, **kwargs: Any) -> NoopMetric:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass

    def clear(self) -> None:
        pass
