"""Live-broker helpers for the relay tests: a TCP proxy to cut a broker off, and readers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from typing import Any

from tests.support.services import require_port


def need(port: int, name: str) -> None:
    """The test needs the broker on ``port`` (skipped locally, failed under CI, if missing)."""
    require_port(port, name)


class _Link:
    """One proxied connection; a frozen link swallows bytes both ways and stays open."""

    frozen = False


class Proxy:
    """Forwards a local port to a broker (or PostgreSQL); ``down()`` drops every connection and
    refuses new ones (the broker looks gone), ``up()`` listens again on the same port;
    ``freeze()`` makes the open connections half-open: bytes stop flowing both ways, nothing is
    closed, while new connections work. ``accepted`` counts connections made through it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._links: list[_Link] = []

    def freeze(self) -> None:
        for link in self._links:
            link.frozen = True

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        self.accepted += 1
        link = _Link()
        self._links.append(link)
        await asyncio.gather(_pipe(reader, up_writer, link), _pipe(up_reader, writer, link))


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link | None = None
) -> None:
    try:
        while data := await reader.read(65536):
            if link is not None and link.frozen:
                continue  # swallowed: the peer never hears of it
            writer.write(data)
            await writer.drain()
    except (OSError, RuntimeError):
        pass
    finally:
        writer.close()


class MqttSubscriber:
    """Subscribes (QoS 1) to ``topic`` on Mosquitto itself and records each message's
    ``outbox-seq`` user property, in arrival order."""

    def __init__(self, topic: str) -> None:
        import paho.mqtt.client as mqtt

        self.seqs: list[int] = []
        subscribed = threading.Event()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        client.on_message = lambda _c, _u, msg: self.seqs.append(
            int(dict(msg.properties.UserProperty)["outbox-seq"])
        )
        client.on_subscribe = lambda *_a: subscribed.set()
        client.connect("127.0.0.1", 1883)
        client.loop_start()
        client.subscribe(topic, qos=1)
        if not subscribed.wait(10):
            raise AssertionError("no SUBACK from Mosquitto")
        self.client = client

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@contextlib.asynccontextmanager
async def nats_stream(subject_prefix: str = "rt") -> Any:
    """A fresh JetStream stream; yields (jetstream context, stream name, subject)."""
    import nats

    name = f"RT_{uuid.uuid4().hex[:10]}"
    subject = f"{subject_prefix}.{name.lower()}"
    nc = await nats.connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[subject])
    try:
        yield js, name, subject
    finally:
        await js.delete_stream(name)
        await nc.close()


async def stream_seqs(js: Any, stream: str) -> list[int]:
    """The ``outbox-seq`` header of every message stored in ``stream``, in stream order."""
    info = await js.stream_info(stream)
    out = []
    for n in range(1, info.state.messages + 1):
        msg = await js.get_msg(stream, n)
        out.append(int(msg.headers["outbox-seq"]))
    return out


def kafka_records(bootstrap: str, topic: str, n: int, within: float = 30.0) -> list[Any]:
    """At least ``n`` records of ``topic`` from the start of every partition (a reader, not a
    group member), as confluent-kafka messages."""
    import time

    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
         "enable.auto.commit": False}
    )  # fmt: skip
    out: list[Any] = []
    try:
        partitions = consumer.list_topics(topic, timeout=within).topics[topic].partitions
        start = confluent_kafka.OFFSET_BEGINNING
        consumer.assign([confluent_kafka.TopicPartition(topic, p, start) for p in partitions])
        deadline = time.monotonic() + within
        while len(out) < n and time.monotonic() < deadline:
            out.extend(m for m in consumer.consume(500, 0.5) if not m.error())
    finally:
        consumer.close()
    return out
