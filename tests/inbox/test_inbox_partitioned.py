"""Partitioned consumers: several OS processes under one consumer name, each key applied by one
process at a time, in order, with no out-of-order churn.

The messages go through the relay's own adapter (``publisher_for_url`` with
``partitions``), so the relay's ``{partition}`` and the consumers' partitions meet through
``outbox.partition_for``. Each consumer process is ``tests/inbox/partition_worker.py``; its
handler records, in the message's own transaction, the database clock when it started and
ended and which process applied it. Checked: every message applied once, each key's messages in
seq order, and no two processes applying one key at overlapping times.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from inbox import Lease, NatsConsumer, PartitionedConsumer, per_partition
from inbox._partitioned import balanced_share
from inbox.cli import commands
from outbox import partition_for
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from relay.brokers import publisher_for_url
from tests.inbox.partition_worker import APPLIED_DDL
from tests.support.services import missing, reachable

ROOT = Path(__file__).resolve().parents[2]
WORKER = "tests.inbox.partition_worker"
PARTITIONS = 6
#: a short lease, so that the tests' rebalances take seconds
LEASE = {"duration": 5.0, "heartbeat": 0.5, "stop_timeout": 1.5, "stall": 3.0}


# ---- the assignment arithmetic and the API's checks (no services) ---------------------------


def test_balanced_share_gives_each_member_floor_or_ceil_and_covers_every_partition() -> None:
    for partitions in (1, 2, 5, 6, 7, 64):
        for count in range(1, 10):
            members = [f"m{i}" for i in range(count)]
            shares = [balanced_share(partitions, members, m) for m in members]
            assert sum(shares) == partitions
            assert max(shares) - min(shares) <= 1
            assert shares == sorted(shares, reverse=True)  # the first joined take the extra


def test_balanced_share_of_a_member_not_in_the_list_is_none() -> None:
    assert balanced_share(4, ["a", "b"], "c") == 0


def test_partition_for_is_crc32_of_the_utf8_key_modulo_the_count() -> None:
    import zlib

    for key in ("k1", "customer-42", "Ærøskøbing", "🙂", ""):
        assert partition_for(key, 7) == zlib.crc32(key.encode("utf-8")) % 7
    assert {partition_for(f"k{i}", 4) for i in range(100)} == {0, 1, 2, 3}
    with pytest.raises(ConfigurationError):
        partition_for("k", 0)


def test_per_partition_fills_every_setting_and_needs_one() -> None:
    factory = per_partition(
        NatsConsumer, stream="S", subject="ev.orders.p{partition}", durable="svc-p{partition}"
    )
    runner = _runner()
    consumer = factory(3, runner)
    assert isinstance(consumer, NatsConsumer)
    assert (consumer.subject, consumer.durable, consumer.stream) == ("ev.orders.p3", "svc-p3", "S")
    with pytest.raises(ConfigurationError, match="partition"):
        per_partition(NatsConsumer, stream="S", subject="ev.orders", durable="svc")


def test_per_partition_puts_the_number_itself_where_partition_stands() -> None:
    from inbox import PARTITION, KafkaConsumer

    config = {"bootstrap.servers": "127.0.0.1:9", "group.id": "svc"}
    factory = per_partition(
        KafkaConsumer, config=config, topics=["orders"], partitions=[PARTITION],
        offsets_in_db=True,
    )  # fmt: skip
    consumer = factory(4, _runner())
    assert isinstance(consumer, KafkaConsumer)
    assert consumer.partitions == [4]
    assert consumer.config["group.id"] == "svc"


def test_an_assigned_kafka_consumer_needs_offsets_in_the_database_and_real_partitions() -> None:
    from inbox import KafkaConsumer

    config = {"bootstrap.servers": "127.0.0.1:9", "group.id": "svc"}
    with pytest.raises(ConfigurationError, match="offsets_in_db"):
        KafkaConsumer(_runner(), config=config, topics=["t"], partitions=[0])
    for bad in ([], [-1], [True], ["0"], "0", 3):
        with pytest.raises(ConfigurationError, match="partition numbers"):
            KafkaConsumer(
                _runner(), config=config, topics=["t"], partitions=bad, offsets_in_db=True
            )
    consumer = KafkaConsumer(
        _runner(), config=config, topics=["t"], partitions=(2, 0, 2), offsets_in_db=True
    )
    assert consumer.partitions == [0, 2]


def test_lease_timing_is_checked() -> None:
    Lease()
    with pytest.raises(ConfigurationError, match="third"):
        Lease(duration=2.0, heartbeat=1.0)
    with pytest.raises(ConfigurationError, match="stop_timeout"):
        Lease(duration=3.0, heartbeat=1.0, stop_timeout=2.0)
    with pytest.raises(ConfigurationError):
        PartitionedConsumer(_runner(), partitions=0, factory=lambda p, r: None)  # type: ignore


def _runner() -> Any:
    from inbox import AsyncHandlerRunner

    async def handler(_target: Any, _message: Any) -> None:
        return None

    @contextlib.asynccontextmanager
    async def transactions() -> Any:
        yield None

    return AsyncHandlerRunner(transactions, handler, consumer="svc", ordered=True)


# ---- brokers ----------------------------------------------------------------------------------


class Place:
    """One broker's partitioned destinations for a test: how the relay publishes to them and
    how a partition's consumer reads them."""

    port = 0
    name = ""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:8]

    async def setup(self) -> None: ...

    async def teardown(self) -> None: ...

    def relay(self) -> tuple[str, dict[str, str]]:  # broker URL, destinations
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:  # the worker's consumer class and options
        raise NotImplementedError

    def partitions(self) -> dict[str, int] | None:  # the relay's [broker.partitions]
        return {"*": PARTITIONS}


