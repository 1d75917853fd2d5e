"""RabbitMQ queue consumer with manual acks: ack after commit, nack+requeue to redeliver."""

from __future__ import annotations

import asyncio
from typing import Any

from inbox._consumer import BrokerConsumer, ResultCallback
from inbox._runner import AsyncHandlerRunner
from inbox._wire import decode_rabbitmq

__all__ = ["RabbitMQConsumer"]


class RabbitMQConsumer(BrokerConsumer):
    """Consume ``queue`` with ``prefetch`` unacknowledged messages in flight.

    A failed or out-of-order message is requeued after ``redeliver_delay``; an undecodable one
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
    ) -> None:
        super().__init__(runner, redeliver_delay=redeliver_delay, on_result=on_result)
        self.queue, self.url, self.prefetch = queue, url, prefetch
        self._inflight: set[asyncio.Task[None]] = set()
        self._crash: BaseException | None = None

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
            if self._inflight:
                await asyncio.gather(*self._inflight, return_exceptions=True)
        finally:
            await connection.close()  # unacknowledged deliveries return to the queue
        if self._crash is not None:
            raise self._crash

    async def _on_message(self, message: Any) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            await self._settle(message)
        except Exception as exc:  # unexpected (not a handler failure): stop, surface from run()
            self._crash = self._crash or exc
            self.stop()
        finally:
            if task is not None:
                self._inflight.discard(task)

    async def _settle(self, message: Any) -> None:
        result = await self._dispatch(lambda: decode_rabbitmq(message.headers, message.body))
        if result is None:
            await message.reject(requeue=False)
        elif result.outcome.ack:
            await message.ack()
        else:
            await self._wait_stopping(self.redeliver_delay)
            await message.nack(requeue=True)
