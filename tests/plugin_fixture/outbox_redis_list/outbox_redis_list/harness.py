"""The contract suite's view of this broker (relay.contract.Harness): a list per test, read
back with LRANGE."""

from __future__ import annotations

import os
from typing import Any

from outbox.envelope import Envelope
from outbox_redis_list import wire
from outbox_redis_list.publisher import ListPublisher
from relay.contract import Harness, await_condition

__all__ = ["ListHarness"]

#: the Redis server the suite uses
REDIS_URL = os.environ.get("OUTBOX_REDIS_LIST_URL", "redis://127.0.0.1:6379/0")


class ListHarness(Harness):
    name = "redis-list"
    bad_payload = 1001  # the publishers below refuse more than 1000 bytes

    def unavailable_destination(self) -> str:
        return f"{self.ns}-string"  # a string key: RPUSH fails with WRONGTYPE

    async def open(self) -> None:
        import redis.asyncio

        self.client = redis.asyncio.Redis.from_url(REDIS_URL)
        await self.client.set(self.unavailable_destination(), "not a list")

    async def cleanup(self) -> None:
        await self.client.delete(self.ns, self.unavailable_destination())
        await self.client.aclose()

    def publisher(self, **options: Any) -> ListPublisher:
        return ListPublisher(REDIS_URL, destinations=self.destinations(), max_payload_bytes=1000,
                             **options)  # fmt: skip

    def unreachable(self) -> ListPublisher:
        return ListPublisher("redis://127.0.0.1:1/0", connect_timeout=1)

    async def fetch(self, n: int) -> list[Any]:
        async def arrived() -> bool:
            return int(await self.client.llen(self.ns)) >= n

        await await_condition(arrived, f"{n} list elements")
        return list(await self.client.lrange(self.ns, 0, -1))

    def encode(self, env: Envelope) -> Any:
        return wire.encode(env)

    def decode(self, raw: Any) -> Envelope:
        return wire.decode(raw)

    async def stored(self) -> int:
        return int(await self.client.llen(self.ns))