class NatsPlace(Place):
    port, name = 4222, "nats"

    def names(self) -> tuple[str, str]:
        return f"PTEST_{self.tag}", f"ptest.{self.tag}"

    async def setup(self) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

        stream, prefix = self.names()
        nc = await nats.connect("nats://127.0.0.1:4222")
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name=stream, subjects=[f"{prefix}.>"]))
            for p in range(PARTITIONS):  # a short ack_wait: a rebalance's leftovers come back
                await js.add_consumer(stream, ConsumerConfig(
                    durable_name=f"svc-p{p}", filter_subject=f"{prefix}.orders.p{p}",
                    ack_wait=2.0, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1000,
                ))  # fmt: skip
        finally:
            await nc.close()

    async def teardown(self) -> None:
        import nats

        nc = await nats.connect("nats://127.0.0.1:4222")
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream(self.names()[0])
        await nc.close()

    def relay(self) -> tuple[str, dict[str, str]]:
        prefix = self.names()[1]
        return "nats://127.0.0.1:4222", {"*": prefix + ".{topic}.p{partition}"}

    def settings(self) -> dict[str, Any]:
        stream, prefix = self.names()
        return {"class": "NatsConsumer", "options": {
            "stream": stream, "durable": "svc-p{partition}",
            "subject": prefix + ".orders.p{partition}", "fetch_timeout": 0.3,
            "redeliver_delay": 0.2,
        }}  # fmt: skip


class RabbitPlace(Place):
    port, name = 5672, "rabbitmq"
    url = "amqp://guest:guest@127.0.0.1:5672/"

    async def setup(self) -> None:
        import aio_pika

        conn = await aio_pika.connect(self.url)
        try:
            channel = await conn.channel()
            exchange = await channel.declare_exchange(f"ptest.{self.tag}", "direct")
            for p in range(PARTITIONS):  # single active consumer: a second safety
                queue = await channel.declare_queue(
                    f"ptest.{self.tag}.p{p}", arguments={"x-single-active-consumer": True}
                )
                await queue.bind(exchange, routing_key=f"orders.p{p}")
        finally:
            await conn.close()

    async def teardown(self) -> None:
        import aio_pika

        conn = await aio_pika.connect(self.url)
        try:
            channel = await conn.channel()
            for p in range(PARTITIONS):
                await channel.queue_delete(f"ptest.{self.tag}.p{p}")
            await channel.exchange_delete(f"ptest.{self.tag}")
        finally:
            await conn.close()

    def relay(self) -> tuple[str, dict[str, str]]:
        return self.url, {"*": f"ptest.{self.tag}/" + "{topic}.p{partition}"}

    def settings(self) -> dict[str, Any]:
        return {"class": "RabbitMQConsumer", "options": {
            "queue": f"ptest.{self.tag}.p" + "{partition}", "url": self.url,
            "redeliver_delay": 0.2,
        }}  # fmt: skip


