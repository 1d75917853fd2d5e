"""CloudEvents through live brokers, checked by an independent implementation: the official
CloudEvents SDK (``cloudevents`` on PyPI).

* The relay, with ``cloudevents=CloudEvents(source=...)`` on its adapter, publishes committed
  rows; the SDK reads the raw broker messages (its Kafka, RabbitMQ and HTTP bindings: NATS and
  SQS use the HTTP binding's ``ce-`` names; MQTT 5, for which the SDK has no binding, is read
  into the SDK's event model from the user properties) and sees id, source, type, subject,
  time, datacontenttype, the sequence and traceparent extensions, and the data.
* Events the SDK writes (another producer's: no sequence) are applied by our consumers once
  per id + source, beside the relay's CloudEvents and a topic still in our own format.

Live: PostgreSQL, NATS JetStream, Kafka (tansu), RabbitMQ, Mosquitto (MQTT 5), SQS (moto).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import (
    AsyncHandlerRunner,
    KafkaConsumer,
    MqttConsumer,
    NatsConsumer,
    Outcome,
    RabbitMQConsumer,
    SqsConsumer,
)
from inbox._consumer import BrokerConsumer
from inbox.testing import ResultLog
from outbox import Message, publish_batch
from outbox.wire.cloudevents import FOREIGN_NAMESPACE, CloudEvents
from relay import Relay
from relay.brokers import publisher_for_url
from relay.brokers.base import Publisher
from tests.relay.relay_helpers import config, running
from tests.support.services import import_or_missing, require_port

SOURCE = "//orders.example.com/svc"
#: "orders" as CloudEvents, "audit" still in our own format (a topic switches on its own)
CE = CloudEvents(source=SOURCE, topics=frozenset({"orders"}))
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _sdk() -> Any:
    return import_or_missing("cloudevents.core.bindings.http", "test")


class Target:
    """One broker: the relay's adapter, a raw reader, a raw writer and our consumer."""

    raw: list[tuple[dict[str, str], bytes, str | None]]

    async def setup(self) -> None: ...

    def publisher(self) -> Publisher:
        raise NotImplementedError

    async def read(self, n: int) -> list[tuple[dict[str, str], bytes, str | None]]:
        """``n`` messages as (headers, body, content type property), in arrival order."""
        raise NotImplementedError

    def sdk_read(self, headers: dict[str, str], body: bytes, ctype: str | None) -> Any:
        from cloudevents.core.bindings import http

        return http.from_binary_event(http.HTTPMessage(headers, body))

    async def write(self, events: Sequence[Any]) -> None:
        raise NotImplementedError

    def consumer(self, runner: AsyncHandlerRunner, log: ResultLog) -> BrokerConsumer:
        raise NotImplementedError

    async def teardown(self) -> None: ...


class Nats(Target):
    async def setup(self) -> None:
        require_port(4222, "NATS")
        import nats

        self.stream, self.subject = f"CE_{uuid.uuid4().hex[:10]}", f"ce.{uuid.uuid4().hex[:10]}"
        self.nc = await nats.connect("nats://127.0.0.1:4222")
        self.js = self.nc.jetstream()
        await self.js.add_stream(name=self.stream, subjects=[self.subject])
        self.next = 1

    def publisher(self) -> Publisher:
        return publisher_for_url("nats://127.0.0.1:4222", destinations={"*": self.subject},
                                 cloudevents=CE)  # fmt: skip

    async def read(self, n: int) -> list[tuple[dict[str, str], bytes, str | None]]:
        out = []
        for seq in range(self.next, self.next + n):
            msg = await self.js.get_msg(self.stream, seq)
            out.append((dict(msg.headers or {}), msg.data, None))
        self.next += n
        return out

    async def write(self, events: Sequence[Any]) -> None:
        from cloudevents.core.bindings import http

        for event in events:
            message = http.to_binary_event(event)
            await self.js.publish(self.subject, message.body, headers=dict(message.headers))

    def consumer(self, runner: AsyncHandlerRunner, log: ResultLog) -> BrokerConsumer:
        return NatsConsumer(runner, stream=self.stream, durable="svc", subject=self.subject,
                            redeliver_delay=0.2, on_result=log)  # fmt: skip

    async def teardown(self) -> None:
        await self.js.delete_stream(self.stream)
        await self.nc.close()


