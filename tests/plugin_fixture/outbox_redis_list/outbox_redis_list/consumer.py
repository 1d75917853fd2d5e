"""The inbox's side: BLMOVE each element from the list into a processing list; LREM it there
once its outcome is committed, or move it back to the head of the list to be applied again."""

from __future__ import annotations

import functools
from typing import Any, Unpack

from inbox import AsyncHandlerRunner
from inbox.brokers import BrokerConsumer, ConsumerOptions, Delivery, Result
from outbox_redis_list import wire

__all__ = ["ListConsumer"]


class ListConsumer(BrokerConsumer):
    """Read the list ``key`` (``key + ":processing"`` holds the elements being applied)."""

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        key: str,
        url: str = "redis://127.0.0.1:6379/0",
        block_seconds: float = 1.0,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(runner, **options)
        self.key, self.url, self.block_seconds = key, url, block_seconds
        self.processing = f"{key}:processing"

    async def _consume(self) -> None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(self.url)
        try:
            # elements a stopped consumer left in processing go first
            while await client.lmove(self.processing, self.key, "RIGHT", "LEFT") is not None:
                pass
            self.ready.set()
            while not self.stopping:
                element = await client.blmove(
                    self.key, self.processing, self.block_seconds, "LEFT", "RIGHT"
                )
                if element is not None:
                    await self._submit(self._delivery(client, element))
        finally:
            await self._finish_workers()
            await client.aclose()

    def _delivery(self, client: Any, element: bytes) -> Delivery:
        decode = functools.partial(wire.decode, element, max_payload_bytes=self.max_payload_bytes)
        settle = functools.partial(self._settle, client, element)
        return Delivery(decode, settle, lambda: f"list {self.key}")

    async def _settle(self, client: Any, element: bytes, result: Result | None) -> None:
        pipe = client.pipeline(transaction=True)
        pipe.lrem(self.processing, 1, element)
        if result is not None and not result.outcome.ack:
            pipe.lpush(self.key, element)  # applied again, first
        await pipe.execute()