class RedisPlace(Place):
    port, name = 6379, "redis"

    async def teardown(self) -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
        await client.delete(*(f"ptest.{self.tag}.orders.p{p}" for p in range(PARTITIONS)))
        await client.aclose()

    def relay(self) -> tuple[str, dict[str, str]]:
        return "redis://127.0.0.1:6379/0", {"*": f"ptest.{self.tag}." + "{topic}.p{partition}"}

    def settings(self) -> dict[str, Any]:
        return {"class": "RedisStreamConsumer", "options": {
            "stream": f"ptest.{self.tag}.orders.p" + "{partition}", "group": "svc",
            "name": "p{partition}", "block_ms": 200, "claim_idle_ms": 1000,
        }}  # fmt: skip


class MqttPlace(Place):
    """A topic per partition, read in the persistent session of the partition (one client id
    per partition: whoever holds the partition resumes its session, and the broker takes the
    session away from a frozen holder when the new one connects)."""

    port, name = 1883, "mqtt"

    def client_id(self, partition: int) -> str:
        return f"ptest-{self.tag}-p{partition}"

    async def setup(self) -> None:  # the sessions must exist before the messages are sent
        await asyncio.to_thread(self._sessions, clean=False)

    async def teardown(self) -> None:
        await asyncio.to_thread(self._sessions, clean=True)

    def _sessions(self, clean: bool) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        for p in range(PARTITIONS):
            client = mqtt.Client(
                CallbackAPIVersion.VERSION2, client_id=self.client_id(p), protocol=mqtt.MQTTv5
            )
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 0 if clean else 3600
            client.connect("127.0.0.1", 1883, clean_start=clean, properties=props)
            client.loop_start()
            try:
                if not clean:
                    topic = f"ptest/{self.tag}/orders/p{p}"
                    client.subscribe(topic, qos=1)[1]
                    info = client.publish(f"ptest/{self.tag}/probe", b"", qos=1)
                    info.wait_for_publish(5)  # after the SUBACK: one connection, in order
            finally:
                client.disconnect()
                client.loop_stop()

    def relay(self) -> tuple[str, dict[str, str]]:
        return "mqtt://127.0.0.1:1883", {"*": f"ptest/{self.tag}/" + "{topic}/p{partition}"}

    def settings(self) -> dict[str, Any]:
        return {"class": "MqttConsumer", "options": {
            "topic": f"ptest/{self.tag}/orders/p" + "{partition}",
            "client_id": f"ptest-{self.tag}-p" + "{partition}", "redeliver_delay": 0.2,
        }}  # fmt: skip


class Amqp1Place(Place):
    """A queue per partition on the private AMQP 1.0 node (tests/support/amqp1_broker.py)."""

    name = "amqp1"
    url = ""

    async def setup(self) -> None:
        from tests.support.amqp1_broker import node

        self.url = (await asyncio.to_thread(node)).url

    def relay(self) -> tuple[str, dict[str, str]]:
        return self.url, {"*": f"/queue/ptest-{self.tag}-" + "{topic}-p{partition}"}

    def settings(self) -> dict[str, Any]:
        return {"class": "Amqp1Consumer", "options": {
            "address": f"/queue/ptest-{self.tag}-orders-p" + "{partition}", "url": self.url,
            "redeliver_delay": 0.2,
        }}  # fmt: skip


