"""Kafka consumer group (confluent-kafka): offsets committed only after the database commit.

With ``offsets_in_db`` the next offset of each partition is also written in the transaction of
the effect (table ``inbox_kafka_offsets``) and read back when partitions are assigned, so the
database alone says how far the consumer got: no window where an effect is committed and its
offset is not (the offset is still committed to Kafka too, for lag monitoring).

With ``partitions`` the consumer joins no group: it is assigned those partitions of its topics
(``assign``) and reads from the offsets stored in the database. That is how an
:class:`inbox.PartitionedConsumer` shares a Kafka topic among processes through leases in the
consumer's database instead of the broker's group protocol (a takeover within the lease, not
the group's session timeout plus its rebalance).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from inbox._consumer import (
    BrokerConsumer,
    ConsumerOptions,
    Invalid,
    described,
)
from inbox._receive import MessageRef
from inbox._runner import AsyncAlso, AsyncBatchAlso, AsyncHandlerRunner, Outcome, Result
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from outbox.kit import require, resolve_async, rows_by_name
from outbox.wire import kafka as wire

__all__ = ["KafkaConsumer"]

log = logging.getLogger("inbox.consumer")


class KafkaConsumer(BrokerConsumer):
    """Consume ``topics`` in the consumer group of ``config["group.id"]``.

    One message per transaction by default; with ``batching=`` up to ``batching.size`` polled
    messages per transaction (Kafka's parallelism is the partition: run more members of the
    group, so ``batching.workers`` must be 1). Offsets are committed after the database commit,
    per partition up to its first message not settled. A failed or out-of-order message is not
    committed: the consumer seeks back to it and polls it again after ``redeliver_delay=``
    (later messages of its partition wait behind it, and come back as duplicates if they were
    applied). ``enable.auto.commit`` and ``enable.auto.offset.store`` are forced off;
    ``session.timeout.ms`` defaults to 10 s (a new group's first assignment waits on it).

    ``partitions``: read only these partitions of each topic, assigned, without joining the
    group (``group.id`` still names whose offsets are committed to Kafka, for lag monitoring).
    It takes ``offsets_in_db=True``: where the consumer resumes is the offset written in the
    transaction of the last effect, so whoever holds the partition next resumes exactly there.
    A partition with no stored offset starts from the group's committed offset, else from
    ``auto.offset.reset``. Meant for :class:`inbox.PartitionedConsumer`'s factory::

        def factory(partition, runner):
            return KafkaConsumer(runner, config=config, topics=["orders"],
                                 partitions=[partition], offsets_in_db=True)
    """

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        config: Mapping[str, Any],
        topics: Sequence[str],
        offsets_in_db: bool = False,
        partitions: Sequence[int] | None = None,
        poll_timeout: float = 0.5,
        schema: str | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        require("confluent_kafka", "kafka")  # fail at construction, naming the extra
        super().__init__(runner, **options)
        if self.batching.workers != 1:
            raise ConfigurationError(
                "KafkaConsumer takes batching.workers=1: offsets are committed per partition in "
                "order, so a partition cannot be applied by several workers; run more members "
                "of the consumer group (more partitions) to apply in parallel"
            )
        missing = [k for k in ("bootstrap.servers", "group.id") if k not in config]
        if missing or not topics:
            raise ConfigurationError(
                f"KafkaConsumer needs config {missing or ''} and at least one topic"
            )
        self.partitions = _checked_partitions(partitions, offsets_in_db)
        self.config = {
            "auto.offset.reset": "earliest",
            # librdkafka's 45 s default makes tansu wait half of it before a new group's first
            # assignment (bench/kafka_join.py); 10 s (Kafka's own default before 3.0) still
            # rides out a GC pause or a slow poll, and finds a dead member in 10 s
            "session.timeout.ms": 10_000,
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
        try:
            if self.partitions is None:
                consumer.subscribe(self.topics, on_assign=self._on_assign(loop))
            else:
                await self._assign(loop, consumer, self.partitions)
            while not self.stopping:
                msg = await loop.run_in_executor(None, consumer.poll, self.poll_timeout)
                if msg is None:
                    continue
                if msg.error():
                    log.warning("inbox: kafka error: %s", msg.error())
                    continue
                if self.batching.size == 1:
                    await self._one(loop, consumer, msg)
                    continue
                more = await loop.run_in_executor(
                    None, consumer.consume, self.batching.size - 1, self.batching.wait
                )
                for extra in more:
                    if extra.error():
                        log.warning("inbox: kafka error: %s", extra.error())
                batch = [msg, *(m for m in more if not m.error())]
                await self._batch(loop, consumer, batch)
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

    async def _assign(
        self, loop: asyncio.AbstractEventLoop, consumer: Any, partitions: list[int]
    ) -> None:
        """Assign ``partitions`` of every topic, each from its offset stored in the database
        (else the group's committed offset, else ``auto.offset.reset``)."""
        from confluent_kafka import OFFSET_STORED, TopicPartition

        for topic in self.topics:
            meta = await self._metadata(loop, consumer, topic)
            if meta is None:
                return  # stopped while the broker was away
            have = meta.topics[topic].partitions if topic in meta.topics else {}
            absent = [p for p in partitions if p not in have]
            if absent:
                raise ConfigurationError(
                    f"kafka topic {topic!r} has {len(have)} partitions: no partition "
                    f"{', '.join(str(p) for p in absent)}; a partitioned consumer's partition "
                    "count must be the topic's"
                )
        stored = await self._stored_offsets()
        consumer.assign([
            TopicPartition(t, p, stored.get((t, p), OFFSET_STORED))
            for t in self.topics for p in partitions
        ])  # fmt: skip
        self.ready.set()

    async def _metadata(self, loop: asyncio.AbstractEventLoop, consumer: Any, topic: str) -> Any:
        """The topic's metadata; while the broker cannot be reached, try again every second
        (a broker outage is not a reason to stop). None: stopped meanwhile."""
        from confluent_kafka import KafkaException

        while not self.stopping:
            try:
                return await loop.run_in_executor(None, consumer.list_topics, topic, 2.0)
            except KafkaException as exc:
                log.warning("inbox: kafka topic %s: no metadata yet (%s); trying again",
                            topic, exc.args[0] if exc.args else type(exc).__name__)  # fmt: skip
                await self._wait_stopping(1.0)
        return None

    async def _stored_offsets(self) -> dict[tuple[str, int], int]:
        params = {"consumer": self.runner.consumer, "topics": self.topics}
        async with self.runner.transactions() as target:
            raw = await resolve_async(target)
            cur = await raw.execute(self._stmts.kafka_offsets_read, params)
            rows = rows_by_name(cur, await cur.fetchall())
            return {(r["topic"], r["partition"]): r["next_offset"] for r in rows}

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
        result = await self._dispatch(
            functools.partial(self._decode_msg, msg), also, functools.partial(_where, msg)
        )
        if result is None or result.outcome.ack:
            commit = functools.partial(consumer.commit, message=msg, asynchronous=False)
            await loop.run_in_executor(None, commit)
        else:
            consumer.seek(TopicPartition(msg.topic(), msg.partition(), msg.offset()))
            await self._wait_stopping(self.redeliver_delay)

    async def _batch(self, loop: asyncio.AbstractEventLoop, consumer: Any, msgs: list[Any]) -> None:
        from confluent_kafka import TopicPartition

        acks = [True] * len(msgs)  # an invalid message is settled (recorded dead) at once
        valid: list[int] = []
        envelopes: list[Envelope] = []
        refs: list[MessageRef] = []
        for i, msg in enumerate(msgs):
            item = self._checked(
                functools.partial(self._decode_msg, msg), functools.partial(_where, msg)
            )
            if isinstance(item, Invalid):
                await self._settle_invalid(item.envelope, item.error, None)
                continue
            valid.append(i)
            envelopes.append(item[0])
            refs.append(item[1])
        results: list[Result] | None = [] if not envelopes else None
        if envelopes:
            also = self._store_offsets(msgs, valid) if self.offsets_in_db else None
            try:
                results = await self.runner._handle_checked(envelopes, refs, also)
            except Exception as exc:  # a bug: each message on its own finds the one at fault
                log.error("inbox: a batch of %d failed, one by one now: %s", len(envelopes),
                          described(exc))  # fmt: skip
        if results is None:
            results = await self._one_by_one([msgs[i] for i in valid], envelopes)
        for i, envelope, result in zip(valid, envelopes, results, strict=True):
            acks[i] = result.outcome.ack
            self._report(envelope, result)
        positions = _next_offsets(msgs, acks)
        commit = [TopicPartition(t, p, offset) for (t, p), (offset, _) in positions.items()]
        await loop.run_in_executor(
            None, functools.partial(consumer.commit, offsets=commit, asynchronous=False)
        )
        behind = [TopicPartition(t, p, o) for (t, p), (o, redo) in positions.items() if redo]
        for partition in behind:
            consumer.seek(partition)
        if behind:
            await self._wait_stopping(self.redeliver_delay)

    async def _one_by_one(self, msgs: list[Any], envelopes: list[Envelope]) -> list[Result]:
        """The batch's messages one transaction each, in order; a partition stops at its first
        message not settled (the ones behind it come again)."""
        results: list[Result] = []
        stopped: set[tuple[str, int]] = set()
        for msg, envelope in zip(msgs, envelopes, strict=True):
            where = (msg.topic(), msg.partition())
            if where in stopped:
                results.append(Result(Outcome.OUT_OF_ORDER, envelope.id))
                continue
            also = self._store_offset(msg) if self.offsets_in_db else None
            result = await self._handle(envelope, also, functools.partial(_where, msg))
            if not result.outcome.ack:
                stopped.add(where)
            results.append(result)
        return results

    def _decode_msg(self, msg: Any) -> Envelope:
        return wire.decode(msg.headers(), msg.value(), max_payload_bytes=self.max_payload_bytes)

    def _store_offsets(self, msgs: list[Any], valid: list[int]) -> AsyncBatchAlso:
        async def store(target: Any, acks: list[bool]) -> None:
            full = [True] * len(msgs)
            for i, ack in zip(valid, acks, strict=True):
                full[i] = ack
            raw = await resolve_async(target)
            for (topic, partition), (offset, _) in _next_offsets(msgs, full).items():
                params = {"consumer": self.runner.consumer, "topic": topic,
                          "partition": partition, "next_offset": offset}  # fmt: skip
                await raw.execute(self._stmts.kafka_offset_store, params)

        return store


def _checked_partitions(partitions: Sequence[int] | None, offsets_in_db: bool) -> list[int] | None:
    if partitions is None:
        return None
    chosen = list(partitions) if isinstance(partitions, list | tuple | range) else None
    if not chosen or any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in chosen):
        raise ConfigurationError(
            f"KafkaConsumer partitions must be a non-empty list of partition numbers (0 and "
            f"up), not {partitions!r}"
        )
    if not offsets_in_db:
        raise ConfigurationError(
            "KafkaConsumer partitions= takes offsets_in_db=True: a partition that changes "
            "hands must resume at the offset written with its last effect"
        )
    return sorted(set(chosen))


def _where(msg: Any) -> str:
    return f"topic {msg.topic()} partition {msg.partition()} offset {msg.offset()}"


def _next_offsets(msgs: list[Any], acks: list[bool]) -> dict[tuple[str, int], tuple[int, bool]]:
    """Per partition, the offset to resume from (its first message not acknowledged, else one
    past its last) and whether the consumer must seek back to it."""
    out: dict[tuple[str, int], tuple[int, bool]] = {}
    for msg, ack in zip(msgs, acks, strict=True):
        where = (msg.topic(), msg.partition())
        if out.get(where, (0, False))[1]:
            continue  # behind an earlier message of its partition that was not settled
        out[where] = (msg.offset() + 1, False) if ack else (msg.offset(), True)
    return out
