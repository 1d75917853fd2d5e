"""One harness per built-in broker (relay.contract.Harness): a unique namespace on the live
broker, and a reader that fetches what was published with the broker's own client. ``fetch``
returns each message as the client hands it to a consumer, in the shape of the broker's
``outbox.wire`` module (so it can be compared with what ``encode`` produced), and ``read``
decodes it with that module's ``decode``, the function the inbox's consumers use.

Every harness maps topic ``t`` to its unique destination and topic ``bad`` to a destination the
broker refuses for good (where the refusal is a destination property); ``bad_payload`` is the
body size the broker refuses when the refusal is a size limit instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import threading
import time
from pathlib import Path
from typing import Any

from outbox.envelope import Envelope
from outbox.wire import amqp1, jsonl, kafka, mqtt, nats, rabbitmq, redis, sqs
from relay.brokers import Publisher
from relay.contract import DEADLINE, Harness
from tests.support.poll import await_for


class MemoryHarness(Harness):
    name = "memory"
    wire = False
    bad_payload = 1001  # limit configured below: 1000

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.memory import MemoryPublisher

        self.last = MemoryPublisher(destinations=self.destinations(), max_payload_bytes=1000,
                                    **options)  # fmt: skip
        return self.last  # type: ignore[no-any-return]

    async def read(self, n: int) -> list[Envelope]:
        await await_for(
            lambda: len(self.last.published(self.dest)) >= n, within=DEADLINE, what=f"{n} messages"
        )
        return self.last.published(self.dest)  # type: ignore[no-any-return]


class StdoutHarness(Harness):
    name = "stdout"
    bad_payload = 1001  # limit configured below: 1000

    def __init__(self) -> None:
        super().__init__()
        self.stream = io.StringIO()

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.stdout import StdoutPublisher

        return StdoutPublisher(destinations=self.destinations(), stream=self.stream,
                               max_payload_bytes=1000, **options)  # fmt: skip

    async def fetch(self, n: int) -> list[Any]:
        return self.stream.getvalue().splitlines(keepends=True)

    def encode(self, env: Envelope) -> Any:
        return jsonl.encode(env, self.dest)

    def decode(self, raw: Any) -> Envelope:
        destination, env = jsonl.decode(raw)
        assert destination == self.dest
        return env


class FileHarness(Harness):
    name = "file"
    bad_payload = 1001  # limit configured below: 1000

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.path = tmp / f"{self.ns}.jsonl"

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.file import FilePublisher

        return FilePublisher(self.path, destinations=self.destinations(), max_payload_bytes=1000,
                             fsync=True, **options)  # fmt: skip

    async def fetch(self, n: int) -> list[Any]:
        if not self.path.exists():
            return []
        return self.path.read_text(encoding="utf-8").splitlines(keepends=True)

    def encode(self, env: Envelope) -> Any:
        return jsonl.encode(env, self.dest)

    def decode(self, raw: Any) -> Envelope:
        destination, env = jsonl.decode(raw)
        assert destination == self.dest
        return env


class NatsHarness(Harness):
    name = "nats"
    port = 4222
    bad_payload = 2 * 1024 * 1024  # > the server's 1 MiB max_payload

    @property
    def dest(self) -> str:
        return f"{self.ns}.t"

    def unavailable_destination(self) -> str:
        return f"{self.ns}-nostream.t"  # no JetStream stream covers this subject

    async def open(self) -> None:
        import nats

        self.nc = await nats.connect("nats://127.0.0.1:4222")
        self.js = self.nc.jetstream()

    async def cleanup(self) -> None:
        import nats.js.errors

        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.js.delete_stream(self.ns)
        await self.nc.close()

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.nats import NatsPublisher

        return NatsPublisher("nats://127.0.0.1:4222", destinations=self.destinations(),
                             stream=self.ns, create_stream=True, timeout=10, **options)  # fmt: skip

    def unreachable(self) -> Publisher:
        from relay.brokers.nats import NatsPublisher

        return NatsPublisher("nats://127.0.0.1:1", connect_timeout=1)

    async def fetch(self, n: int) -> list[Any]:
        sub = await self.js.pull_subscribe(self.dest, stream=self.ns)
        out: list[nats.NatsMessage] = []
        try:
            while len(out) < n:
                for msg in await sub.fetch(min(500, n - len(out)), timeout=DEADLINE):
                    out.append(nats.NatsMessage(headers=dict(msg.headers or {}), data=msg.data))
                    await msg.ack()
        finally:
            await sub.unsubscribe()
        return out

    def encode(self, env: Envelope) -> Any:
        return nats.encode(env)

    def decode(self, raw: Any) -> Envelope:
        return nats.decode(raw.headers, raw.data)

    async def stored(self) -> int:
        info = await self.js.stream_info(self.ns)
        return int(info.state.messages)


class RabbitHarness(Harness):
    name = "rabbitmq"
    port = 5672

    def bad_destination(self) -> str:
        return f"{self.ns}-unbound"  # default exchange, no such queue: unroutable

    def unavailable_destination(self) -> str:
        return f"{self.ns}-no-such-exchange/rk"  # an exchange nobody declared

    async def open(self) -> None:
        import aio_pika

        self.conn = await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/")
        self.channel = await self.conn.channel()
        self.queue = await self.channel.declare_queue(self.ns, durable=False)

    async def cleanup(self) -> None:
        await self.queue.delete(if_unused=False, if_empty=False)
        await self.conn.close()

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(destinations=self.destinations(), **options)

    def unreachable(self) -> Publisher:
        from relay.brokers.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher("amqp://guest:guest@127.0.0.1:1/", connect_timeout=1)

    async def fetch(self, n: int) -> list[Any]:
        out: list[rabbitmq.RabbitMessage] = []
        end = time.monotonic() + DEADLINE
        while len(out) < n and time.monotonic() < end:
            msg = await self.queue.get(no_ack=True, fail=False)
            if msg is None:
                await asyncio.sleep(0.02)
                continue
            assert msg.delivery_mode == 2  # persistent
            out.append(rabbitmq.RabbitMessage(body=msg.body, message_id=msg.message_id,
                                              content_type=msg.content_type,
                                              headers=dict(msg.headers)))  # fmt: skip
        return out

    def encode(self, env: Envelope) -> Any:
        return rabbitmq.encode(env)

    def decode(self, raw: Any) -> Envelope:
        return rabbitmq.decode(raw.headers, raw.body)


class KafkaHarness(Harness):
    name = "kafka"
    bad_payload = 2 * 1024 * 1024  # > message.max.bytes (1,000,000)
    bootstrap = ""  # set by the mock-cluster fixture

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.kafka import KafkaPublisher

        return KafkaPublisher(self.bootstrap, destinations=self.destinations(), timeout=10,
                              **options)  # fmt: skip

    def unreachable(self) -> Publisher:
        from relay.brokers.kafka import KafkaPublisher

        return KafkaPublisher("127.0.0.1:1", connect_timeout=1, timeout=2)

    async def fetch(self, n: int) -> list[Any]:
        return await asyncio.to_thread(self._fetch, n)

    def encode(self, env: Envelope) -> Any:
        return kafka.encode(env)

    def decode(self, raw: Any) -> Envelope:
        return kafka.decode(raw.headers, raw.value)

    def _fetch(self, n: int) -> list[kafka.KafkaRecord]:
        import confluent_kafka

        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": self.ns,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
        })  # fmt: skip
        out: list[kafka.KafkaRecord] = []
        try:
            # a reader, not a group member: assign every partition from the start (no join)
            topic = consumer.list_topics(self.dest, timeout=DEADLINE).topics[self.dest]
            start = confluent_kafka.OFFSET_BEGINNING
            consumer.assign(
                [confluent_kafka.TopicPartition(self.dest, p, start) for p in topic.partitions]
            )
            end = time.monotonic() + DEADLINE
            while len(out) < n and time.monotonic() < end:
                for msg in consumer.consume(500, 0.5):
                    if msg.error():
                        continue
                    out.append(kafka.KafkaRecord(key=msg.key(), value=msg.value(),
                                                 headers=list(msg.headers() or [])))  # fmt: skip
        finally:
            consumer.close()
        return out


class RedisHarness(Harness):
    name = "redis"
    port = 6379

    def unavailable_destination(self) -> str:
        return f"{self.ns}-string"  # a string key: XADD fails with WRONGTYPE

    async def open(self) -> None:
        import redis.asyncio

        self.client = redis.asyncio.Redis(host="127.0.0.1", port=6379)
        await self.client.set(self.unavailable_destination(), "not a stream")

    async def cleanup(self) -> None:
        await self.client.delete(self.ns, self.unavailable_destination())
        await self.client.aclose()

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.redis import RedisPublisher

        return RedisPublisher("redis://127.0.0.1:6379/0", destinations=self.destinations(),
                              **options)  # fmt: skip

    def unreachable(self) -> Publisher:
        from relay.brokers.redis import RedisPublisher

        return RedisPublisher("redis://127.0.0.1:1/0", connect_timeout=1)

    async def fetch(self, n: int) -> list[Any]:
        await await_for(
            lambda: self._count_at_least(n), within=DEADLINE, what=f"{n} stream entries"
        )
        return [fields for _, fields in await self.client.xrange(self.ns)]

    def encode(self, env: Envelope) -> Any:
        # as Redis returns the fields: bytes, in the order they were added
        return {k.encode(): v if isinstance(v, bytes) else v.encode()
                for k, v in redis.encode(env).items()}  # fmt: skip

    def decode(self, raw: Any) -> Envelope:
        return redis.decode(raw)

    async def _count_at_least(self, n: int) -> bool:
        return int(await self.client.xlen(self.ns)) >= n

    async def stored(self) -> int:
        return int(await self.client.xlen(self.ns))


class MqttHarness(Harness):
    name = "mqtt"
    port = 1883
    batch_size = 600  # Mosquitto queues at most 1000 QoS 1 messages per slow subscriber

    @property
    def dest(self) -> str:
        return f"{self.ns}/t"

    def bad_destination(self) -> str:
        return f"{self.ns}/#"  # wildcards are not valid topic names for PUBLISH

    async def open(self) -> None:
        import paho.mqtt.client as mqtt

        self.received: list[Any] = []
        subscribed = threading.Event()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        client.on_message = lambda _c, _u, msg: self.received.append(msg)
        client.on_subscribe = lambda *_a: subscribed.set()
        client.connect("127.0.0.1", 1883)
        client.loop_start()
        client.subscribe(f"{self.ns}/#", qos=1)
        assert await asyncio.to_thread(subscribed.wait, DEADLINE), "no SUBACK"
        self.sub = client

    async def cleanup(self) -> None:
        self.sub.disconnect()
        await asyncio.to_thread(self.sub.loop_stop)

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.mqtt import MqttPublisher

        return MqttPublisher("127.0.0.1", 1883, destinations=self.destinations(), **options)

    def unreachable(self) -> Publisher:
        from relay.brokers.mqtt import MqttPublisher

        return MqttPublisher("127.0.0.1", 1, connect_timeout=1)

    async def fetch(self, n: int) -> list[Any]:
        await await_for(lambda: len(self.received) >= n, within=DEADLINE, what=f"{n} MQTT messages")
        out = []
        for msg in list(self.received):
            assert msg.qos == 1
            props = msg.properties
            out.append(mqtt.MqttMessage(payload=msg.payload, content_type=props.ContentType,
                                        user_properties=list(props.UserProperty)))  # fmt: skip
        return out

    def encode(self, env: Envelope) -> Any:
        return mqtt.encode(env)

    def decode(self, raw: Any) -> Envelope:
        return mqtt.decode(raw.user_properties, raw.payload)


class Amqp1Harness(Harness):
    """AMQP 1.0 on a private RabbitMQ node with its AMQP 1.0 plugin (tests/support/amqp1_broker.py).

    The plugin refuses no message for good that a test can send (an unroutable one is accepted
    and dropped), so the refusal tested is the adapter's configured ``max_payload_bytes``."""

    name = "amqp1"
    bad_payload = 100_001  # limit configured below: 100,000
    url = ""  # set by the node fixture

    @property
    def dest(self) -> str:
        return f"/queue/{self.ns}"

    def unavailable_destination(self) -> str:
        return f"/exchange/{self.ns}-none/rk"  # an exchange nobody declared: amqp:not-found

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.amqp1 import Amqp1Publisher

        return Amqp1Publisher(self.url, destinations=self.destinations(),
                              max_payload_bytes=100_000, **options)  # fmt: skip

    def unreachable(self) -> Publisher:
        from relay.brokers.amqp1 import Amqp1Publisher

        return Amqp1Publisher("amqp1://guest:guest@127.0.0.1:1", connect_timeout=1)

    async def fetch(self, n: int) -> list[Any]:
        return await asyncio.to_thread(self._fetch, n)

    def _fetch(self, n: int) -> list[amqp1.Amqp1Message]:
        from proton.utils import BlockingConnection

        conn = BlockingConnection(self.url.replace("amqp1://", "amqp://"), timeout=DEADLINE)
        out: list[amqp1.Amqp1Message] = []
        try:
            # /amq/queue/NAME: the queue the relay's link declared (durable), without declaring
            receiver = conn.create_receiver(f"/amq/queue/{self.ns}", credit=min(n, 1000))
            while len(out) < n:
                msg = receiver.receive(timeout=DEADLINE)
                assert msg.durable
                out.append(amqp1.Amqp1Message(
                    body=bytes(msg.body), message_id=msg.id, group_id=msg.group_id,
                    group_sequence=msg.group_sequence or None, subject=msg.subject,
                    content_type=msg.content_type, properties=dict(msg.properties),
                ))  # fmt: skip
                receiver.accept()
        finally:
            conn.close()
        return out

    def encode(self, env: Envelope) -> Any:
        return amqp1.encode(env)

    def decode(self, raw: Any) -> Envelope:
        return amqp1.decode(raw.properties, raw.body)


