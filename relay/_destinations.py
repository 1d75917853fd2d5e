"""Topics whose destination refuses messages for now, each paused with its own backoff.

A :class:`~relay.exceptions.DestinationUnavailableError` (no JetStream stream for a subject, a
missing exchange, an unknown or forbidden Kafka topic, a Redis key that is not a stream) is a
configuration to fix, not an outage: the broker answers, and other topics' messages go
through. So only that topic waits. Its rows were released untried; the claim skips the topic
(``paused`` in outbox_claim_batch) until its backoff ends, then takes its heads again as a
probe; the first message it publishes resumes it. What is paused, since when and why is in the
relay's registration (``outbox status``) and the metrics.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

from outbox.kit import redact
from relay._claim import backoff_delay
from relay._config import RelayConfig
from relay._metrics import RelayMetrics

__all__ = ["PausedDestinations"]

log = logging.getLogger("relay")

#: the longest a paused topic waits before it is tried again (an operator who fixed the
#: destination should not wait for the relay's full backoff_max)
MAX_PAUSE_SECONDS = 30.0


@dataclass
class _Pause:
    reason: str
    since: dt.datetime
    failures: int
    until: float  # time.monotonic()
    #: the broker-side name the topic maps to (a stream subject, a queue, an SNS topic's ARN)
    destination: str | None = None


class PausedDestinations:
    """The paused topics of one relay process."""

    def __init__(self, config: RelayConfig, metrics: RelayMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self._pauses: dict[str, _Pause] = {}

    def refused(self, topic: str, error: BaseException) -> None:
        """The topic's destination refused a message: pause the topic (longer each time)."""
        pause = self._pauses.get(topic)
        data = getattr(error, "data", None) or {}
        reason = str(data.get("reason") or error)
        if pause is None:
            pause = self._pauses[topic] = _Pause(reason, dt.datetime.now(dt.UTC), 0, 0.0)
        pause.failures += 1
        pause.reason = reason
        if data.get("destination"):
            pause.destination = str(data["destination"])
        delay = min(backoff_delay(pause.failures, self._config), MAX_PAUSE_SECONDS)
        pause.until = time.monotonic() + delay
        self._metrics.destination_paused.labels(topic).set(1)
        self._metrics.destination_errors.labels(topic).inc()
        log.warning(
            "relay: topic %r paused %.1fs (refused %d time(s) since %s): %s; other topics go on",
            topic,
            delay,
            pause.failures,
            pause.since.isoformat(timespec="seconds"),
            reason,
        )

    def accepted(self, topic: str) -> None:
        """The topic's destination took a message: it flows again."""
        if self._pauses.pop(topic, None) is not None:
            self._metrics.destination_paused.labels(topic).set(0)
            log.info("relay: topic %r accepts messages again; resumed", topic)

    def paused(self) -> list[str]:
        """Topics the next claim must skip (their backoff has not ended)."""
        now = time.monotonic()
        return sorted(t for t, p in self._pauses.items() if p.until > now)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every topic refused since it last took a message, for ``outbox status``."""
        return {
            topic: {
                "destination": redact(p.destination) if p.destination else None,
                "reason": redact(p.reason),
                "since": p.since.isoformat(timespec="seconds"),
                "refusals": p.failures,
            }
            for topic, p in sorted(self._pauses.items())
        }
