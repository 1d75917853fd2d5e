"""RabbitMQ queue consumer with manual acks: ack after commit, nack+requeue to redeliver."""

from __future__ import annotations

import functools
from typing import Any

from inbox._claimcheck import ClaimCheckResolver
from inbox._consumer import Batching, BrokerConsumer, Delivery, ResultCallback
from inbox._runner import AsyncHandlerRunner, Result
from outbox.kit import DEFAULT_MAX_RECEIVE_BYTES, require
from outbox.wire import rabbitmq as wire

__all__ = ["RabbitMQConsumer"]


class RabbitMQConsumer(BrokerConsumer):
    """Consume ``queue`` with ``prefetch`` unacknowledged messages in flight.

    A failed or out-of-order message is requeued after ``redeliver_delay=``; an undecodable one
    is rejected without requeue (to the queue's dead-letter exchange, if it has one).
    """

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        queue: str,
        url: str = "amqp://guest:guest@127.0.0.1:5672/",
        prefetch: int = 10,
        redeliver_delay: float = 1.0,
        on_result: ResultCallback | None = None,
        batching: Batching | None = None,
        max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
        claim_check: ClaimCheckResolver | None = None,
    ) -> None:
        require("aio_pika", "rabbitmq")  # fail at construction, naming the extra
        super().__init__(
            runner,
            redeliver_delay=redeliver_delay,
            on_result=on_result,
            batching=batching,
            max_payload_bytes=max_payload_bytes,
            claim_check=claim_check,
        )
        self.queue, self.url = queue, url
        #: unacknowledged messages in flight: at least a whole transaction batch per worker
        self.prefetch = max(prefetch, self.batching.size * self.batching.workers)

    async def _consume(self) -> None:
        import aio_pika

        connection = await aio_pika.connect(self.url)
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self.prefetch)
            queue = await channel.get_queue(self.queue, ensure=True)
            tag = await queue.consume(self._on_message, no_ack=False)
            self.ready.set()
            await self._stopping.wait()
            await queue.cancel(tag)  # no new deliveries; unacked ones return to the queue
            await self._finish_workers()
        finally:
            await connection.close()  # unacknowledged deliveries return to the queue

    async def _on_message(self, message: Any) -> None:
        decode = functools.partial(
            wire.decode, message.headers, message.body, max_payload_bytes=self.max_payload_bytes,
            content_type=message.content_type,  # a CloudEvent's datacontenttype
        )  # fmt: skip
        settle = functools.partial(self._settle, message)
        await self._submit(Delivery(decode, settle, functools.partial(self._where, message)))

    def _where(self, message: Any) -> str:
        return f"queue {self.queue} delivery tag {message.delivery_tag}"

    async def _settle(self, message: Any, result: Result | None) -> None:
        if result is None:
            await message.reject(requeue=False)
        elif result.outcome.ack:
            await message.ack()
        else:
            await self._wait_stopping(self.redeliver_delay)
            await message.nack(requeue=True)