class SqsHarness(Harness):
    """Amazon SQS on moto's server: a FIFO queue (``fifo``) or a standard one."""

    name = "sqs"
    fifo = True
    bad_payload = 5000  # the queue's MaximumMessageSize is set to 4096 below
    # moto scans the whole queue (with date arithmetic per message) several times per message
    # sent: a deeper queue is quadratically slower, so the order test stays short
    batch_size = 300

    def __init__(self) -> None:
        super().__init__()
        self.suffix = ".fifo" if self.fifo else ""

    @property
    def dest(self) -> str:
        return f"{self.ns}{self.suffix}"

    def unavailable_destination(self) -> str:
        return f"{self.ns}-missing{self.suffix}"  # no such queue

    async def open(self) -> None:
        from tests.support import aws_server

        self.endpoint = aws_server.endpoint()
        self.sqs = aws_server.client("sqs")
        attributes = {"MaximumMessageSize": "4096"}
        if self.fifo:
            attributes["FifoQueue"] = "true"
        self.queue_url = self.sqs.create_queue(
            QueueName=f"{self.ns}{self.suffix}", Attributes=attributes
        )["QueueUrl"]

    async def cleanup(self) -> None:
        self.sqs.delete_queue(QueueUrl=self.queue_url)

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.sqs import SqsPublisher

        # moto answers slowly on a busy machine (it scans the whole queue per message sent):
        # generous call timeouts, so that order and dedup are what these tests measure
        options.setdefault("timeout", 60)
        return SqsPublisher(endpoint_url=self.endpoint, destinations=self.destinations(),
                            **options)  # fmt: skip

    def unreachable(self) -> Publisher:
        from relay.brokers.sqs import SqsPublisher

        return SqsPublisher(endpoint_url="http://127.0.0.1:1", connect_timeout=1)

    async def fetch(self, n: int) -> list[Any]:
        return await asyncio.to_thread(self._fetch, n)

    def _fetch(self, n: int) -> list[sqs.SqsMessage]:
        out: list[sqs.SqsMessage] = []
        end = time.monotonic() + DEADLINE
        while len(out) < n and time.monotonic() < end:
            got = self.sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"],
            ).get("Messages", [])  # fmt: skip
            for msg in got:
                system = msg.get("Attributes", {})
                out.append(sqs.SqsMessage(body=msg["Body"],
                                          attributes=msg.get("MessageAttributes", {}),
                                          group_id=system.get("MessageGroupId", ""),
                                          deduplication_id=system.get("MessageDeduplicationId",
                                                                      "")))  # fmt: skip
            if got:  # deleted, or a FIFO queue would hold the group back
                self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
                ])  # fmt: skip
        return out

    def encode(self, env: Envelope) -> Any:
        message = sqs.encode(env)
        if not self.fifo:  # a standard queue carries neither id
            message = dataclasses.replace(message, group_id="", deduplication_id="")
        return message

    def decode(self, raw: Any) -> Envelope:
        return sqs.decode(raw.body, raw.attributes)

    async def stored(self) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(v) for v in attributes.values())


