"""NATS JetStream durable pull consumer: ack after commit, nak (with a delay) to redeliver."""

from __future__ import annotations

import functools
from typing import Any

from inbox._consumer import Batching, BrokerConsumer, Delivery, ResultCallback
from inbox._runner import AsyncHandlerRunner, Result
from outbox._limits import DEFAULT_MAX_RECEIVE_BYTES
from outbox._optional import require
from outbox.wire import nats as wire

__all__ = ["NatsConsumer"]


class NatsConsumer(BrokerConsumer):
    """Pull ``batch`` messages at a time from the durable consumer ``durable`` on ``stream``.

    The durable must allow explicit acks (the default of ``pull_subscribe``). Its
    ``ack_wait`` bounds how long a crashed consumer's messages stay invisible; ``max_deliver``
    should be unlimited (-1, the default): poison messages are settled by the inbox
    (``max_attempts``), not dropped by the broker.
    """

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        stream: str,
        durable: str,
        subject: str | None = None,
        servers: str | list[str] = "nats://127.0.0.1:4222",
        batch: int = 10,
        fetch_timeout: float = 1.0,
        redeliver_delay: float = 1.0,
        on_result: ResultCallback | None = None,
        batching: Batching | None = None,
        max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
    ) -> None:
        require("nats", "nats")  # fail at construction, naming the extra
        super().__init__(
            runner,
            redeliver_delay=redeliver_delay,
            on_result=on_result,
            batching=batching,
            max_payload_bytes=max_payload_bytes,
        )
        self.stream, self.durable, self.subject = stream, durable, subject
        self.servers, self.fetch_timeout = servers, fetch_timeout
        #: messages per fetch: at least a whole transaction batch for every worker
        self.batch = max(batch, self.batching.size * self.batching.workers)

    async def _consume(self) -> None:
        import nats
        from nats.errors import TimeoutError as NatsTimeout

        nc = await nats.connect(self.servers)
        try:
            js = nc.jetstream()
            sub = await js.pull_subscribe(
                self.subject or "", durable=self.durable, stream=self.stream
            )
            self.ready.set()
            while not self.stopping:
                try:
                    msgs = await sub.fetch(self.batch, timeout=self.fetch_timeout)
                except (NatsTimeout, TimeoutError):  # nats-py raises either
                    continue
                await self._submit(*(self._delivery(msg) for msg in msgs))
        finally:
            await self._finish_workers()
            await nc.close()

    def _delivery(self, msg: Any) -> Delivery:
        decode = functools.partial(
            wire.decode, msg.headers, msg.data, max_payload_bytes=self.max_payload_bytes
        )
        settle = functools.partial(self._settle, msg)
        return Delivery(decode, settle, functools.partial(self._where, msg))

    def _where(self, msg: Any) -> str:
        return f"stream {self.stream} seq {msg.metadata.sequence.stream}"

    async def _settle(self, msg: Any, result: Result | None) -> None:
        if result is None:
            await msg.term()  # not an outbox message: never redeliver it
        elif result.outcome.ack:
            await msg.ack()
        else:
            await msg.nak(delay=self.redeliver_delay)