class Kafka(Target):
    async def setup(self) -> None:
        import_or_missing("confluent_kafka", "kafka")
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        from tests.support.kafka_broker import bootstrap

        self.bootstrap = await asyncio.to_thread(bootstrap)
        self.topic = f"ce-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        (created,) = admin.create_topics([NewTopic(self.topic, 1, 1)]).values()
        await asyncio.to_thread(created.result, 10)
        self.producer = Producer({"bootstrap.servers": self.bootstrap})
        self.reader: Any = None

    def publisher(self) -> Publisher:
        return publisher_for_url(f"kafka://{self.bootstrap}", destinations={"*": self.topic},
                                 cloudevents=CE)  # fmt: skip

    async def read(self, n: int) -> list[tuple[dict[str, str], bytes, str | None]]:
        return await asyncio.to_thread(self._read, n)

    def _read(self, n: int) -> list[tuple[dict[str, str], bytes, str | None]]:
        from confluent_kafka import Consumer

        if self.reader is None:
            self.reader = Consumer({"bootstrap.servers": self.bootstrap, "group.id":
                                    uuid.uuid4().hex, "auto.offset.reset": "earliest"})  # fmt: skip
            self.reader.subscribe([self.topic])
        out: list[tuple[dict[str, str], bytes, str | None]] = []
        deadline = time.monotonic() + 60
        while len(out) < n and time.monotonic() < deadline:
            msg = self.reader.poll(0.5)
            if msg is None or msg.error():
                continue
            headers = {k: v.decode() for k, v in (msg.headers() or [])}
            headers["__key"] = msg.key().decode()
            out.append((headers, msg.value(), None))
        return out

    def sdk_read(self, headers: dict[str, str], body: bytes, ctype: str | None) -> Any:
        from cloudevents.core.bindings import kafka

        key = headers.pop("__key")
        raw = {k: v.encode() for k, v in headers.items()}
        return kafka.from_binary_event(kafka.KafkaMessage(headers=raw, key=key, value=body))

    async def write(self, events: Sequence[Any]) -> None:
        from cloudevents.core.bindings import kafka

        for event in events:
            m = kafka.to_binary_event(event)
            self.producer.produce(self.topic, m.value, key=m.key, headers=list(m.headers.items()))
        assert await asyncio.to_thread(self.producer.flush, 10) == 0

    def consumer(self, runner: AsyncHandlerRunner, log: ResultLog) -> BrokerConsumer:
        return KafkaConsumer(runner, config={"bootstrap.servers": self.bootstrap, "group.id":
                             f"svc-{self.topic}", "session.timeout.ms": 6000},
                             topics=[self.topic], poll_timeout=0.2, redeliver_delay=0.1,
                             on_result=log)  # fmt: skip

    async def teardown(self) -> None:
        if self.reader is not None:
            await asyncio.to_thread(self.reader.close)


class RabbitMQ(Target):
    url = "amqp://guest:guest@127.0.0.1:5672/"

    async def setup(self) -> None:
        require_port(5672, "RabbitMQ")
        import aio_pika

        self.queue = f"ce-{uuid.uuid4().hex[:10]}"
        self.conn = await aio_pika.connect(self.url)
        self.channel = await self.conn.channel()
        self.q = await self.channel.declare_queue(self.queue, durable=True)

    def publisher(self) -> Publisher:
        return publisher_for_url(self.url, destinations={"*": self.queue}, cloudevents=CE)

    async def read(self, n: int) -> list[tuple[dict[str, str], bytes, str | None]]:
        out: list[tuple[dict[str, str], bytes, str | None]] = []
        held = []
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            msg = await self.q.get(no_ack=False, fail=False)
            if msg is None:
                await asyncio.sleep(0.05)
                continue
            held.append(msg)
            headers = {k: v.decode() if isinstance(v, bytes) else str(v)
                       for k, v in (msg.headers or {}).items()}  # fmt: skip
            out.append((headers, msg.body, msg.content_type))
        for msg in held:  # back to the queue, for the consumer
            await msg.nack(requeue=True)
        return out

    def sdk_read(self, headers: dict[str, str], body: bytes, ctype: str | None) -> Any:
        from cloudevents.core.bindings import rabbitmq

        return rabbitmq.from_binary_event(rabbitmq.RabbitMQMessage(headers, ctype, body))

    async def write(self, events: Sequence[Any]) -> None:
        import aio_pika
        from cloudevents.core.bindings import rabbitmq

        for event in events:
            m = rabbitmq.to_binary_event(event)
            message = aio_pika.Message(m.body, headers=dict(m.headers),
                                       content_type=m.content_type)  # fmt: skip
            await self.channel.default_exchange.publish(message, self.queue)

    def consumer(self, runner: AsyncHandlerRunner, log: ResultLog) -> BrokerConsumer:
        return RabbitMQConsumer(runner, queue=self.queue, url=self.url, redeliver_delay=0.1,
                                on_result=log)  # fmt: skip

    async def teardown(self) -> None:
        await self.channel.queue_delete(self.queue)
        await self.conn.close()


