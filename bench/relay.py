"""Relay benchmark. Part (a): each broker client's raw publish-with-ack rate (no database) beside
the adapter's ``publish_batch`` rate over the same messages, in one run; ratio adapter/raw.

    python bench/relay.py            # writes bench/results/relay_brokers.json

Sized for 2 cores. Brokers: NATS JetStream, RabbitMQ, Redis, Mosquitto on 127.0.0.1, Kafka via
librdkafka's mock cluster. An unreachable broker is reported as skipped.
(The end-to-end relay parts (b)-(e) are added with the relay core.)
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result
from outbox.envelope import Envelope
from relay.brokers import Publisher

BATCH = 1000
PAYLOAD = b'{"order": 123, "amount": "19.99", "note": "' + b"x" * 150 + b'"}'
SIZES = {"nats": 20_000, "kafka": 20_000, "redis": 20_000, "rabbitmq": 5_000, "mqtt": 5_000}


def envelopes(n: int, ns: str) -> list[Envelope]:
    return [
        Envelope(id=uuid.uuid4(), topic=ns, key=f"key-{i % 100}", seq=i // 100 + 1,
                 payload=PAYLOAD, headers={"tenant": "acme"})
        for i in range(n)
    ]  # fmt: skip


def chunks(items: list[Envelope]) -> list[list[Envelope]]:
    return [items[i : i + BATCH] for i in range(0, len(items), BATCH)]


async def adapter_rate(pub: Publisher, envs: list[Envelope]) -> float:
    await pub.start()
    try:
        began = time.perf_counter()
        for chunk in chunks(envs):
            results = await pub.publish_batch(chunk)
            failed = [r for r in results if r is not None]
            assert not failed, failed[:3]
        return len(envs) / (time.perf_counter() - began)
    finally:
        await pub.close()


# ---- raw clients: the same messages, the client's own fastest acked path ---------------------


async def raw_nats(envs: list[Envelope], ns: str) -> float:
    import nats

    nc = await nats.connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    try:
        began = time.perf_counter()
        for chunk in chunks(envs):
            futures = [
                await js.publish_async(e.topic, e.payload, headers={**e.to_headers(),
                                       "Nats-Msg-Id": str(e.id)})
                for e in chunk
            ]  # fmt: skip
            await asyncio.gather(*futures)
        return len(envs) / (time.perf_counter() - began)
    finally:
        await nc.close()


async def raw_rabbitmq(envs: list[Envelope], ns: str) -> float:
    import aio_pika

    conn = await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/")
    try:
        channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        began = time.perf_counter()
        for chunk in chunks(envs):
            await asyncio.gather(*[
                channel.default_exchange.publish(
                    aio_pika.Message(e.payload, message_id=str(e.id), headers=e.to_headers(),
                                     delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    ns, mandatory=True)
                for e in chunk
            ])  # fmt: skip
        return len(envs) / (time.perf_counter() - began)
    finally:
        await conn.close()


async def raw_redis(envs: list[Envelope], ns: str) -> float:
    import redis.asyncio

    client = redis.asyncio.Redis(host="127.0.0.1", port=6379)
    try:
        began = time.perf_counter()
        for chunk in chunks(envs):
            pipe = client.pipeline(transaction=False)
            for e in chunk:
                pipe.xadd(ns + "-raw", {**e.to_headers(), "payload": e.payload})
            await pipe.execute()
        return len(envs) / (time.perf_counter() - began)
    finally:
        await client.aclose()


def raw_kafka_sync(envs: list[Envelope], bootstrap: str, ns: str) -> float:
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                         "enable.idempotence": True, "acks": "all"})  # fmt: skip
    errors: list[Any] = []

    def done(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    producer.list_topics(timeout=5)
    began = time.perf_counter()
    for chunk in chunks(envs):
        for e in chunk:
            headers = [(k, v.encode()) for k, v in e.to_headers().items()]
            producer.produce(ns, e.payload, e.key.encode(), on_delivery=done, headers=headers)
        producer.flush(30)
    assert not errors, errors[:3]
    return len(envs) / (time.perf_counter() - began)


def raw_mqtt_sync(envs: list[Envelope], ns: str) -> float:
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    connected = threading.Event()
    client.on_connect = lambda *_a: connected.set()
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    connected.wait(5)
    try:
        began = time.perf_counter()
        for chunk in chunks(envs):
            infos = []
            for e in chunk:
                props = Properties(PacketTypes.PUBLISH)
                props.UserProperty = list(e.to_headers().items())
                props.ContentType = e.content_type
                infos.append(client.publish(f"{ns}/raw", e.payload, 1, properties=props))
            for info in infos:
                info.wait_for_publish(30)
        return len(envs) / (time.perf_counter() - began)
    finally:
        client.disconnect()
        client.loop_stop()


# ---- setup per broker ------------------------------------------------------------------------


def kafka_mock() -> tuple[Any, str]:
    import confluent_kafka

    found: dict[str, str] = {}

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            m = re.search(r"Mock cluster enabled.*?(127\.0\.0\.1:\d+)", record.getMessage())
            if m:
                found["addr"] = m.group(1)

    logger = logging.getLogger("bench.kafka_mock")
    logger.addHandler(Grab())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    holder = confluent_kafka.Producer(
        {"test.mock.num.brokers": 1, "bootstrap.servers": "mock:9092", "logger": logger}
    )
    while "addr" not in found:
        holder.poll(0.05)
    return holder, found["addr"]


def up(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def measure(name: str, raw: Callable[[], Awaitable[float]], pub: Publisher,
                  envs: list[Envelope]) -> dict[str, Any]:  # fmt: skip
    raw_rate = await raw()
    adapter = await adapter_rate(pub, envs)
    row = {"broker": name, "messages": len(envs), "batch": BATCH,
           "raw_msg_per_s": round(raw_rate), "adapter_msg_per_s": round(adapter),
           "ratio_adapter_to_raw": round(adapter / raw_rate, 3)}  # fmt: skip
    print(row, flush=True)
    return row


async def bench_brokers() -> list[dict[str, Any]]:
    from relay.brokers.kafka import KafkaPublisher
    from relay.brokers.mqtt import MqttPublisher
    from relay.brokers.nats import NatsPublisher
    from relay.brokers.rabbitmq import RabbitMQPublisher
    from relay.brokers.redis import RedisPublisher

    rows: list[dict[str, Any]] = []
    ns = f"bench{uuid.uuid4().hex[:8]}"
    if up(4222):
        import nats

        nc = await nats.connect("nats://127.0.0.1:4222")
        js = nc.jetstream()
        await js.add_stream(name=ns, subjects=[f"{ns}.>"])
        envs = envelopes(SIZES["nats"], f"{ns}.a")
        envs2 = envelopes(SIZES["nats"], f"{ns}.b")
        try:
            rows.append(await measure("nats", lambda: raw_nats(envs, ns), NatsPublisher(), envs2))
        finally:
            await js.delete_stream(ns)
            await nc.close()
    if up(5672):
        import aio_pika

        conn = await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/")
        channel = await conn.channel()
        queue = await channel.declare_queue(ns)
        envs = envelopes(SIZES["rabbitmq"], ns)
        try:
            rows.append(await measure("rabbitmq", lambda: raw_rabbitmq(envs, ns),
                                      RabbitMQPublisher(), envs))  # fmt: skip
        finally:
            await queue.delete(if_unused=False, if_empty=False)
            await conn.close()
    if up(6379):
        import redis.asyncio

        envs = envelopes(SIZES["redis"], ns)
        try:
            rows.append(await measure("redis", lambda: raw_redis(envs, ns), RedisPublisher(),
                                      envs))  # fmt: skip
        finally:
            client = redis.asyncio.Redis(host="127.0.0.1", port=6379)
            await client.delete(ns, ns + "-raw")
            await client.aclose()
    holder, bootstrap = kafka_mock()
    envs = envelopes(SIZES["kafka"], ns)
    rows.append(await measure("kafka (librdkafka mock cluster)",
                              lambda: asyncio.to_thread(raw_kafka_sync, envs, bootstrap, ns),
                              KafkaPublisher(bootstrap), envs))  # fmt: skip
    holder.flush(1)
    if up(1883):
        envs = envelopes(SIZES["mqtt"], f"{ns}/a")
        rows.append(await measure("mqtt", lambda: asyncio.to_thread(raw_mqtt_sync, envs, ns),
                                  MqttPublisher(), envs))  # fmt: skip
    return rows


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    rows = asyncio.run(bench_brokers())
    path = write_result(
        "relay_brokers",
        {
            "description": "(a) raw broker client publish-with-ack vs the adapter's "
            f"publish_batch over the same messages, {BATCH} per batch, {len(PAYLOAD)} B bodies "
            "with envelope headers, no database",
            "brokers": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
