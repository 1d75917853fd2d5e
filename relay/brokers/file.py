"""``file:/path`` sink: every message appended as one JSON line (see :mod:`outbox.wire.jsonl`).

For debugging and for tests. A batch is written with one ``write`` from a worker thread, then
flushed (and ``fsync``-ed when ``fsync=True``) before it is acknowledged.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from outbox.envelope import Envelope
from outbox.wire import jsonl
from relay.brokers._batch import Batch, check_size, retryable
from relay.brokers.base import BrokerFeatures, Destinations

__all__ = ["FilePublisher"]


class FilePublisher:
    """Appends JSON lines to a file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        destinations: Mapping[str, str] | None = None,
        fsync: bool = False,
        max_payload_bytes: int = 0,
    ) -> None:
        self.path = Path(path)
        self._destination = Destinations(destinations)
        self._fsync = fsync
        self._file: TextIO | None = None
        self.features = BrokerFeatures(
            name="file",
            dedup_window_seconds=0,
            keeps_key_order=True,
            headers=True,
            max_payload_bytes=max_payload_bytes,
        )

    async def start(self) -> None:
        if self._file is None:
            self._file = await asyncio.to_thread(self.path.open, "a", encoding="utf-8")

    async def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            await asyncio.to_thread(file.close)

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        await self.start()
        batch = Batch(envelopes, self._destination)
        lines, written = [], []
        for i, env, dest in batch.items():
            if batch.skip_if_blocked(i):
                continue
            err = check_size(env, dest, self.features.max_payload_bytes, "configured")
            if err is not None:
                batch.refuse(i, err)
                continue
            lines.append(jsonl.encode(env, dest))
            written.append(i)
        try:
            await asyncio.to_thread(self._write, "".join(lines))
        except OSError as exc:
            error = exc
            batch.fail_all(
                written,
                lambda i: retryable(f"cannot write {self.path}: {error}", envelopes[i],
                                    batch.destinations[i], error),
            )  # fmt: skip
        return batch.results

    def _write(self, text: str) -> None:
        assert self._file is not None
        self._file.write(text)
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