class KafkaPlace(Place):
    """One topic of PARTITIONS Kafka partitions on tansu (tests/support/kafka_broker.py): the
    relay keys each message by its key, so a key stays in one Kafka partition; a partition's
    consumer is assigned that partition (no group join) and keeps its offsets in the
    database, written with each effect."""

    name = "kafka"
    server = ""

    def topic(self) -> str:
        return f"ptest-{self.tag}-orders"

    async def setup(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        from tests.support.kafka_broker import bootstrap

        self.server = await asyncio.to_thread(bootstrap)
        admin = AdminClient({"bootstrap.servers": self.server})
        created = admin.create_topics([NewTopic(self.topic(), PARTITIONS, 1)])
        await asyncio.to_thread(created[self.topic()].result, 20)

    def relay(self) -> tuple[str, dict[str, str]]:
        return f"kafka://{self.server}", {"*": f"ptest-{self.tag}-" + "{topic}"}

    def partitions(self) -> dict[str, int] | None:
        return None  # Kafka partitions by key by itself

    def settings(self) -> dict[str, Any]:
        return {"class": "KafkaConsumer", "batching": {"size": 20, "workers": 1}, "options": {
            "config": {"bootstrap.servers": self.server, "group.id": f"svc-{self.tag}"},
            "topics": [self.topic()], "partitions": ["PARTITION"], "offsets_in_db": True,
            "poll_timeout": 0.2, "redeliver_delay": 0.2,
        }}  # fmt: skip


PLACES: dict[str, Callable[[], Place]] = {
    "nats": NatsPlace, "rabbitmq": RabbitPlace, "redis": RedisPlace, "mqtt": MqttPlace,
    "amqp1": Amqp1Place, "kafka": KafkaPlace,
}  # fmt: skip


# ---- processes --------------------------------------------------------------------------------


class Worker:
    """One consumer process and what it printed."""

    def __init__(self, proc: Any, member: str) -> None:
        self.proc, self.member = proc, member
        self.owned: list[int] = []
        self.lines: list[bytes] = []
        self.pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while line := await self.proc.stdout.readline():
            self.lines.append(line)
            if line.startswith(b"owned "):
                self.owned = json.loads(line[6:])

    async def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await self.pump
            code = await self.proc.wait()
        assert code == 0, b"".join(self.lines[-40:]).decode(errors="replace")
        return dict(json.loads([ln for ln in self.lines if ln.startswith(b"{")][-1]))


async def _start(url: str, place: Place, member: str, delay: float = 0.0) -> Worker:
    args = {
        "url": url, "member": member, "partitions": PARTITIONS, "consumer": "svc",
        "settings": place.settings(), "lease": LEASE, "delay": delay,
    }  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", WORKER, json.dumps(args),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
    return Worker(proc, member)


async def _until(
    check: Callable[[], bool], within: float, what: str, workers: list[Worker]
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        if loop.time() > deadline:
            tail = b"".join(ln for w in workers for ln in w.lines[-15:]).decode(errors="replace")
            raise AssertionError(f"timed out waiting for {what}:\n{tail}")
        await asyncio.sleep(0.05)


def _balanced(workers: list[Worker]) -> bool:
    owned = [p for w in workers for p in w.owned]
    shares = sorted(len(w.owned) for w in workers)
    return sorted(owned) == list(range(PARTITIONS)) and shares[-1] - shares[0] <= 1


def _backlog(keys: int, per_key: int) -> list[Envelope]:
    """``per_key`` messages of each of ``keys`` keys, interleaved (k0 1, k1 1, ..., k0 2, ...)."""
    return [
        Envelope(id=uuid.uuid4(), topic="orders", key=f"k{k}", seq=seq, payload=b"{}")
        for seq in range(1, per_key + 1)
        for k in range(keys)
    ]


async def _publish(place: Place, envelopes: list[Envelope]) -> None:
    url, destinations = place.relay()
    publisher = publisher_for_url(url, destinations=destinations, partitions=place.partitions())
    await publisher.start()
    try:
        for i in range(0, len(envelopes), 200):
            results = await publisher.publish_batch(envelopes[i : i + 200])
            assert all(r is None for r in results), [r for r in results if r is not None][:3]
    finally:
        await publisher.close()


def _applied(url: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT * FROM applied ORDER BY key, started").fetchall()


def _count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM applied").fetchone()
        return int(row[0]) if row else 0


def _check_applied(url: str, envelopes: list[Envelope]) -> dict[str, set[str]]:
    """Every message applied once, each key in seq order, no two members applying one key at
    overlapping times. Returns the members that applied each key."""
    rows = _applied(url)
    expected = {(e.key, e.seq) for e in envelopes}
    got = [(r["key"], r["seq"]) for r in rows]
    assert len(got) == len(set(got)) == len(expected)
    assert set(got) == expected
    by_key: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault(row["key"], []).append(row)
    members: dict[str, set[str]] = {}
    for key, applied in by_key.items():  # ordered by start time
        assert [r["seq"] for r in applied] == sorted(r["seq"] for r in applied), key
        for before, after in itertools.pairwise(applied):
            assert before["ended"] <= after["started"], (key, before, after)
        members[key] = {r["member"] for r in applied}
    return members


def _check_cli(url: str, workers: list[Worker]) -> None:
    """``outbox inbox partitions`` shows who holds each partition; exit 0: all held."""
    cli = CliRunner()
    shown = cli.invoke(commands[0], ["partitions", "--url", url, "--consumer", "svc", "--json"])
    assert shown.exit_code == 0, shown.output
    owners = {row["partition"]: row["owner"] for row in json.loads(shown.stdout)}
    assert owners == {p: w.member for w in workers for p in w.owned}
    text = cli.invoke(commands[0], ["partitions", "--url", url])
    assert text.exit_code == 0, text.output
    assert len(text.stdout.splitlines()) == PARTITIONS


def _place(name: str) -> Place:
    place = PLACES[name]()
    if place.port and not reachable(place.port):
        missing(name, f"start it on 127.0.0.1:{place.port} (bash .ci/run starts it)")
    return place


@pytest.fixture
def applied_url(database_url: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(APPLIED_DDL)
    return database_url


# ---- the scenarios ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PLACES))
def test_two_processes_share_the_partitions_without_out_of_order_refusals(
    applied_url: str, name: str
) -> None:
    """Steady state: two processes, balanced 3 + 3, drain an interleaved backlog: every message
    once, in order, each key by one process only, and not one out-of-order refusal."""
    place = _place(name)

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, set[str]]]:
        await place.setup()
        workers: list[Worker] = []
        try:
            workers = [await _start(applied_url, place, f"w{i}") for i in range(2)]
            await _until(lambda: _balanced(workers), 40, "a balanced assignment", workers)
            backlog = _backlog(keys=60, per_key=20)
            await _publish(place, backlog)
            await _until(lambda: _count(applied_url) >= len(backlog), 90, "the backlog", workers)
            _check_cli(applied_url, workers)
            reports = [await w.stop() for w in workers]
            return reports, _check_applied(applied_url, backlog)
        finally:
            await _kill(workers)
            await place.teardown()

    reports, members = asyncio.run(scenario())
    assert all(len(m) == 1 for m in members.values())  # nobody else touched a key
    assert {next(iter(m)) for m in members.values()} == {"w0", "w1"}
    for report in reports:
        assert report["outcomes"].get("out_of_order", 0) == 0, report
        assert report["outcomes"].get("failed", 0) == 0, report


@pytest.mark.parametrize("name", list(PLACES))
def test_a_process_joining_and_one_leaving_rebalance_and_lose_nothing(
    applied_url: str, name: str
) -> None:
    """Two processes drain a backlog; a third joins (each then holds 2 of 6), then the first
    leaves gracefully (its partitions go to the other two at once): every message once, each
    key in order, never two processes on one key at overlapping times."""
    place = _place(name)

    async def scenario() -> None:
        await place.setup()
        workers: list[Worker] = []
        try:
            workers = [await _start(applied_url, place, f"w{i}", delay=0.03) for i in range(2)]
            await _until(lambda: _balanced(workers), 40, "a balanced assignment", workers)
            backlog = _backlog(keys=60, per_key=50)
            await _publish(place, backlog)
            await _until(lambda: _count(applied_url) >= 200, 60, "a first part", workers)
            workers.append(await _start(applied_url, place, "w2", delay=0.03))
            await _until(
                lambda: _balanced(workers) and all(len(w.owned) == 2 for w in workers),
                40, "the joiner's share", workers,
            )  # fmt: skip
            first = workers.pop(0)
            before = _count(applied_url)
            await first.stop()
            assert before < len(backlog), "the backlog was drained before the leave"
            await _until(lambda: _balanced(workers), 20, "the leaver's partitions", workers)
            await _until(lambda: _count(applied_url) >= len(backlog), 120, "the backlog", workers)
            for worker in workers:
                await worker.stop()
            _check_applied(applied_url, backlog)
        finally:
            await _kill(workers)
            await place.teardown()

    asyncio.run(scenario())


def test_a_kafka_consumer_assigned_a_partition_the_topic_lacks_stops_saying_so(
    database_url: str,
) -> None:
    """A partitioned consumer's count above the topic's: the partition's consumer stops at
    start with the topic's real count, instead of waiting on a partition that never comes."""
    from psycopg_pool import AsyncConnectionPool

    from inbox import AsyncHandlerRunner, KafkaConsumer

    place = _place("kafka")

    async def handler(_conn: Any, _env: Envelope) -> None:
        return None

    async def scenario() -> None:
        await place.setup()
        async with AsyncConnectionPool(database_url, min_size=1, max_size=2) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer="svc", ordered=True)
            options = place.settings()["options"]
            consumer = KafkaConsumer(
                runner, config=options["config"], topics=options["topics"],
                partitions=[1, PARTITIONS], offsets_in_db=True,
            )  # fmt: skip
            async with asyncio.timeout(30):
                with pytest.raises(ConfigurationError, match=f"has {PARTITIONS} partitions"):
                    await consumer.run()

    asyncio.run(scenario())


def test_an_assigned_kafka_consumer_waits_out_a_broker_that_is_down(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No broker at start: the assigned consumer says so and keeps trying (it does not end
    ``run()`` with the outage), is not ready, and stops cleanly when asked."""
    from psycopg_pool import AsyncConnectionPool

    from inbox import AsyncHandlerRunner, KafkaConsumer
    from tests.support.kafka_broker import free_port

    async def handler(_conn: Any, _env: Envelope) -> None:
        return None

    caplog.set_level(logging.WARNING, logger="inbox.consumer")

    async def scenario() -> None:
        async with AsyncConnectionPool(database_url, min_size=1, max_size=2) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer="svc", ordered=True)
            config = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "group.id": "svc"}
            consumer = KafkaConsumer(runner, config=config, topics=["orders"], partitions=[0],
                                     offsets_in_db=True)  # fmt: skip
            task = asyncio.create_task(consumer.run())
            async with asyncio.timeout(20):  # two failed attempts, and it is still running
                while sum("no metadata yet" in r.getMessage() for r in caplog.records) < 2:
                    assert not task.done(), task.exception()
                    await asyncio.sleep(0.1)
            assert not task.done(), task.exception()
            assert not consumer.ready.is_set()
            consumer.stop()
            async with asyncio.timeout(10):
                await task  # ends without an error

    asyncio.run(scenario())


def _partition_ends(raw: Any, topic: str, total: int) -> dict[int, int]:
    """Each partition's end (its last offset + 1), read from the records themselves: ``total``
    of them, from the beginning (tansu's high watermarks are not the records' offsets)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    raw.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    ends = dict.fromkeys(range(PARTITIONS), 0)
    seen = 0
    for _ in range(600):  # 0.1 s polls: 60 s at most
        msg = raw.poll(0.1)
        if msg is not None and not msg.error():
            ends[msg.partition()] = max(ends[msg.partition()], msg.offset() + 1)
            seen += 1
            if seen == total:
                break
    assert seen == total, (seen, total)
    raw.unassign()
    return ends


def test_an_assigned_kafka_consumer_starts_at_the_groups_committed_offset_and_commits(
    database_url: str,
) -> None:
    """No offset in the database: each partition starts from the group's committed offset
    (here: the end of every partition but 0, so only partition 0's messages are applied), and
    what it applies is committed to Kafka too (lag monitoring), up to the partition's end."""
    from confluent_kafka import Consumer, TopicPartition
    from psycopg_pool import AsyncConnectionPool

    from inbox import AsyncHandlerRunner, KafkaConsumer

    place = _place("kafka")
    applied: list[tuple[str, int]] = []
    enough = asyncio.Event()
    wanted = [0]

    async def handler(_conn: Any, env: Envelope) -> None:
        applied.append((env.key, env.seq))
        if len(applied) >= wanted[0]:
            enough.set()

    async def scenario() -> tuple[dict[int, int], dict[int, int]]:
        await place.setup()
        backlog = _backlog(keys=30, per_key=2)
        await _publish(place, backlog)
        options = place.settings()["options"]
        topic, config = options["topics"][0], options["config"]
        raw = Consumer({**config, "enable.auto.commit": False})
        ends = await asyncio.to_thread(_partition_ends, raw, topic, len(backlog))
        assert ends[0] > 0, ends
        raw.commit(offsets=[TopicPartition(topic, p, ends[p]) for p in range(1, PARTITIONS)],
                   asynchronous=False)  # fmt: skip
        raw.close()
        async with AsyncConnectionPool(database_url, min_size=1, max_size=2) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer=f"svc-{place.tag}", ordered=True)
            consumer = KafkaConsumer(runner, config=config, topics=[topic],
                                     partitions=list(range(PARTITIONS)), offsets_in_db=True,
                                     poll_timeout=0.2)  # fmt: skip
            wanted[0] = ends[0]
            task = asyncio.create_task(consumer.run())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(enough.wait(), 30)
            # an absence cannot be awaited: anything beyond partition 0 would come meanwhile
            await asyncio.sleep(0.5)
            consumer.stop()
            await asyncio.wait_for(task, 10)
        check = Consumer(config)
        committed = check.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], 10)
        check.close()
        return ends, {tp.partition: tp.offset for tp in committed}

    ends, committed = asyncio.run(scenario())
    assert len(applied) == ends[0], (len(applied), ends)  # partition 0's messages, no other
    assert len(set(applied)) == len(applied)
    assert committed == ends  # partition 0 committed by the consumer, the others as they were


