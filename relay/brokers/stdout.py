"""``stdout:`` sink: every message as one JSON line on standard output (or a given stream).

For debugging a relay's configuration without a broker. Nothing is acknowledged but the write.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from outbox.envelope import Envelope
from outbox.wire import jsonl
from relay.brokers._batch import Batch, check_size
from relay.brokers.base import BrokerFeatures, Destinations

__all__ = ["StdoutPublisher"]


class StdoutPublisher:
    """Writes JSON lines to ``stream`` (default: ``sys.stdout`` at start time)."""

    def __init__(
        self,
        *,
        destinations: Mapping[str, str] | None = None,
        stream: TextIO | None = None,
        max_payload_bytes: int = 0,
    ) -> None:
        self._destination = Destinations(destinations)
        self._given = stream
        self._stream: TextIO | None = None
        self.features = BrokerFeatures(
            name="stdout",
            dedup_window_seconds=0,
            keeps_key_order=True,
            headers=True,
            max_payload_bytes=max_payload_bytes,
        )

    async def start(self) -> None:
        self._stream = self._given if self._given is not None else sys.stdout

    async def close(self) -> None:
        if self._stream is not None:
            self._stream.flush()
        self._stream = None

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        if self._stream is None:
            await self.start()
        assert self._stream is not None
        batch = Batch(envelopes, self._destination)
        lines = []
        for i, env, dest in batch.items():
            if batch.skip_if_blocked(i):
                continue
            err = check_size(env, dest, self.features.max_payload_bytes, "configured")
            if err is not None:
                batch.refuse(i, err)
                continue
            lines.append(jsonl.encode(env, dest))
        self._stream.write("".join(lines))
        self._stream.flush()
        return batch.results
