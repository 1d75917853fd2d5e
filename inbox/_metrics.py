"""Consumer-side Prometheus metrics (optional extra ``metrics``).

Pass ``metrics=InboxMetrics.prometheus(registry)`` to a runner: every delivery is counted by
outcome, the handler's seconds and the end-to-end lag (from the message's ``created_at`` to
its commit here) are observed, every broker message refused by the decoders is counted by
reason (``inbox_refused``), and the broker consumers refresh two gauges on a timer: keys
that keep waiting for a predecessor (``outbox inbox blocked``) and keys held behind a dead
message (``outbox inbox held``); a partitioned consumer also reports its partition count and
how many it holds (``inbox_partitions``, ``inbox_partitions_owned``). Without it the runners
use no-op metrics that cost nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from outbox.envelope import REFUSAL_REASONS
from outbox.exceptions import ConfigurationError
from outbox.kit import NoopMetric

__all__ = ["InboxMetrics"]


class InboxMetrics:
    """The inbox's counters, histograms and gauges, labelled by consumer."""

    def __init__(self, registry: Any | None) -> None:
        self.registry = registry
        if registry is None:
            noop: Any = NoopMetric()
            self.deliveries = self.handler_seconds = self.lag_seconds = self.refused = noop
            self.blocked_keys = self.held_keys = noop
            self.partitions = self.partitions_owned = noop
            return
        from prometheus_client import Counter, Gauge, Histogram

        kw: dict[str, Any] = {"registry": registry}
        self.deliveries = Counter(
            "inbox_deliveries",
            "Deliveries by outcome (processed, duplicate, stale, out_of_order, failed, dead, "
            "parked)",
            ["consumer", "outcome"],
            **kw,
        )
        self.refused = Counter(
            "inbox_refused",
            "Broker messages refused before any effect (not a valid outbox message, or an "
            "exception while decoding or handling it), by reason (outbox.envelope."
            "REFUSAL_REASONS)",
            ["consumer", "reason"],
            **kw,
        )
        self.handler_seconds = Histogram(
            "inbox_handler_seconds", "Time in the handler, per delivery", ["consumer"], **kw
        )
        self.lag_seconds = Histogram(
            "inbox_end_to_end_lag_seconds",
            "From the message's created_at (the producer's transaction) to its commit here",
            ["consumer"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600),
            **kw,
        )
        self.blocked_keys = Gauge(
            "inbox_blocked_keys",
            "Keys waiting longer than a minute for a predecessor that keeps not arriving",
            ["consumer"],
            **kw,
        )
        self.held_keys = Gauge(
            "inbox_held_keys", "Keys held behind a dead message (on_dead=hold)", ["consumer"], **kw
        )
        self.partitions = Gauge(
            "inbox_partitions",
            "A partitioned consumer's partition count (inbox.PartitionedConsumer)",
            ["consumer"],
            **kw,
        )
        self.partitions_owned = Gauge(
            "inbox_partitions_owned",
            "Partitions this process holds and consumes now; summed over the processes of a "
            "consumer, its partition count once the leases settle",
            ["consumer"],
            **kw,
        )

    @classmethod
    def disabled(cls) -> InboxMetrics:
        return cls(None)

    @classmethod
    def prometheus(cls, registry: Any | None = None) -> InboxMetrics:
        """Metrics in ``registry`` (default: prometheus_client's global registry)."""
        try:
            import prometheus_client
        except ImportError as exc:
            raise ConfigurationError(
                "inbox metrics need prometheus-client: pip install 'outbox-inbox[metrics]'"
            ) from exc
        return cls(registry if registry is not None else prometheus_client.REGISTRY)

    def declare(self, consumer: str, outcomes: Iterable[str]) -> None:
        """Create ``consumer``'s counter series at 0, so the first dead or refused message is
        an increase that an alert rule's ``increase()`` sees (a series born at 1 is not)."""
        if self.registry is None:
            return
        for outcome in outcomes:
            self.deliveries.labels(consumer, outcome)
        for reason in sorted(REFUSAL_REASONS):
            self.refused.labels(consumer, reason)

    @property
    def enabled(self) -> bool:
        return self.registry is not None

    def delivered(
        self, consumer: str, outcome: str, handler_seconds: float | None, message: Any
    ) -> None:
        self.deliveries.labels(consumer, outcome).inc()
        if handler_seconds is not None:
            self.handler_seconds.labels(consumer).observe(handler_seconds)
        created = getattr(message, "created_at", None)
        if outcome == "processed" and isinstance(created, dt.datetime) and created.tzinfo:
            lag = (dt.datetime.now(dt.UTC) - created).total_seconds()
            self.lag_seconds.labels(consumer).observe(max(lag, 0.0))