async def _kill(workers: list[Worker]) -> None:
    for worker in workers:
        if worker.proc.returncode is None:
            worker.proc.kill()
            await worker.proc.wait()


@pytest.mark.parametrize("name", ["nats", "kafka"])
def test_a_process_frozen_past_its_lease_applies_nothing_when_it_resumes(
    applied_url: str, name: str
) -> None:
    """SIGSTOP one of two processes mid-backlog: the other takes its partitions once the lease
    lapsed (within lease + heartbeat + 1 s); resumed, the frozen one finds its leases gone in
    the transactions it had open (the fence), applies nothing of them, and rejoins."""
    place = _place(name)

    async def scenario() -> float:
        await place.setup()
        workers: list[Worker] = []
        try:
            workers = [await _start(applied_url, place, f"w{i}", delay=0.03) for i in range(2)]
            await _until(lambda: _balanced(workers), 40, "a balanced assignment", workers)
            backlog = _backlog(keys=60, per_key=50)
            await _publish(place, backlog)
            await _until(lambda: _count(applied_url) >= 300, 60, "a first part", workers)
            frozen, other = workers
            frozen.proc.send_signal(signal.SIGSTOP)
            stopped = asyncio.get_running_loop().time()
            try:
                await _until(lambda: len(other.owned) == PARTITIONS, 30, "the takeover", workers)
                took = asyncio.get_running_loop().time() - stopped
                assert _count(applied_url) < len(backlog), "the backlog was drained meanwhile"
            finally:
                frozen.proc.send_signal(signal.SIGCONT)
            await _until(lambda: _balanced(workers), 40, "the rejoin", workers)
            await _until(lambda: _count(applied_url) >= len(backlog), 120, "the backlog", workers)
            for worker in workers:
                await worker.stop()
            _check_applied(applied_url, backlog)
            return took
        finally:
            await _kill(workers)
            await place.teardown()

    took = asyncio.run(scenario())
    assert took <= LEASE["duration"] + LEASE["heartbeat"] + 1.0, took


