"""Relay benchmark, issue 3, in one run, side by side. Writes bench/results/relay.json.

    python bench/relay.py

Per broker: (a) the raw client's publish-with-ack rate (no database) and the adapter's
``publish_batch`` rate over the same messages; (c) the relay end to end: rows committed to the
outbox first, then one relay process publishes them all through the adapter, and the ratio
(c)/(a raw); for NATS also (c') the same backlog through a naive relay, for reference. Then, on
NATS JetStream: (d) commit -> broker latency at a steady 1,000 msg/s and
(e) 1 vs 2 relay processes on one backlog, with a read-back of the stream (once, in key order).
(b), the database side alone, is ``bench/relay_db.py``.

Sized for 2 cores. Brokers: NATS JetStream, RabbitMQ, Redis, Mosquitto on 127.0.0.1, Kafka via
librdkafka's mock cluster. An unreachable broker is reported as skipped.
"""

from __future__ import annotations

import argparse
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

from bench import relay_e2e
from bench.common import write_result
from outbox.envelope import Envelope
from relay.brokers import Publisher

BATCH = 1000
PAYLOAD = b'{"order": 123, "amount": "19.99", "note": "' + b"x" * 150 + b'"}'
SIZES = {"nats": 20_000, "kafka": 20_000, "redis": 20_000, "rabbitmq": 5_000, "mqtt": 5_000}
#: rows drained end to end (c), per broker
E2E = {"nats": 50_000, "kafka": 50_000, "redis": 50_000, "rabbitmq": 10_000, "mqtt": 10_000}
E2E_KEYS = 1000


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


def raw_kafka_sync(
    envs: list[Envelope], bootstrap: str, ns: str, flush: Callable[[Any], object] | None = None
) -> float:
    """Produce each batch, then ``flush(producer)`` (default: ``producer.flush(30)`` here)."""
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
        if flush is None:
            producer.flush(30)
        else:
            flush(producer)
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


async def measure(
    name: str,
    raw: Callable[[], Awaitable[float]],
    pub: Publisher,
    envs: list[Envelope],
    broker_url: str,
    topic: str,
) -> dict[str, Any]:
    """(a) raw and adapter rates, then (c) the relay end to end, for one broker."""
    raw_rate = await raw()
    adapter = await adapter_rate(pub, envs)
    n = E2E[name.split()[0]]
    e2e = await asyncio.to_thread(relay_e2e.drain, broker_url, topic, n, keys=E2E_KEYS)
    row = {
        "broker": name,
        "messages": len(envs),
        "batch": BATCH,
        "raw_msg_per_s": round(raw_rate),
        "adapter_msg_per_s": round(adapter),
        "ratio_adapter_to_raw": round(adapter / raw_rate, 3),
        "relay_e2e": e2e,
        "ratio_relay_e2e_to_raw": round(e2e["msg_per_s"] / raw_rate, 3),
    }
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
            row = await measure("nats", lambda: raw_nats(envs, ns), NatsPublisher(), envs2,
                                "nats://127.0.0.1:4222", f"{ns}.e2e")  # fmt: skip
            # (c') the same backlog through a naive relay, for reference
            naive = await asyncio.to_thread(relay_e2e.naive_drain, "nats://127.0.0.1:4222",
                                            f"{ns}.naive", E2E["nats"], keys=E2E_KEYS)  # fmt: skip
            row["naive_relay_e2e"] = naive
            row["ratio_naive_relay_e2e_to_raw"] = round(
                naive["msg_per_s"] / row["raw_msg_per_s"], 3
            )
            row["ratio_relay_e2e_to_naive_relay"] = round(
                row["relay_e2e"]["msg_per_s"] / naive["msg_per_s"], 3
            )
            print({"naive_relay_e2e": naive}, flush=True)
            rows.append(row)
        finally:
            await js.delete_stream(ns)
            await nc.close()
    if up(5672):
        import aio_pika

        conn = await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/")
        channel = await conn.channel()
        queue = await channel.declare_queue(ns)
        e2e_queue = await channel.declare_queue(f"{ns}-e2e")
        envs = envelopes(SIZES["rabbitmq"], ns)
        try:
            amqp = "amqp://guest:guest@127.0.0.1:5672/"
            rows.append(await measure("rabbitmq", lambda: raw_rabbitmq(envs, ns),
                                      RabbitMQPublisher(), envs, amqp, f"{ns}-e2e"))  # fmt: skip
        finally:
            await queue.delete(if_unused=False, if_empty=False)
            await e2e_queue.delete(if_unused=False, if_empty=False)
            await conn.close()
    if up(6379):
        import redis.asyncio

        envs = envelopes(SIZES["redis"], ns)
        try:
            rows.append(await measure("redis", lambda: raw_redis(envs, ns), RedisPublisher(),
                                      envs, "redis://127.0.0.1:6379", f"{ns}-e2e"))  # fmt: skip
        finally:
            client = redis.asyncio.Redis(host="127.0.0.1", port=6379)
            await client.delete(ns, ns + "-raw", f"{ns}-e2e")
            await client.aclose()
    holder, bootstrap = kafka_mock()
    envs = envelopes(SIZES["kafka"], ns)
    rows.append(await measure("kafka (librdkafka mock cluster)",
                              lambda: asyncio.to_thread(raw_kafka_sync, envs, bootstrap, ns),
                              KafkaPublisher(bootstrap), envs, f"kafka://{bootstrap}",
                              f"{ns}-e2e"))  # fmt: skip
    holder.flush(1)
    if up(1883):
        envs = envelopes(SIZES["mqtt"], f"{ns}/a")
        rows.append(await measure("mqtt", lambda: asyncio.to_thread(raw_mqtt_sync, envs, ns),
                                  MqttPublisher(), envs, "mqtt://127.0.0.1:1883",
                                  f"{ns}/e2e"))  # fmt: skip
    return rows


