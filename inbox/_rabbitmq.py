"""RabbitMQ queue consumer with manual acks: ack after commit, nack+requeue to redeliver."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any, Unpack

from inbox._consumer import BrokerConsumer, ConsumerOptions, Delivery
from inbox._runner import AsyncHandlerRunner, Result
from outbox.envelope import Envelope
from outbox.kit import require
from outbox.wire import rabbitmq as wire

__all__ = ["RabbitMQConsumer"]


class RabbitMQConsumer(BrokerConsumer):
    """Consume ``queue`` with ``prefetch`` unacknowledged messages in flight.

    A failed or out-of-order message is requeued after ``redeliver_delay=``; an undecodable one
    is rejected without requeue (to the queue's dead-letter exchange, if it has one).

    Deliveries reach the workers in the order the broker sent them. The client (aiormq, under
    aio-pika) runs the consumer callback in a task of its own for each delivery; a callback
    that waited on the workers' bounded buffers let those tasks race (a task woken when the
    buffer had room could be overtaken by a newer one that found room at once), and an
    in-order queue was applied with a quarter of its messages refused as out of order, each
    redelivered after the redeliver delay. So the callback only appends the delivery to an
    inbound list (it never waits); one task hands them on, in delivery-tag order. The list
    holds at most ``prefetch`` messages: the broker sends no more until some are
    acknowledged.
    """

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        queue: str,
        url: str = "amqp://guest:guest@127.0.0.1:5672/",
        prefetch: int = 10,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        require("aio_pika", "rabbitmq")  # fail at construction, naming the extra
        super().__init__(runner, **options)
        self.queue, self.url = queue, url
        #: unacknowledged messages in flight: at least a whole transaction batch per worker
        self.prefetch = max(prefetch, self.batching.size * self.batching.workers)
        self._inbound: collections.deque[Any] = collections.deque()
        self._arrived = asyncio.Event()

    async def _consume(self) -> None:
        import aio_pika

        connection = await aio_pika.connect(self.url)
        pump: asyncio.Task[None] | None = None
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self.prefetch)
            await channel.get_queue(self.queue, ensure=True)  # a missing queue: a clear error
            # aio-pika's own consume wraps each delivery in a message object and a second task
            # per delivery; the channel underneath (aiormq) hands over the frames as they are
            underlay = await channel.get_underlay_channel()
            self._inbound.clear()
            pump = asyncio.create_task(self._pump())
            ok = await underlay.basic_consume(self.queue, self._on_message, no_ack=False)
            self.ready.set()
            stopped = asyncio.create_task(self._stopping.wait())
            await asyncio.wait([stopped, pump], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if pump.done():
                pump.result()  # the pump failed: surface it
            # no new deliveries; unacked ones return to the queue
            await underlay.basic_cancel(ok.consumer_tag or "")
            await self._end_pump(pump)
            await self._finish_workers()
        finally:
            if pump is not None:
                await self._end_pump(pump)
            await connection.close()  # unacknowledged deliveries return to the queue

    async def _end_pump(self, pump: asyncio.Task[None]) -> None:
        """Stop handing deliveries on; what it had not handed on is left unacknowledged."""
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump
        self._inbound.clear()

    async def _on_message(self, message: Any) -> None:
        # never waits: see the class's docstring
        self._inbound.append(message)
        self._arrived.set()

    async def _pump(self) -> None:
        """Hand the deliveries to the workers, in the order the broker sent them."""
        inbound = self._inbound
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            while inbound:
                messages = [inbound.popleft() for _ in range(len(inbound))]
                messages.sort(key=_tag)  # the channel's delivery tags count up in send order
                await self._submit(*(_RabbitDelivery(self, message) for message in messages))


def _tag(message: Any) -> int:
    return int(message.delivery.delivery_tag or 0)


class _RabbitDelivery(Delivery):
    """A delivered AMQP message (aiormq's) and its consumer: one object per message."""

    __slots__ = ("consumer", "message")

    def __init__(self, consumer: RabbitMQConsumer, message: Any) -> None:
        self.consumer, self.message = consumer, message
        self.lend = None

    def decode(self) -> Envelope:
        message = self.message
        return wire.decode(
            message.header.properties.headers,
            message.body,
            max_payload_bytes=self.consumer.max_payload_bytes,
            content_type=message.header.properties.content_type,  # a CloudEvent's datacontenttype
        )

    async def settle(self, result: Result | None) -> None:
        channel, tag = self.message.channel, _tag(self.message)
        if result is None:
            await channel.basic_reject(tag, requeue=False)
        elif result.outcome.ack:
            # queued on the connection, not waited for: the frames go out in order, and one
            # lost with the connection is a redelivery the inbox finds a duplicate. Waiting for
            # each ack's write held every worker a loop turn per message.
            await channel.basic_ack(tag, wait=False)
        else:
            await self.consumer._wait_stopping(self.consumer.redeliver_delay)
            await channel.basic_nack(tag, requeue=True)

    def where(self) -> str:
        return f"queue {self.consumer.queue} delivery tag {_tag(self.message)}"