@pytest.mark.parametrize("name", ["nats", "rabbitmq", "kafka"])
def test_a_process_killed_mid_stream_is_taken_over_within_its_lease(
    applied_url: str, name: str
) -> None:
    """kill -9 one of two processes mid-backlog: the other takes its partitions within lease +
    heartbeat + 1 s, and every message is applied once, in key order, one process at a time."""
    place = _place(name)

    async def scenario() -> float:
        await place.setup()
        workers: list[Worker] = []
        try:
            workers = [await _start(applied_url, place, f"w{i}", delay=0.03) for i in range(2)]
            await _until(lambda: _balanced(workers), 40, "a balanced assignment", workers)
            backlog = _backlog(keys=60, per_key=50)
            await _publish(place, backlog)
            await _until(lambda: _count(applied_url) >= 300, 60, "a first part", workers)
            killed, other = workers
            killed.proc.kill()
            gone = asyncio.get_running_loop().time()
            await killed.proc.wait()
            await _until(lambda: len(other.owned) == PARTITIONS, 30, "the takeover", workers)
            took = asyncio.get_running_loop().time() - gone
            await _until(lambda: _count(applied_url) >= len(backlog), 120, "the backlog", workers)
            await other.stop()
            _check_applied(applied_url, backlog)
            return took
        finally:
            await _kill(workers)
            await place.teardown()

    took = asyncio.run(scenario())
    assert took <= LEASE["duration"] + LEASE["heartbeat"] + 1.0, took