async def bench_nats_relays() -> dict[str, Any]:
    """(d) latency at a steady 1,000 msg/s and (e) 1 vs 2 relays, on NATS JetStream."""
    import nats

    if not up(4222):
        return {"skipped": "NATS is not running on 127.0.0.1:4222"}
    nc = await nats.connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    out: dict[str, Any] = {}
    try:
        ns = f"bench{uuid.uuid4().hex[:8]}"
        await js.add_stream(name=ns, subjects=[f"{ns}.>"])
        out["latency_at_1000_msg_per_s"] = await relay_e2e.latency(
            "nats://127.0.0.1:4222", f"{ns}.latency"
        )
        print(out["latency_at_1000_msg_per_s"], flush=True)
        await js.delete_stream(ns)
        runs = []
        for relays in (1, 2):
            stream = f"bench{uuid.uuid4().hex[:8]}"
            # A 100 ms dedup window (the server's minimum): a second publish of a message later
            # than that is stored again and shows up in the read-back.
            await js.add_stream(name=stream, subjects=[f"{stream}.>"], duplicate_window=0.1)
            run = await asyncio.to_thread(
                relay_e2e.drain, "nats://127.0.0.1:4222", f"{stream}.e2e", E2E["nats"],
                keys=E2E_KEYS, relays=relays,
            )  # fmt: skip
            run["stream"] = await relay_e2e.stream_check(js, stream, f"{stream}.>")
            await js.delete_stream(stream)
            print(run, flush=True)
            runs.append(run)
        out["relays_1_vs_2"] = {
            "runs": runs,
            "ratio_2_to_1": round(runs[1]["msg_per_s"] / runs[0]["msg_per_s"], 3),
        }
    finally:
        await nc.close()
    return out


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help only
    logging.basicConfig(level=logging.ERROR)
    rows = asyncio.run(bench_brokers())
    nats_parts = asyncio.run(bench_nats_relays())
    path = write_result(
        "relay",
        {
            "description": {
                "a": f"raw broker client publish-with-ack vs the adapter's publish_batch over the "
                f"same messages, {BATCH} per batch, {len(PAYLOAD)} B bodies with envelope "
                "headers, no database",
                "c": f"relay end to end: rows committed first ({E2E_KEYS} keys), then one relay "
                "process (default settings, poll_interval 0.5) publishes them all; rate = "
                "messages / (last published_at - start); ratio to (a) raw",
                "c_naive": "NATS only: the same backlog through a naive relay process (oldest "
                "pending rows by id, FOR UPDATE SKIP LOCKED in a transaction held open while "
                "1,000 are published and acked, then marked published; no per-key claim, "
                "leases, retries or dead letters), for reference",
                "d": "commit -> broker arrival, one message per transaction with outbox.publish, "
                "4 producer threads at a steady total rate, a core NATS subscriber records "
                "arrival; first seconds excluded",
                "e": "1 vs 2 relay processes on one backlog; acked_by_broker counts every "
                "acknowledged publish on the relays' side; the stream (100 ms dedup window) is "
                "read back for duplicates and per-key order",
            },
            "brokers": rows,
            "nats": nats_parts,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
