"""Redis Streams consumer group: XACK after commit; XAUTOCLAIM takes over stuck entries."""

from __future__ import annotations

import functools
from typing import Any

from inbox._claimcheck import ClaimCheckResolver
from inbox._consumer import Batching, BrokerConsumer, Delivery, ResultCallback
from inbox._runner import AsyncHandlerRunner, Result
from outbox.envelope import shown
from outbox.kit import DEFAULT_MAX_RECEIVE_BYTES, require
from outbox.wire import redis as wire

__all__ = ["RedisStreamConsumer"]


class RedisStreamConsumer(BrokerConsumer):
    """Read ``stream`` as member ``name`` of consumer group ``group`` (created if missing,
    from the start of the stream).

    An entry is XACKed only after its transaction committed. An entry left pending (failed,
    out of order, or its consumer crashed) is claimed again with XAUTOCLAIM once it has been
    idle for ``claim_idle_ms``, by this or any other member of the group.
    """

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        stream: str,
        group: str,
        name: str,
        url: str = "redis://127.0.0.1:6379/0",
        batch: int = 10,
        block_ms: int = 1000,
        claim_idle_ms: int = 30_000,
        on_result: ResultCallback | None = None,
        batching: Batching | None = None,
        max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
        claim_check: ClaimCheckResolver | None = None,
    ) -> None:
        require("redis.asyncio", "redis")  # fail at construction, naming the extra
        super().__init__(
            runner,
            redeliver_delay=claim_idle_ms / 1000,
            on_result=on_result,
            batching=batching,
            max_payload_bytes=max_payload_bytes,
            claim_check=claim_check,
        )
        self.stream, self.group, self.name, self.url = stream, group, name, url
        self.block_ms, self.claim_idle_ms = block_ms, claim_idle_ms
        #: entries per read: at least a whole transaction batch for every worker
        self.batch = max(batch, self.batching.size * self.batching.workers)

    async def _consume(self) -> None:
        import redis.asyncio as aioredis
        from redis.exceptions import ResponseError

        client = aioredis.Redis.from_url(self.url)
        try:
            try:
                await client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self.ready.set()
            while not self.stopping:
                await self._reclaim(client)
                response: Any = await client.xreadgroup(
                    self.group, self.name, {self.stream: ">"}, count=self.batch, block=self.block_ms
                )
                for _stream, entries in response or []:
                    await self._submit(*(self._delivery(client, e, f) for e, f in entries))
        finally:
            await self._finish_workers()
            await client.aclose()

    async def _reclaim(self, client: Any) -> None:
        reply = await client.xautoclaim(
            self.stream,
            self.group,
            self.name,
            min_idle_time=self.claim_idle_ms,
            start_id="0-0",
            count=self.batch,
        )
        # None/empty fields: the entry was trimmed away meanwhile
        await self._submit(*(self._delivery(client, e, f) for e, f in reply[1] if f))

    def _delivery(self, client: Any, entry_id: Any, fields: Any) -> Delivery:
        decode = functools.partial(wire.decode, fields, max_payload_bytes=self.max_payload_bytes)
        settle = functools.partial(self._settle, client, entry_id)
        return Delivery(decode, settle, functools.partial(self._where, entry_id))

    def _where(self, entry_id: Any) -> str:
        return f"stream {self.stream} entry {shown(entry_id)}"

    async def _settle(self, client: Any, entry_id: Any, result: Result | None) -> None:
        if result is None or result.outcome.ack:
            await client.xack(self.stream, self.group, entry_id)
        # otherwise the entry stays pending: XAUTOCLAIM hands it out again once idle
