"""No input stops a consumer, on every live broker.

A stream of good messages (three keys, in order) with one message of each malformed kind in
between: a seq of 5,000 digits, -3, abc, 1e9, beyond 64 bits, 0; an id that is not a UUID or
empty; an empty topic; an oversized key, topic or header; too many headers; a body above the
consumer's ``max_payload_bytes``; a created-at that is no time; no outbox headers at all; and,
where the broker carries header bytes (RabbitMQ, Kafka, Redis), a value that is not UTF-8.

Every good message is applied once, in key order; the consumer is still running at the end;
each bad one is counted once in ``inbox_refused`` under its reason (a redelivered one would be
counted again), recorded dead when its id is readable, and settled at the broker (nothing
pending or unacknowledged there once the consumer stops).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Batching, InboxMetrics
from inbox.testing import ResultLog, wait_until_processed
from outbox import wire
from outbox.envelope import (
    HEADER_CREATED_AT,
    HEADER_ID,
    HEADER_KEY,
    HEADER_SEQ,
    HEADER_TOPIC,
    Envelope,
)
from tests.inbox.broker_fixtures import Broker
from tests.inbox.inbox_helpers import effects, inbox_rows, make_envelope
from tests.inbox.test_inbox_brokers import _broker

#: the consumers' max_payload_bytes here (small, so an oversized body is cheap to send)
LIMIT = 64 * 1024
KEYS, PER_KEY = ("K0", "K1", "K2"), 5

Headers = dict[str, str | bytes | bytearray]


@dataclass
class Bad:
    """A malformed message: its headers (from a valid envelope's), body, expected reason(s)."""

    kind: str
    envelope: Envelope
    headers: Headers
    body: bytes
    reasons: frozenset[str]
    id_readable: bool


def _bad(kind: str, reasons: str, change: Callable[[Headers], object], body: bytes = b"{}",
         *, id_readable: bool = True) -> Bad:  # fmt: skip
    env = make_envelope(key=f"bad-{kind}", seq=1)
    headers: Headers = dict(env.to_headers())
    change(headers)
    return Bad(kind, env, headers, body, frozenset(reasons.split("|")), id_readable)


def _set(name: str, value: str | bytes | bytearray) -> Callable[[Headers], object]:
    return lambda h: h.__setitem__(name, value)


def bad_messages(broker: str) -> list[Bad]:
    bad = [
        _bad("seq-5000-digits", "bad_seq", _set(HEADER_SEQ, "9" * 5_000)),
        _bad("seq-negative", "bad_seq", _set(HEADER_SEQ, "-3")),
        _bad("seq-abc", "bad_seq", _set(HEADER_SEQ, "abc")),
        _bad("seq-1e9", "bad_seq", _set(HEADER_SEQ, "1e9")),
        _bad("seq-beyond-64-bits", "bad_seq", _set(HEADER_SEQ, str(2**64))),
        _bad("seq-zero", "bad_seq", _set(HEADER_SEQ, "0")),
        _bad("id-not-a-uuid", "bad_id", _set(HEADER_ID, "not-a-uuid"), id_readable=False),
        # a client may drop an empty header value: then the header is missing
        _bad("id-empty", "bad_id|missing_header", _set(HEADER_ID, ""), id_readable=False),
        _bad("topic-empty", "bad_topic|missing_header", _set(HEADER_TOPIC, "")),
        _bad("key-oversized", "bad_key", _set(HEADER_KEY, "k" * 2_000)),
        _bad("topic-oversized", "bad_topic", _set(HEADER_TOPIC, "t" * 300)),
        # refused before the id is read: the bound comes first
        _bad("header-oversized", "bad_header", _set("x-big", "v" * 20_000), id_readable=False),
        _bad(
            "too-many-headers",
            "too_many_headers",
            lambda h: h.update({f"x-h{i}": "v" for i in range(100)}),
            id_readable=False,
        ),
        _bad("payload-oversized", "payload_too_large", lambda h: None, b"x" * (LIMIT + 1)),
        _bad("created-at-garbage", "bad_created_at", _set(HEADER_CREATED_AT, "yesterday")),
        _bad("no-outbox-headers", "missing_header", lambda h: h.clear(), id_readable=False),
    ]
    if broker in ("rabbitmq", "kafka", "redis", "amqp1"):  # header values travel as bytes there
        value = bytearray(b"\xff\xfe") if broker == "rabbitmq" else b"\xff\xfe"  # AMQP bytes
        bad.append(_bad("not-utf8", "not_utf8", _set("x-tenant", value),
                        id_readable=False))  # fmt: skip
    return bad


async def publish_raw(broker: Broker, headers: Headers, body: bytes, key: str) -> None:
    """Send a message as a hostile producer would: straight to the broker, bypassing the
    relay's encoding, with the broker's own client."""
    b: Any = broker
    if broker.name == "nats":
        await b.js.publish(b.subject, body, headers={k: str(v) for k, v in headers.items()})
    elif broker.name == "rabbitmq":
        import aio_pika

        message = aio_pika.Message(body, headers=dict(headers))
        await b.channel.default_exchange.publish(message, b.queue, mandatory=True)
    elif broker.name == "kafka":
        pairs = [(k, v if not isinstance(v, str) else v.encode()) for k, v in headers.items()]
        b.producer.produce(b.topic, body, key=key.encode(), headers=pairs)
        assert await asyncio.to_thread(b.producer.flush, 10) == 0
    elif broker.name == "redis":
        await b.client.xadd(b.stream, {**headers, wire.redis.PAYLOAD_FIELD: body})
    elif broker.name == "amqp1":
        from proton import Message

        props = {k: bytes(v) if isinstance(v, bytearray) else v for k, v in headers.items()}
        message = Message(body=body, inferred=True, properties=props, durable=True)
        await asyncio.to_thread(b.sender.send, message)
    else:
        await asyncio.to_thread(_mqtt_publish, b.topic, headers, body)


def _mqtt_publish(topic: str, headers: Headers, body: bytes) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    try:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.UserProperty = [(k, str(v)) for k, v in headers.items()]
        client.publish(topic, body, qos=1, properties=props).wait_for_publish(5)
    finally:
        client.disconnect()
        client.loop_stop()


class Refusals(logging.Handler):
    """Wakes the test at each log line of the inbox (a refusal is logged after it is counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.loop.call_soon_threadsafe(self.changed.set)

    async def until(self, condition: Callable[[], bool], within: float) -> None:
        async with asyncio.timeout(within):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


async def settled_at_broker(broker: Broker) -> bool:
    """Nothing left pending or unacknowledged at the broker (the consumer has stopped)."""
    b: Any = broker
    if broker.name == "nats":
        info = await b.js.consumer_info(b.stream, "svc")
        return bool(info.num_ack_pending == 0 and info.num_pending == 0)
    if broker.name == "rabbitmq":
        queue = await b.channel.declare_queue(b.queue, passive=True)
        return bool(queue.declaration_result.message_count == 0)
    if broker.name == "redis":
        pending = await b.client.xpending(b.stream, "svc")
        return bool(pending["pending"] == 0)
    if broker.name == "kafka":
        return await asyncio.to_thread(_kafka_committed_to_end, b)
    if broker.name == "amqp1":
        from tests.support.amqp1_broker import node

        listing = await asyncio.to_thread(node().ctl, "list_queues", "name", "messages",
                                          "--no-table-headers", "-q")  # fmt: skip
        return dict(ln.split("\t") for ln in listing.strip().splitlines())[b.queue] == "0"
    return True  # MQTT: no broker-side view; the exact count in inbox_refused is the check


def _kafka_committed_to_end(b: Any) -> bool:
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"svc-{b.tag}"})
    try:
        parts = [TopicPartition(b.topic, p) for p in range(b.partitions)]
        committed = probe.committed(parts, timeout=10)
        ends = [probe.get_watermark_offsets(p, timeout=10)[1] for p in parts]
        # committed past the end of every partition (tansu may report an end one short)
        return all(max(c.offset, 0) >= end for c, end in zip(committed, ends, strict=True))
    finally:
        probe.close()


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("name", ["nats", "rabbitmq", "kafka", "redis", "mqtt", "amqp1"])
def test_no_malformed_message_stops_a_consumer(effects_url: str, name: str, batched: bool) -> None:
    broker = _broker(name)
    if batched:  # batches of several messages; Kafka's parallelism is the partition
        broker.batching = Batching(size=10, wait=0.05, workers=1 if name == "kafka" else 2)
    bad = bad_messages(name)
    good = {key: [make_envelope(key=key, seq=s) for s in range(1, PER_KEY + 1)] for key in KEYS}
    registry = CollectorRegistry()

    def refused(reason: str | None = None) -> float:
        total = 0.0
        for metric in registry.collect():
            for sample in metric.samples:
                if sample.name == "inbox_refused_total" and reason in (
                    None,
                    sample.labels["reason"],
                ):
                    total += sample.value
        return total

    async def main() -> None:
        refusals = Refusals()
        logging.getLogger("inbox").addHandler(refusals)
        await broker.setup()
        try:
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=4) as pool:

                async def handler(conn: Any, msg: Any) -> None:
                    await conn.execute(
                        "INSERT INTO effects (consumer, message_id, key, seq) "
                        "VALUES ('svc', %s, %s, %s)",
                        (msg.id, msg.key, msg.seq),
                    )

                runner = AsyncHandlerRunner(
                    pool, handler, consumer="svc", ordered=True,
                    metrics=InboxMetrics.prometheus(registry),
                )  # fmt: skip
                consumer = broker.consumer(runner, ResultLog(), 0)
                consumer.max_payload_bytes = LIMIT
                if name == "redis":  # no reclaim of an entry pending while its batch runs
                    consumer.claim_idle_ms = 60_000
                task = asyncio.create_task(consumer.run())
                async with asyncio.timeout(30):
                    await consumer.ready.wait()
                # interleaved: a good message of each key, then a bad one, and so on
                queue = list(bad)
                for s in range(PER_KEY):
                    await broker.publish([good[key][s] for key in KEYS])
                    for _ in range(4):
                        if queue:
                            b = queue.pop(0)
                            await publish_raw(broker, b.headers, b.body, b.envelope.key)
                ids = [env.id for key in KEYS for env in good[key]]
                await asyncio.to_thread(
                    wait_until_processed, effects_url, consumer="svc", ids=ids, timeout=60
                )
                await refusals.until(lambda: refused() >= len(bad), 30)
                assert not task.done(), "the consumer stopped on a malformed message"
                consumer.stop()
                await task  # returns: nothing escaped run()
            assert await settled_at_broker(broker), "a malformed message was left unsettled"
        finally:
            logging.getLogger("inbox").removeHandler(refusals)
            await broker.teardown()

    asyncio.run(main())

    by_key: dict[str, list[int]] = {}
    for _, _, key, seq in effects(effects_url, "svc"):
        by_key.setdefault(key, []).append(seq)
    assert by_key == {key: list(range(1, PER_KEY + 1)) for key in KEYS}  # once each, in order
    assert refused() == len(bad)  # counted once each: none redelivered
    for b in bad:
        assert sum(refused(r) for r in b.reasons) >= 1, f"{b.kind}: no refusal under {b.reasons}"
    expected: dict[str, int] = {}
    for b in bad:
        if len(b.reasons) == 1:
            (reason,) = b.reasons
            expected[reason] = expected.get(reason, 0) + 1
    for reason, n in expected.items():
        assert refused(reason) >= n, reason
    rows = inbox_rows(effects_url, "svc")
    for b in bad:
        if b.id_readable:
            status, _, last_error, _ = rows[b.envelope.id]
            assert status == "dead", b.kind
            assert last_error, b.kind


@pytest.mark.parametrize("batched", [False, True])
def test_an_exception_escaping_the_runner_never_ends_run(
    effects_url: str, batched: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Bugs, injected on live NATS: ``runner.check`` raising (a decoder-side bug) and
    ``runner.handle`` raising (a handler-wrapper bug) make their message a poison message,
    logged with its traceback and recorded dead, and the key moves on; a lost database
    connection escaping the same way is redelivered, not dead-lettered. The consumer keeps
    running and every other message is applied once, in order."""
    broker = _broker("nats")
    if batched:
        broker.batching = Batching(size=10, wait=0.05, workers=2)
    msgs = [make_envelope(key="K", seq=s) for s in range(1, 8)]
    check_bug, handle_bug, transient = msgs[1].id, msgs[3].id, msgs[4].id
    registry = CollectorRegistry()
    lost_once = {transient}

    async def main() -> None:
        refusals = Refusals()
        logging.getLogger("inbox").addHandler(refusals)
        await broker.setup()
        try:
            async with AsyncConnectionPool(effects_url, min_size=1, max_size=4) as pool:

                async def handler(conn: Any, msg: Any) -> None:
                    await conn.execute(
                        "INSERT INTO effects (consumer, message_id, key, seq) "
                        "VALUES ('svc', %s, %s, %s)",
                        (msg.id, msg.key, msg.seq),
                    )

                runner = AsyncHandlerRunner(
                    pool, handler, consumer="svc", ordered=True,
                    metrics=InboxMetrics.prometheus(registry),
                )  # fmt: skip
                check, handle, handle_batch = runner.check, runner.handle, runner._handle_checked

                def buggy_check(message: Any) -> Any:
                    if message.id == check_bug:
                        raise KeyError("\x1b[2J a bug in a check")
                    return check(message)

                async def buggy_handle(message: Any, *, also: Any = None) -> Any:
                    if message.id == handle_bug:
                        raise RuntimeError("\x1b[2J a bug in a wrapper")
                    if message.id in lost_once:
                        lost_once.discard(message.id)
                        raise psycopg.OperationalError("the connection is lost")
                    return await handle(message, also=also)

                async def buggy_batch(messages: Any, refs: Any, also: Any = None) -> Any:
                    if {m.id for m in messages} & {handle_bug, *lost_once}:
                        raise RuntimeError("a bug in the batch path")
                    return await handle_batch(messages, refs, also)

                runner.check = buggy_check  # type: ignore[method-assign]
                runner.handle = buggy_handle  # type: ignore[method-assign]
                # the consumers hand the batch path the refs that check returned
                runner._handle_checked = buggy_batch  # type: ignore[method-assign, assignment]
                consumer = broker.consumer(runner, ResultLog(), 0)
                task = asyncio.create_task(consumer.run())
                async with asyncio.timeout(30):
                    await consumer.ready.wait()
                await broker.publish(msgs)
                await asyncio.to_thread(
                    wait_until_processed, effects_url, consumer="svc",
                    ids=[m.id for m in msgs], timeout=60,
                )  # fmt: skip
                assert not task.done(), "an exception ended run()"
                consumer.stop()
                await task
        finally:
            logging.getLogger("inbox").removeHandler(refusals)
            await broker.teardown()

    asyncio.run(main())
    applied = [row[3] for row in effects(effects_url, "svc")]
    assert applied == [1, 3, 5, 6, 7]  # the two poison messages skipped, the key moved on
    rows = inbox_rows(effects_url, "svc")
    assert rows[check_bug][0] == rows[handle_bug][0] == "dead"
    assert "KeyError" in rows[check_bug][2]
    assert "RuntimeError" in rows[handle_bug][2]
    assert rows[transient][0] == "processed"  # redelivered, not dead-lettered
    errors = registry.get_sample_value(
        "inbox_refused_total", {"consumer": "svc", "reason": "error"}
    )
    assert errors == 2
    formatter = logging.Formatter()
    logged = "\n".join(formatter.format(r) for r in caplog.records)  # with any traceback
    assert "a bug in a wrapper" in logged
    assert "Traceback" in logged  # where the bug is
    assert "\x1b" not in logged  # escaped: the hostile text cannot drive a terminal
