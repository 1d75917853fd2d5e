"""One small adapter per live broker for the consumer-runner tests.

Test messages are produced with each broker's own client, sending exactly what the broker's
``outbox.wire`` module encodes (what the relay sends). Every name carries a uuid suffix;
everything created is deleted.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Sequence
from typing import Any

from inbox import (
    Amqp1Consumer,
    AsyncHandlerRunner,
    Batching,
    BrokerConsumer,
    KafkaConsumer,
    MqttConsumer,
    NatsConsumer,
    RabbitMQConsumer,
    RedisStreamConsumer,
    SqsConsumer,
)
from inbox._consumer import ResultCallback
from outbox import wire
from outbox.envelope import Envelope


def reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Broker:
    name = ""
    port = 0
    #: how the consumers group deliveries (None: one message per transaction)
    batching: Batching | None = None

    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or uuid.uuid4().hex[:10]
        self.names()

    def names(self) -> None:
        """Derive every broker-side name from the tag (the same in every process)."""

    def spec(self) -> dict[str, Any]:
        """What another process needs to attach consumers to this broker's resources."""
        return {"name": self.name, "tag": self.tag}

    @classmethod
    def attach(cls, spec: dict[str, Any]) -> Broker:
        """The broker of ``spec``, for consumers only (another process did the setup)."""
        kind = BROKERS[spec["name"]]
        if kind is not cls:
            return kind.attach(spec)
        return cls(spec["tag"])

    async def setup(self) -> None: ...

    async def publish(self, envelopes: Sequence[Envelope]) -> None: ...

    def consumer(
        self, runner: AsyncHandlerRunner, on_result: ResultCallback, instance: int
    ) -> BrokerConsumer:
        raise NotImplementedError

    async def teardown(self) -> None: ...


class Nats(Broker):
    name, port = "nats", 4222

    def names(self) -> None:
        self.subject = f"inbox.test.{self.tag}"
        self.stream = f"INBOX_TEST_{self.tag}"

    async def setup(self) -> None:
        import nats
        from nats.js.api import ConsumerConfig, StreamConfig

        self.nc = await nats.connect("nats://127.0.0.1:4222")
        self.js = self.nc.jetstream()
        await self.js.add_stream(StreamConfig(name=self.stream, subjects=[self.subject]))
        # a short ack_wait, so a crashed consumer's message comes back quickly
        await self.js.add_consumer(
            self.stream, ConsumerConfig(durable_name="svc", ack_wait=1.0, ack_policy="explicit")
        )

    async def publish(self, envelopes: Sequence[Envelope]) -> None:
        seen: dict[uuid.UUID, int] = {}
        for env in envelopes:
            # A copy re-sent after JetStream's dedup window (as after a long relay outage) is a
            # new stream message; emulated by varying the Nats-Msg-Id of copies.
            n = seen[env.id] = seen.get(env.id, 0) + 1
            msg = wire.nats.encode(env)
            if n > 1:
                msg.headers[wire.nats.MSG_ID_HEADER] = f"{env.id}/resent-{n}"
            await self.js.publish(self.subject, msg.data, headers=msg.headers)

    def consumer(self, runner: Any, on_result: ResultCallback, instance: int) -> BrokerConsumer:
        return NatsConsumer(
            runner,
            stream=self.stream,
            durable="svc",
            subject=self.subject,
            batch=5,
            fetch_timeout=0.5,
            redeliver_delay=0.2,
            on_result=on_result,
            batching=self.batching,
        )

    async def teardown(self) -> None:
        await self.js.delete_stream(self.stream)
        await self.nc.close()


class RabbitMQ(Broker):
    name, port = "rabbitmq", 5672
    url = "amqp://guest:guest@127.0.0.1:5672/"

    def names(self) -> None:
        self.queue = f"inbox-test-{self.tag}"

    async def setup(self) -> None:
        import aio_pika

        self.conn = await aio_pika.connect(self.url)
        self.channel = await self.conn.channel()  # publisher confirms on
        await self.channel.declare_queue(self.queue, durable=True)

    async def publish(self, envelopes: Sequence[Envelope]) -> None:
        import aio_pika

        for env in envelopes:
            msg = wire.rabbitmq.encode(env)
            message = aio_pika.Message(
                msg.body,
                message_id=msg.message_id,
                content_type=msg.content_type,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                headers=dict(msg.headers),
            )
            await self.channel.default_exchange.publish(message, self.queue, mandatory=True)

    def consumer(self, runner: Any, on_result: ResultCallback, instance: int) -> BrokerConsumer:
        return RabbitMQConsumer(
            runner,
            queue=self.queue,
            url=self.url,
            prefetch=5,
            redeliver_delay=0.1,
            on_result=on_result,
            batching=self.batching,
        )

    async def teardown(self) -> None:
        await self.channel.queue_delete(self.queue)
        await self.conn.close()