class SqsStandardHarness(SqsHarness):
    fifo = False


class SnsHarness(SqsHarness):
    """Amazon SNS on moto's server: a FIFO topic (by name: its ARN is looked up) with a FIFO
    queue subscribed to it, raw message delivery."""

    name = "sns"
    bad_payload = 300 * 1024  # > SNS's 256 KiB

    @property
    def dest(self) -> str:
        return f"{self.ns}-topic.fifo"

    async def open(self) -> None:
        await super().open()
        self.sqs.set_queue_attributes(QueueUrl=self.queue_url,
                                      Attributes={"MaximumMessageSize": "1048576"})  # fmt: skip
        from tests.support import aws_server

        self.sns = aws_server.client("sns")
        self.topic_arn = self.sns.create_topic(Name=self.dest, Attributes={"FifoTopic": "true"})[
            "TopicArn"
        ]
        queue_arn = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["QueueArn"]
        )["Attributes"]["QueueArn"]
        self.sns.subscribe(TopicArn=self.topic_arn, Protocol="sqs", Endpoint=queue_arn,
                           Attributes={"RawMessageDelivery": "true"})  # fmt: skip

    async def cleanup(self) -> None:
        self.sns.delete_topic(TopicArn=self.topic_arn)
        await super().cleanup()

    def publisher(self, **options: Any) -> Publisher:
        from relay.brokers.sqs import SnsPublisher

        options.setdefault("timeout", 60)  # moto is slow on a busy machine (see SqsHarness)
        return SnsPublisher(endpoint_url=self.endpoint, destinations=self.destinations(),
                            **options)  # fmt: skip

    def unreachable(self) -> Publisher:
        from relay.brokers.sqs import SnsPublisher

        return SnsPublisher(endpoint_url="http://127.0.0.1:1", connect_timeout=1)
