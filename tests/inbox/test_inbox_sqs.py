"""What is particular to ``inbox.SqsConsumer`` (moto's server, a real PostgreSQL): malformed
messages are recorded dead and deleted while the consumer goes on; a slow batch keeps its
messages invisible to other consumers by extending their visibility timeout; a consumer that
stops gives back at once what it received but did not apply."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Batching, SqsConsumer
from inbox.testing import ResultLog
from outbox.exceptions import ConfigurationError
from outbox.wire import sqs as wire
from tests.inbox.broker_fixtures import Sqs
from tests.inbox.inbox_helpers import effects, inbox_rows, make_envelope
from tests.support.services import import_or_missing


@pytest.fixture(autouse=True)
def _boto3() -> None:
    import_or_missing("boto3", "aws")


async def _insert(conn: Any, msg: Any) -> None:
    await conn.execute(
        "INSERT INTO effects (consumer, message_id, key, seq) VALUES ('svc', %s, %s, %s)",
        (msg.id, msg.key, msg.seq),
    )


async def _until(check: Any, what: str, within: float = 20) -> None:
    """Poll ``check()`` (a call to the service, in a thread) until true, or fail."""
    end = time.monotonic() + within
    while True:
        if await asyncio.to_thread(check):
            return
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(0.05)


def _count(broker: Sqs) -> int:
    attributes = broker.sqs.get_queue_attributes(
        QueueUrl=broker.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(v) for v in attributes.values())


def test_sqs_malformed_messages_are_recorded_dead_deleted_and_the_consumer_goes_on(
    effects_url: str,
) -> None:
    first, broken, third = (make_envelope(key="K", seq=s) for s in (1, 2, 3))
    log = ResultLog()
    broker = Sqs()

    async def main() -> None:
        await broker.setup()
        try:
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=2) as pool:
                runner = AsyncHandlerRunner(pool, _insert, consumer="svc", ordered=True)
                consumer = broker.consumer(runner, log, 0)
                task = asyncio.create_task(consumer.run())
                await broker.publish([first])
                bad = wire.encode(broken)
                attributes = {
                    **bad.attributes,
                    "outbox-body": {"DataType": "String", "StringValue": "base64"},
                }
                for body, attrs, dedup in (
                    ("%%% not base64", attributes, "b1"),  # its id and seq are readable
                    ('{"Type": "Notification"}', {}, "b2"),  # SNS without raw delivery
                ):
                    broker.sqs.send_message(
                        QueueUrl=broker.url,
                        MessageBody=body,
                        MessageAttributes=attrs,
                        MessageGroupId="K",
                        MessageDeduplicationId=dedup,
                    )
                await broker.publish([third])
                await log.wait_processed([first.id, third.id], within=30)
                # every message deleted, the malformed ones too
                await _until(lambda: _count(broker) == 0, "an empty queue")
                consumer.stop()
                await task
        finally:
            await broker.teardown()

    asyncio.run(main())
    assert [e[3] for e in effects(effects_url, "svc")] == [1, 3]
    status, _, error, seq = inbox_rows(effects_url, "svc")[broken.id]
    assert status == "dead"
    assert seq == 2  # the key moved on past it
    assert "body cannot be read" in error


def test_sqs_slow_batch_keeps_its_messages_invisible_until_committed(effects_url: str) -> None:
    """visibility_timeout=3 s and a handler that takes 7 s: without the extensions another
    consumer would receive the message twice meanwhile."""
    msg = make_envelope(key="slow", seq=1)
    log = ResultLog()
    broker = Sqs()
    stolen: list[Any] = []

    applying = asyncio.Event()

    async def slow(conn: Any, env: Any) -> None:
        applying.set()
        await asyncio.sleep(7)
        await _insert(conn, env)

    async def main() -> None:
        await broker.setup()
        try:
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=2) as pool:
                runner = AsyncHandlerRunner(pool, slow, consumer="svc")
                consumer = SqsConsumer(
                    runner,
                    queue=broker.queue,
                    endpoint_url=broker.endpoint,
                    wait_seconds=1,
                    visibility_timeout=3,
                    on_result=log,
                    batching=Batching(size=5, wait=0.01),
                )
                task = asyncio.create_task(consumer.run())
                await broker.publish([msg])
                async with asyncio.timeout(20):
                    await applying.wait()
                began = time.monotonic()
                while not log.results:  # another consumer polls all along
                    got = await asyncio.to_thread(
                        broker.sqs.receive_message, QueueUrl=broker.url, WaitTimeSeconds=1
                    )
                    stolen.extend(got.get("Messages", []))
                    assert time.monotonic() - began < 30
                consumer.stop()
                await task
        finally:
            await broker.teardown()

    asyncio.run(main())
    assert stolen == []
    assert [e[1] for e in effects(effects_url, "svc")] == [msg.id]


def test_sqs_stopping_gives_back_what_was_not_applied(effects_url: str) -> None:
    """Messages buffered behind a slow one are made visible at once when the consumer stops,
    not after their visibility timeout (300 s here)."""
    slow_one = make_envelope(key="A", seq=1)
    others = [make_envelope(key=f"B{i}", seq=1) for i in range(4)]
    first = ResultLog()
    broker = Sqs()

    async def main() -> None:
        await broker.setup()
        try:
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=2) as pool:
                finishing = asyncio.Event()

                class Observed(SqsConsumer):
                    async def _finish_workers(self) -> None:
                        finishing.set()
                        await super()._finish_workers()

                async def stop_when_all_received(conn: Any, env: Any) -> None:
                    await _insert(conn, env)
                    if env.key == "A":  # the others are received and buffered behind it
                        await _until(lambda: _in_flight(broker) == 5, "all five received")
                        consumer.stop()
                        async with asyncio.timeout(20):
                            await finishing.wait()  # the consumer no longer takes new work

                runner = AsyncHandlerRunner(pool, stop_when_all_received, consumer="svc")
                consumer = Observed(
                    runner,
                    queue=broker.queue,
                    endpoint_url=broker.endpoint,
                    wait_seconds=1,
                    visibility_timeout=300,
                    on_result=first,
                )
                await broker.publish([slow_one])
                task = asyncio.create_task(consumer.run())
                await _until(lambda: _in_flight(broker) == 1, "A received alone, first")
                await broker.publish(others)
                await task
                after = ResultLog()
                fresh = SqsConsumer(
                    runner,
                    queue=broker.queue,
                    endpoint_url=broker.endpoint,
                    wait_seconds=1,
                    visibility_timeout=300,
                    on_result=after,
                )
                task = asyncio.create_task(fresh.run())
                await after.wait_processed([m.id for m in others], within=20)
                fresh.stop()
                await task
        finally:
            await broker.teardown()

    asyncio.run(main())
    assert [e.id for e, _ in first.results] == [slow_one.id]
    assert sorted(e[1] for e in effects(effects_url, "svc")) == sorted(
        m.id for m in [slow_one, *others]
    )


def _in_flight(broker: Sqs) -> int:
    attributes = broker.sqs.get_queue_attributes(
        QueueUrl=broker.url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessagesNotVisible"])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("wait_seconds", 21, "wait_seconds must be 0..20"),
        ("visibility_timeout", 1, "visibility_timeout must be 3..43200"),
        ("receivers", 0, "receivers must be 1..64"),
    ],
)
def test_sqs_consumer_options_are_checked(option: str, value: int, message: str) -> None:
    runner = AsyncHandlerRunner(lambda: None, _insert, consumer="svc")
    with pytest.raises(ConfigurationError, match=message):
        SqsConsumer(runner, queue="q", **{option: value})