class Mqtt(Target):
    async def setup(self) -> None:
        require_port(1883, "Mosquitto")
        import paho.mqtt.client as mqtt

        self.topic = f"ce/{uuid.uuid4().hex[:10]}"
        self.seen: list[tuple[dict[str, str], bytes, str | None]] = []
        subscribed = threading.Event()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        client.on_message = lambda _c, _u, msg: self.seen.append((
            dict(getattr(msg.properties, "UserProperty", [])), msg.payload,
            getattr(msg.properties, "ContentType", None)))  # fmt: skip
        client.on_subscribe = lambda *_a: subscribed.set()
        client.connect("127.0.0.1", 1883)
        client.loop_start()
        client.subscribe(self.topic, qos=1)
        assert subscribed.wait(10), "no SUBACK from Mosquitto"
        self.client = client
        self.taken = 0

    def publisher(self) -> Publisher:
        return publisher_for_url("mqtt://127.0.0.1:1883", destinations={"*": self.topic},
                                 cloudevents=CE)  # fmt: skip

    async def read(self, n: int) -> list[tuple[dict[str, str], bytes, str | None]]:
        deadline = time.monotonic() + 30
        while len(self.seen) < self.taken + n and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # paho's thread appends
        out = self.seen[self.taken : self.taken + n]
        self.taken += n
        return out

    def sdk_read(self, headers: dict[str, str], body: bytes, ctype: str | None) -> Any:
        """The MQTT 5 binding (attributes as user properties by name, the content type as its
        property) into the SDK's event model, which checks the attributes."""
        from cloudevents.core.bindings.common import decode_header_value
        from cloudevents.core.formats.json import JSONFormat
        from cloudevents.core.v1.event import CloudEvent

        known = ("specversion", "id", "source", "type", "subject", "time", "sequence",
                 "traceparent")  # fmt: skip
        attributes = {k: v if k != "time" else decode_header_value("time", v)
                      for k, v in headers.items() if k in known}  # fmt: skip
        attributes["datacontenttype"] = ctype
        return CloudEvent(attributes, JSONFormat().read_data(body, ctype))

    async def write(self, events: Sequence[Any]) -> None:
        await asyncio.to_thread(self._write, list(events))

    def _write(self, events: list[Any]) -> None:
        from urllib.parse import unquote

        from cloudevents.core.bindings.common import encode_header_value
        from cloudevents.core.formats.json import JSONFormat
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        for event in events:
            props = Properties(PacketTypes.PUBLISH)
            attributes = event.get_attributes()
            props.ContentType = attributes.get("datacontenttype") or "application/json"
            props.UserProperty = [
                (k, str(v) if k != "time" else unquote(encode_header_value(v)))
                for k, v in attributes.items() if k != "datacontenttype"
            ]  # fmt: skip
            body = JSONFormat().write_data(event.get_data(), props.ContentType)
            self.client.publish(self.topic, body, qos=1, properties=props).wait_for_publish(5)

    def consumer(self, runner: AsyncHandlerRunner, log: ResultLog) -> BrokerConsumer:
        return MqttConsumer(runner, topic=self.topic, client_id=f"ce-{uuid.uuid4().hex[:8]}",
                            redeliver_delay=0.1, on_result=log)  # fmt: skip

    async def teardown(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Sqs(Target):
    async def setup(self) -> None:
        import_or_missing("boto3", "aws")
        from tests.support import aws_server

        self.sqs = aws_server.client("sqs")
        self.endpoint, self.region = aws_server.endpoint(), aws_server.REGION
        self.name = f"ce-{uuid.uuid4().hex[:10]}.fifo"
        self.url = self.sqs.create_queue(
            QueueName=self.name, Attributes={"FifoQueue": "true"}
        )["QueueUrl"]

    def publisher(self) -> Publisher:
        return publisher_for_url(f"sqs://{self.region}?endpoint={self.endpoint}",
                                 destinations={"*": self.name}, cloudevents=CE)  # fmt: skip

    async def read(self, n: int) -> list[tuple[dict[str, str], bytes, str | None]]:
        out: list[tuple[dict[str, str], bytes, str | None]] = []
        receipts = []
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            got = await asyncio.to_thread(
                self.sqs.receive_message, QueueUrl=self.url, MaxNumberOfMessages=10,
                WaitTimeSeconds=1, MessageAttributeNames=["All"], VisibilityTimeout=30,
            )  # fmt: skip
            for m in got.get("Messages", []):
                attrs = {k: a["StringValue"] for k, a in m.get("MessageAttributes", {}).items()}
                out.append((attrs, m["Body"].encode(), None))
                receipts.append(m["ReceiptHandle"])
        for receipt in receipts:  # back to the queue, for the consumer
            self.sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt,
                                               VisibilityTimeout=0)  # fmt: skip
        return out

    async def write(self, events: Sequence[Any]) -> None:
        from cloudevents.core.bindings import http

        for event in events:
            m = http.to_binary_event(event)
            attrs = {k: {"DataType": "String", "StringValue": v} for k, v in m.headers.items()}
            self.sqs.send_message(QueueUrl=self.url, MessageBody=m.body.decode(),
                                  MessageAttributes=attrs, MessageGroupId="sdk",
                                  MessageDeduplicationId=uuid.uuid4().hex)  # fmt: skip

    def consumer(self, runner: AsyncHandlerRunner, log: ResultLog) -> BrokerConsumer:
        return SqsConsumer(runner, queue=self.url, endpoint_url=self.endpoint, wait_seconds=1,
                           visibility_timeout=10, redeliver_delay=0.2, on_result=log)  # fmt: skip

    async def teardown(self) -> None:
        self.sqs.delete_queue(QueueUrl=self.url)