class Redis(Broker):
    name, port = "redis", 6379

    def names(self) -> None:
        self.stream = f"inbox-test-{self.tag}"

    async def setup(self) -> None:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")

    async def publish(self, envelopes: Sequence[Envelope]) -> None:
        for env in envelopes:
            fields: dict[Any, Any] = wire.redis.encode(env)
            await self.client.xadd(self.stream, fields)

    def consumer(self, runner: Any, on_result: ResultCallback, instance: int) -> BrokerConsumer:
        return RedisStreamConsumer(
            runner,
            stream=self.stream,
            group="svc",
            name=f"member-{instance}",
            block_ms=200,
            claim_idle_ms=300,
            on_result=on_result,
            batching=self.batching,
        )

    async def teardown(self) -> None:
        await self.client.delete(self.stream)
        await self.client.aclose()


class Mqtt(Broker):
    name, port = "mqtt", 1883

    def names(self) -> None:
        self.topic = f"inbox/test/{self.tag}"
        # instances 0 and 1 may run in other processes: their sessions are forgotten too
        self.client_ids: set[str] = {self._client_id(0), self._client_id(1)}

    def _client_id(self, instance: int) -> str:
        return f"inbox-test-{self.tag}-{instance}"

    async def publish(self, envelopes: Sequence[Envelope]) -> None:
        await asyncio.to_thread(self._publish_sync, list(envelopes))

    def _publish_sync(self, envelopes: list[Envelope]) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        client.connect("127.0.0.1", 1883)
        client.loop_start()
        try:
            for env in envelopes:
                msg = wire.mqtt.encode(env)
                props = Properties(PacketTypes.PUBLISH)
                props.ContentType = msg.content_type
                props.UserProperty = msg.user_properties
                client.publish(self.topic, msg.payload, qos=1, properties=props).wait_for_publish(5)
        finally:
            client.disconnect()
            client.loop_stop()

    def consumer(self, runner: Any, on_result: ResultCallback, instance: int) -> BrokerConsumer:
        client_id = self._client_id(instance)
        self.client_ids.add(client_id)
        return MqttConsumer(
            runner,
            topic=f"$share/svc/{self.topic}",
            client_id=client_id,
            redeliver_delay=0.1,
            on_result=on_result,
            batching=self.batching,
        )

    async def teardown(self) -> None:
        await asyncio.to_thread(self._forget_sessions)

    def _forget_sessions(self) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        for client_id in self.client_ids:  # clean start + no expiry: the session is removed
            client = mqtt.Client(
                CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
            )
            client.connect("127.0.0.1", 1883, clean_start=True)
            client.disconnect()


