"""Kafka consumer group (confluent-kafka): offsets committed only after the database commit.

With ``offsets_in_db`` the next offset of each partition is also written in the transaction of
the effect (table ``inbox_kafka_offsets``) and read back when partitions are assigned, so the
database alone says how far the consumer got: no window where an effect is committed and its
offset is not (the offset is still committed to Kafka too, for lag monitoring).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from inbox._consumer import BrokerConsumer, ResultCallback
from inbox._runner import AsyncAlso, AsyncHandlerRunner
from inbox._wire import decode_kafka
from outbox._connections import resolve_async
from outbox.exceptions import ConfigurationError

__all__ = ["KafkaConsumer"]

log = logging.getLogger("inbox.consumer")


class KafkaConsumer(BrokerConsumer):
    """Consume ``topics`` in the consumer group of ``config["group.id"]``, one message at a time.

    A failed or out-of-order message is not committed: the consumer seeks back to it and polls
    it again after ``redeliver_delay`` (later messages of its partition wait behind it).
    ``enable.auto.commit`` and ``enable.auto.offset.store`` are forced off.
    """

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        config: Mapping[str, Any],
        topics: Sequence[str],
        offsets_in_db: bool = False,
        poll_timeout: float = 0.5,
        redeliver_delay: float = 1.0,
        on_result: ResultCallback | None = None,
        schema: str | None = None,
    ) -> None:
        super().__init__(runner, redeliver_delay=redeliver_delay, on_result=on_result)
        missing = [k for k in ("bootstrap.servers", "group.id") if k not in config]
        if missing or not topics:
            raise ConfigurationError(
                f"KafkaConsumer needs config {missing or ''} and at least one topic"
            )
        self.config = {
            "auto.offset.reset": "earliest",
            **config,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
        self.topics, self.offsets_in_db, self.poll_timeout = (
            list(topics),
            offsets_in_db,
            poll_timeout,
        )
        from inbox._statements import inbox_statements

        self._stmts = inbox_statements(schema)

    async def _consume(self) -> None:
        from confluent_kafka import Consumer

        loop = asyncio.get_running_loop()
        consumer = Consumer(self.config)
        consumer.subscribe(self.topics, on_assign=self._on_assign(loop))
        try:
            while not self.stopping:
                msg = await loop.run_in_executor(None, consumer.poll, self.poll_timeout)
                if msg is None:
                    continue
                if msg.error():
                    log.warning("inbox: kafka error: %s", msg.error())
                    continue
                await self._one(loop, consumer, msg)
        finally:
            await loop.run_in_executor(None, consumer.close)

    def _on_assign(self, loop: asyncio.AbstractEventLoop) -> Any:
        def on_assign(consumer: Any, partitions: list[Any]) -> None:
            if self.offsets_in_db:  # runs in the poll thread while the event loop is free
                future = asyncio.run_coroutine_threadsafe(self._stored_offsets(), loop)
                stored = future.result(timeout=30)
                for p in partitions:
                    p.offset = stored.get((p.topic, p.partition), p.offset)
            consumer.assign(partitions)
            loop.call_soon_threadsafe(self.ready.set)

        return on_assign

    async def _stored_offsets(self) -> dict[tuple[str, int], int]:
        params = {"consumer": self.runner.consumer, "topics": self.topics}
        async with self.runner.transactions() as target:
            raw = await resolve_async(target)
            cur = await raw.execute(self._stmts.kafka_offsets_read, params)
            return {(t, p): o for t, p, o in await cur.fetchall()}

    def _store_offset(self, msg: Any) -> AsyncAlso:
        params = {
            "consumer": self.runner.consumer,
            "topic": msg.topic(),
            "partition": msg.partition(),
            "next_offset": msg.offset() + 1,
        }

        async def store(target: Any) -> None:
            raw = await resolve_async(target)
            await raw.execute(self._stmts.kafka_offset_store, params)

        return store

    async def _one(self, loop: asyncio.AbstractEventLoop, consumer: Any, msg: Any) -> None:
        from confluent_kafka import TopicPartition

        also = self._store_offset(msg) if self.offsets_in_db else None
        result = await self._dispatch(lambda: decode_kafka(msg.headers(), msg.value()), also)
        if result is None or result.outcome.ack:
            commit = functools.partial(consumer.commit, message=msg, asynchronous=False)
            await loop.run_in_executor(None, commit)
        else:
            consumer.seek(TopicPartition(msg.topic(), msg.partition(), msg.offset()))
            await self._wait_stopping(self.redeliver_delay)