TARGETS = {"nats": Nats, "kafka": Kafka, "rabbitmq": RabbitMQ, "mqtt": Mqtt, "sqs": Sqs}


def _write_rows(url: str) -> list[uuid.UUID]:
    """Three messages of one key as CloudEvents and one on a topic in our own format, written
    inside a span (so they carry its traceparent)."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    _, trace_id, span_id, _ = TRACE.split("-")
    span = NonRecordingSpan(SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False,
                                        trace_flags=TraceFlags(1)))  # fmt: skip
    messages = [Message(topic="orders", key="order 7", payload={"n": n}) for n in range(3)]
    messages.append(Message(topic="audit", key="order 7", payload={"n": 3}))
    with trace.use_span(span), psycopg.connect(url) as conn:
        ids = publish_batch(conn, messages)
        conn.commit()
    return ids


def _created(url: str, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Any]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, created_at FROM outbox_messages WHERE id = ANY(%s)",
                            (list(ids),)).fetchall()  # fmt: skip
    return dict(rows)


async def _relay(url: str, publisher: Publisher, n: int) -> None:
    relay = Relay(config(url, publish_timeout=10, lease_seconds=20), publisher)
    async with running(relay):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with psycopg.connect(url) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM outbox_messages WHERE status = 'published'"
                ).fetchone()
            if row is not None and row[0] >= n:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("the relay did not publish every row")


@pytest.mark.parametrize("broker", list(TARGETS))
def test_the_cloudevents_sdk_reads_what_the_relay_wrote(url: str, broker: str) -> None:
    _sdk()
    import_or_missing("opentelemetry.trace", "otel")
    target = TARGETS[broker]()

    async def go() -> list[tuple[dict[str, str], bytes, str | None]]:
        await target.setup()
        try:
            ids = _write_rows(url)
            await _relay(url, target.publisher(), len(ids))
            return await target.read(len(ids))
        finally:
            await target.teardown()

    raw = asyncio.run(go())
    with psycopg.connect(url) as conn:
        rows = {r[0]: r[1:] for r in conn.execute(
            "SELECT id, topic, seq, created_at FROM outbox_messages").fetchall()}  # fmt: skip
    assert len(raw) == len(rows) == 4
    ours = [(h, b, c) for h, b, c in raw if any(k.lower() == "outbox-id" for k in h)]
    assert len(ours) == 1  # "audit", not a CloudEvents topic: our own format, beside them
    assert not any(k.lower().startswith(("ce-", "ce_")) for k in ours[0][0])
    events = [target.sdk_read(dict(h), b, c) for h, b, c in raw if (h, b, c) not in ours]
    assert sorted(uuid.UUID(e.get_id()) for e in events) == sorted(
        i for i, (topic, _, _) in rows.items() if topic == "orders")  # fmt: skip
    for event in events:
        topic, seq, created = rows[uuid.UUID(event.get_id())]
        assert event.get_specversion() == "1.0"
        assert event.get_source() == SOURCE
        assert event.get_type() == topic == "orders"
        assert event.get_subject() == "order 7"
        assert event.get_time() == created
        assert event.get_datacontenttype() == "application/json"
        assert event.get_extension("sequence") == f"{seq:019d}"
        assert event.get_extension("traceparent") == TRACE
        assert event.get_data() == {"n": seq - 1}


@pytest.mark.parametrize("broker", list(TARGETS))
def test_our_consumer_applies_sdk_events_and_the_relays_in_both_formats(
    url: str, broker: str
) -> None:
    """The relay's CloudEvents (one key, in order) and a message in our own format; then two
    events of another producer written with the SDK, one of them twice: each applied once."""
    _sdk()
    import_or_missing("opentelemetry.trace", "otel")
    from cloudevents.core.v1.event import CloudEvent

    target = TARGETS[broker]()
    foreign = [CloudEvent({"type": "com.example.shipped", "source": "/warehouse", "id": f"A-{n}",
                           "subject": "parcel"}, {"parcel": n}) for n in (1, 2)]  # fmt: skip
    log = ResultLog()
    applied: list[tuple[str, str, int, bytes]] = []

    async def handler(conn: Any, env: Any) -> None:
        applied.append((env.topic, env.key, env.seq, env.payload))

    async def go() -> list[uuid.UUID]:
        await target.setup()
        try:
            async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
                runner = AsyncHandlerRunner(pool, handler, consumer="ce-svc", ordered=True)
                consumer = target.consumer(runner, log)
                task = asyncio.create_task(consumer.run())
                async with asyncio.timeout(30):
                    await consumer.ready.wait()
                ids = _write_rows(url)
                await _relay(url, target.publisher(), len(ids))
                await target.write([foreign[0], foreign[1], foreign[0]])  # the first twice
                theirs = [uuid.uuid5(FOREIGN_NAMESPACE, f"/warehouse\nA-{n}") for n in (1, 2)]
                await log.wait_processed([*ids, *theirs], within=60)
                await log.wait_for(lambda lg: len(lg.outcomes(Outcome.DUPLICATE)) >= 1, 30)
                consumer.stop()
                await task
                return ids
        finally:
            await target.teardown()

    asyncio.run(go())
    assert [(k, s) for t, k, s, _ in applied if t == "orders"] == [
        ("order 7", 1), ("order 7", 2), ("order 7", 3)]  # fmt: skip
    assert [(k, s) for t, k, s, _ in applied if t == "audit"] == [("order 7", 1)]
    theirs = sorted(p for t, _, _, p in applied if t == "com.example.shipped")
    assert len(theirs) == 2  # the copy of A-1 was a duplicate
    assert [p.replace(b" ", b"") for p in theirs] == [b'{"parcel":1}', b'{"parcel":2}']