class Kafka(Broker):
    """A real Kafka-protocol broker (tansu, see tests/support/kafka_broker.py); one topic of 4
    partitions per test, so two consumers of a group split it."""

    name, port = "kafka", 0
    offsets_in_db = False
    bootstrap = ""
    partitions = 4

    def names(self) -> None:
        self.topic = f"inbox-test-{self.tag}"

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "bootstrap": self.bootstrap}

    @classmethod
    def attach(cls, spec: dict[str, Any]) -> Broker:
        broker = cls(spec["tag"])
        broker.bootstrap = spec["bootstrap"]
        return broker

    async def setup(self) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        from tests.support.kafka_broker import bootstrap

        self.bootstrap = await asyncio.to_thread(bootstrap)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        (created,) = admin.create_topics([NewTopic(self.topic, self.partitions, 1)]).values()
        await asyncio.to_thread(created.result, 10)
        self.producer = Producer(
            {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all"}
        )

    async def publish(self, envelopes: Sequence[Envelope]) -> None:
        for env in envelopes:
            record = wire.kafka.encode(env)
            self.producer.produce(self.topic, record.value, key=record.key, headers=record.headers)
        remaining = await asyncio.to_thread(self.producer.flush, 10)
        assert remaining == 0

    def consumer(self, runner: Any, on_result: ResultCallback, instance: int) -> BrokerConsumer:
        config = {
            "bootstrap.servers": self.bootstrap,
            # one group per test (the same in every process of the test): a member another
            # test left behind (a killed process) never holds up this test's group
            "group.id": f"svc-{self.tag}",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
        return KafkaConsumer(
            runner,
            config=config,
            topics=[self.topic],
            offsets_in_db=self.offsets_in_db,
            poll_timeout=0.2,
            redeliver_delay=0.1,
            on_result=on_result,
            batching=self.batching,
        )

    async def teardown(self) -> None:
        await asyncio.to_thread(self.producer.flush, 5)


class Amqp1(Broker):
    """AMQP 1.0 on a private RabbitMQ node with its AMQP 1.0 plugin (tests/support/amqp1_broker.py);
    messages are sent with proton's own blocking client, each awaited until accepted."""

    name, port = "amqp1", 0
    url = ""

    def names(self) -> None:
        self.queue = f"inbox-test-{self.tag}"
        self.address = f"/queue/{self.queue}"

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "url": self.url}

    @classmethod
    def attach(cls, spec: dict[str, Any]) -> Broker:
        broker = cls(spec["tag"])
        broker.url = spec["url"]
        return broker

    async def setup(self) -> None:
        from tests.support.amqp1_broker import node

        self.url = (await asyncio.to_thread(node)).url
        self.conn, self.sender = await asyncio.to_thread(self._open)

    def _open(self) -> tuple[Any, Any]:
        from proton import Terminus
        from proton.reactor import LinkOption
        from proton.utils import BlockingConnection

        class Durable(LinkOption):  # the node declares a durable queue for a durable target
            def apply(self, link: Any) -> None:
                link.target.durability = Terminus.DELIVERIES

        conn = BlockingConnection(self.url.replace("amqp1://", "amqp://"), timeout=20)
        return conn, conn.create_sender(self.address, options=Durable())

    async def publish(self, envelopes: Sequence[Envelope]) -> None:
        await asyncio.to_thread(self._publish, list(envelopes))

    def _publish(self, envelopes: list[Envelope]) -> None:
        from proton import Message

        for env in envelopes:
            m = wire.amqp1.encode(env)
            self.sender.send(Message(
                body=m.body, inferred=True, id=m.message_id, group_id=m.group_id,
                group_sequence=m.group_sequence, subject=m.subject, content_type=m.content_type,
                properties=m.properties, durable=True,
            ))  # fmt: skip

    def consumer(self, runner: Any, on_result: ResultCallback, instance: int) -> BrokerConsumer:
        return Amqp1Consumer(
            runner,
            address=self.address,
            url=self.url,
            credit=5,
            redeliver_delay=0.1,
            on_result=on_result,
            batching=self.batching,
        )

    async def teardown(self) -> None:
        await asyncio.to_thread(self.conn.close)


BROKERS: dict[str, type[Broker]] = {b.name: b for b in (Nats, RabbitMQ, Redis, Mqtt, Kafka)}
BROKERS["amqp1"] = Amqp1


class Sqs(Broker):
    """Amazon SQS on moto's server (tests/support/aws_server.py): a FIFO queue, messages sent with
    SendMessageBatch exactly as the relay sends them."""

    name, port = "sqs-fifo", 0
    fifo = True
    endpoint = ""

    def names(self) -> None:
        self.queue = f"inbox-test-{self.tag}{'.fifo' if self.fifo else ''}"

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "endpoint": self.endpoint}

    @classmethod
    def attach(cls, spec: dict[str, Any]) -> Broker:
        broker = cls(spec["tag"])
        broker.endpoint = spec["endpoint"]  # the dummy credentials come in the environment
        return broker

    async def setup(self) -> None:
        from tests.support import aws_server
        self.endpoint = aws_server.endpoint()
        self.sqs = aws_server.client("sqs")
        attributes = {"FifoQueue": "true"} if self.fifo else {}
        self.url = self.sqs.create_queue(QueueName=self.queue, Attributes=attributes)["QueueUrl"]

    async def publish(self, envelopes: Sequence[Envelope]) -> None:
        await asyncio.to_thread(self._publish, list(envelopes))

    def _publish(self, envelopes: list[Envelope]) -> None:
        from outbox.wire import sqs as sqs_wire

        seen: dict[uuid.UUID, int] = {}
        entries = []
        for env in envelopes:
            msg = sqs_wire.encode(env)
            # a copy re-sent after the FIFO dedup window (as after a long relay outage) is a
            # new message; emulated by varying the MessageDeduplicationId of copies
            n = seen[env.id] = seen.get(env.id, 0) + 1
            entry: dict[str, Any] = {"Id": str(len(entries)), "MessageBody": msg.body,
                                     "MessageAttributes": msg.attributes}  # fmt: skip
            if self.fifo:
                entry["MessageGroupId"] = msg.group_id
                entry["MessageDeduplicationId"] = f"{env.id}/{n}" if n > 1 else str(env.id)
            entries.append(entry)
            if len(entries) == 10:
                self._send(entries)
                entries = []
        if entries:
            self._send(entries)

    def _send(self, entries: list[dict[str, Any]]) -> None:
        response = self.sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
        assert not response.get("Failed"), response["Failed"]

    def consumer(self, runner: Any, on_result: ResultCallback, instance: int) -> BrokerConsumer:
        return SqsConsumer(
            runner,
            queue=self.queue,
            endpoint_url=self.endpoint,
            wait_seconds=1,
            visibility_timeout=5,
            redeliver_delay=0.1,
            on_result=on_result,
            batching=self.batching,
        )

    async def teardown(self) -> None:
        await asyncio.to_thread(self.sqs.delete_queue, QueueUrl=self.url)


class SqsStandard(Sqs):
    """A standard queue: no order, no dedup; the inbox's order guard and duplicate check."""

    name = "sqs-standard"
    fifo = False


BROKERS.update({b.name: b for b in (Sqs, SqsStandard)})
