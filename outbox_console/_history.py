"""Backlog and publish rate per topic over time, sampled while the console runs.

The outbox keeps no history of its backlog, so the console samples it every ``interval``
seconds and keeps the last ``keep`` samples in memory (an hour at the defaults): the overview's
charts start when the console starts.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg

from relay.admin import published_since, relay_status

__all__ = ["History"]

log = logging.getLogger("outbox.console")


class History:
    """Samples taken on connections from ``connection()`` (the console's pool)."""

    def __init__(
        self,
        connection: Callable[[], AbstractContextManager[psycopg.Connection[Any]]],
        schema: str | None,
        interval: float,
        keep: int = 360,
    ) -> None:
        self._connection, self._schema, self.interval = connection, schema, interval
        self.samples: deque[dict[str, Any]] = deque(maxlen=keep)

    def sample(self) -> dict[str, Any]:
        """One sample now: pending messages per topic, and messages published per second per
        topic over the last interval."""
        with self._connection() as conn:
            status = relay_status(conn, schema=self._schema)
            published = published_since(conn, self.interval, schema=self._schema)
        point = {
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "backlog": {t["topic"]: int(t["pending"]) for t in status.topics},
            "rate": {topic: round(n / self.interval, 2) for topic, n in published.items()},
        }
        self.samples.append(point)
        return point

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled; a failed sample is logged."""
        while True:
            try:
                await asyncio.to_thread(self.sample)
            except psycopg.Error as exc:
                log.warning("console: could not sample the backlog: %s", exc)
            await asyncio.sleep(self.interval)

    def series(self) -> dict[str, Any]:
        """The samples as chart series: labels, then one series per topic and measure."""
        samples = list(self.samples)
        topics = sorted({t for s in samples for t in (*s["backlog"], *s["rate"])})
        return {
            "labels": [s["at"] for s in samples],
            "backlog": {t: [s["backlog"].get(t, 0) for s in samples] for t in topics},
            "rate": {t: [s["rate"].get(t, 0) for s in samples] for t in topics},
        }
