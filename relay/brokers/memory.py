"""An in-memory publisher, for the relay's tests and for users' own unit tests.

It records every envelope it accepts, per destination, in publish order (re-sends included, so a
test can see duplicates), and can be told to fail chosen messages::

    pub = MemoryPublisher()
    pub.fail(message_id, permanent=False, times=2)   # first two attempts: RetryablePublishError
    await pub.start()
    await pub.publish_batch(envelopes)
    pub.published("orders")                          # the envelopes sent to "orders", in order
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from outbox.envelope import Envelope
from relay.brokers._batch import Batch, check_size, permanent, retryable
from relay.brokers.base import BrokerFeatures, Destinations

__all__ = ["MemoryPublisher"]


@dataclass
class _Failure:
    permanent: bool
    remaining: int | None  # None: every attempt
    reason: str


class MemoryPublisher:
    """Records envelopes per destination; fails chosen ids on chosen attempts."""

    def __init__(
        self,
        *,
        destinations: Mapping[str, str] | None = None,
        partitions: Mapping[str, int] | None = None,
        max_payload_bytes: int = 0,
        keeps_key_order: bool = True,
    ) -> None:
        self.features = BrokerFeatures(
            name="memory",
            dedup_window_seconds=0,
            keeps_key_order=keeps_key_order,
            headers=True,
            max_payload_bytes=max_payload_bytes,
        )
        self._destination = Destinations(destinations, partitions=partitions)
        self.messages: dict[str, list[Envelope]] = {}
        #: how many times each id was handed to ``publish_batch`` (sent or failed)
        self.attempts: Counter[uuid.UUID] = Counter()
        self._failures: dict[uuid.UUID, _Failure] = {}
        self.started = False
        self.start_count = 0
        self.close_count = 0

    def fail(
        self,
        message_id: uuid.UUID,
        *,
        permanent: bool = False,
        times: int | None = 1,
        reason: str = "injected failure",
    ) -> None:
        """Fail the next ``times`` attempts of ``message_id`` (``None``: every attempt)."""
        self._failures[message_id] = _Failure(permanent, times, reason)

    def published(self, destination: str | None = None) -> list[Envelope]:
        """Envelopes accepted for ``destination`` (all destinations when None), in order."""
        if destination is not None:
            return list(self.messages.get(destination, []))
        return [e for envs in self.messages.values() for e in envs]

    def clear(self) -> None:
        self.messages.clear()
        self.attempts.clear()

    async def start(self) -> None:
        self.started = True
        self.start_count += 1

    async def close(self) -> None:
        if self.started:
            self.close_count += 1
        self.started = False

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        if not self.started:
            await self.start()
        batch = Batch(envelopes, self._destination)
        for i, env, dest in batch.items():
            if batch.skip_if_blocked(i):
                continue
            self.attempts[env.id] += 1
            err: BaseException | None = check_size(
                env, dest, self.features.max_payload_bytes, "memory"
            )
            if err is None:
                err = self._injected(env, dest)
            if err is not None:
                batch.refuse(i, err)
                continue
            self.messages.setdefault(dest, []).append(env)
        return batch.results

    def _injected(self, env: Envelope, dest: str) -> BaseException | None:
        failure = self._failures.get(env.id)
        if failure is None or failure.remaining == 0:
            return None
        if failure.remaining is not None:
            failure.remaining -= 1
        make = permanent if failure.permanent else retryable
        return make(failure.reason, env, dest)
