"""NATS JetStream durable pull consumer: ack after commit, nak (with a delay) to redeliver."""

from __future__ import annotations

from typing import Any, Unpack

from inbox._consumer import BrokerConsumer, ConsumerOptions, Delivery
from inbox._runner import AsyncHandlerRunner, Result
from outbox.envelope import Envelope
from outbox.kit import require
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
        **options: Unpack[ConsumerOptions],
    ) -> None:
        require("nats", "nats")  # fail at construction, naming the extra
        super().__init__(runner, **options)
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
        return _NatsDelivery(self, msg)


class _NatsDelivery(Delivery):
    """A JetStream message and its consumer: one object per message."""

    __slots__ = ("consumer", "msg")

    def __init__(self, consumer: NatsConsumer, msg: Any) -> None:
        self.consumer, self.msg = consumer, msg
        self.lend = None  # JetStream redelivers a nak'ed message by itself: nothing to lend

    def decode(self) -> Envelope:
        msg = self.msg
        return wire.decode(msg.headers, msg.data, max_payload_bytes=self.consumer.max_payload_bytes)

    async def settle(self, result: Result | None) -> None:
        if result is None:
            await self.msg.term()  # not an outbox message: never redeliver it
        elif result.outcome.ack:
            await self.msg.ack()
        else:
            await self.msg.nak(delay=self.consumer.redeliver_delay)

    def where(self) -> str:
        return f"stream {self.consumer.stream} seq {self.msg.metadata.sequence.stream}"
