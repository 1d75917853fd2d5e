"""The fault-injection suite: a real workload under a nemesis, then a check of the history.

Workload (each scenario on fresh infrastructure of its own, see infra.py):
* producer threads commit an ``orders`` row and its message with ``publish()`` in one
  transaction, over a few hundred keys; about 10 % roll back, some re-publish an idempotency key
  (a no-op), about 1 % carry a poison payload (their consumer handler always fails), some try an
  oversized payload (refused by ``publish()``, nothing written), and in the late-commit scenario
  some hold their transaction open for seconds before committing;
* two relay processes (``outbox relay``) publish to NATS JetStream through a TCP proxy;
* two ordered consumer processes (inbox, ``on_dead="skip"``) apply one ``effects`` row per
  message in the inbox's transaction.

Scenarios named ``sqs-...`` and ``amqp1-...`` run the same on another broker: an SQS FIFO queue
on a moto server, with one consumer (relays and consumer reach it through the proxy), or an
exchange of the private AMQP 1.0 node (tests/support/amqp1_broker.py) routing to two durable queues.
What a killed moto loses, and what the scenario models of AWS, is written at
tests/support/aws_server.py's ``put_back``.

Scenarios named ``wal-...`` run the same in WAL capture mode (docs/explanation/capture.md): the
producers' ``publish()`` emits logical messages, and the relays stream them from a replication
slot (one captures, the other stands by).

A nemesis injects one kind of fault while the producers run; then the fault is healed, the
producers stop, and the suite waits for the consumers to apply everything committed.

The check, from the databases alone: **lost** (committed, never applied by a consumer),
**duplicates** (one consumer applied one message twice), **order violations** (a consumer
applied a key's messages out of seq order), **phantoms** (applied, never committed), dead
letters expected (poison) or not, and the seconds from the heal until every committed message
was applied. A commit whose outcome the producer could not know (its connection was cut
mid-commit) counts as committed exactly when its row is in the outbox afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from outbox import PayloadTooLargeError, publish
from outbox._migrate import upgrade
from relay.admin import enable_capture
from tests.faults.infra import MotoServer, NatsServer, PgCluster, Proxy

HERE = Path(__file__).resolve().parent
STREAM, TOPIC = "FAULTS", "orders"
CONSUMERS = ("billing", "shipping")
#: SQS: the region, the FIFO queue the relays send to and the consumer receives from
REGION, SQS_QUEUE = "us-east-1", "faults-orders.fifo"
#: AMQP 1.0: the exchange the relays send to (one durable queue per consumer bound to it)
EXCHANGE = "faults"
LEASE = 4.0
PUBLISH_TIMEOUT = 2.5  # < the lease; the relay gives its adapter 80 % of it

SCHEMA = """
CREATE TABLE orders (id uuid PRIMARY KEY, key text NOT NULL);
CREATE TABLE effects (
    n bigserial PRIMARY KEY, consumer text NOT NULL, message_id uuid NOT NULL,
    topic text NOT NULL, key text NOT NULL, seq bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


@dataclass
class History:
    """What the producers know: committed ids, rolled-back ids, commits of unknown outcome."""

    committed: set[uuid.UUID] = field(default_factory=set)
    rolled_back: set[uuid.UUID] = field(default_factory=set)
    unknown: set[uuid.UUID] = field(default_factory=set)
    poison: set[uuid.UUID] = field(default_factory=set)
    refused_oversized: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Result:
    scenario: str
    committed: int
    unknown_outcome: int
    lost: int
    duplicates: int
    order_violations: int
    phantoms: int
    dead_expected: int
    dead_unexpected: int
    recovery_seconds: float
    unclean_exits: int = 0
    notes: str = ""
    #: the longest time between two messages sent to the broker while the producers ran
    max_delivery_gap_seconds: float = float("nan")
    takeover_seconds: float = float("nan")
    #: scale-out scenarios (groups.py): a key's handler running in two processes at once
    overlaps: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.order_violations or self.phantoms
                    or self.dead_unexpected or self.unclean_exits or self.overlaps)  # fmt: skip


class World:
    """The private infrastructure, the relays and the consumers of one scenario."""

    def __init__(
        self, log_dir: Path, capture: str = "polling", broker: str = "nats",
        lease: float = LEASE, publish_timeout: float = PUBLISH_TIMEOUT,
    ) -> None:  # fmt: skip
        self.log_dir = log_dir
        self.capture = capture
        self.broker = broker
        self.lease, self.publish_timeout = lease, publish_timeout
        #: moto: one consumer, on one FIFO queue (an SNS fan-out to two doubles moto's work,
        #: and moto has little to spare: see _moto_restore); the others: two
        self.consumer_names = CONSUMERS[:1] if broker == "sqs" else CONSUMERS
        self.pg = PgCluster(logical=capture == "wal")
        #: clusters the database moved away from (move_database), stopped at close
        self.retired_pg: list[PgCluster] = []
        #: the producers' history (run() sets it), and the commits a restore took back
        self.history: History | None = None
        self.rewound: set[uuid.UUID] = set()
        self.nats: NatsServer | None = None
        self.moto: MotoServer | None = None
        self.node: Any = None  # amqp1_broker.Node
        if broker == "nats":
            self.nats = NatsServer()
            broker_port = self.nats.port
        elif broker == "sqs":
            import tests.support.aws_server as aws_server

            aws_server.aws_env()  # dummy credentials for the default chain, in every child too
            self.moto = MotoServer(log_dir / "moto.log")
            broker_port = self.moto.port
        elif broker == "amqp1":
            from tests.support.amqp1_broker import Node

            self.node = Node()
            broker_port = self.node.port
        else:
            raise ValueError(f"unknown broker {broker!r}")
        self.pg_proxy = Proxy(self.pg.port)  # producers reach the database through it
        self.broker_proxy = Proxy(broker_port)  # relays reach the broker through it
        with psycopg.connect(self.pg.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE app")
        self.url = self.pg.url("app")
        self.producer_url = f"postgresql://postgres@127.0.0.1:{self.pg_proxy.port}/app"
        upgrade(self.url)
        if capture == "wal":
            enable_capture(self.url)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(SCHEMA)
        self._streams()
        self.relays: list[subprocess.Popen[bytes] | None] = [None, None]
        self.consumers: list[subprocess.Popen[bytes] | None] = [None] * len(self.consumer_names)
        self.crash_probability = 0.0
        self.supervise = True
        #: relays that did not exit 0 within their shutdown bound after a SIGTERM
        self.unclean_exits = 0
        #: seconds from a freeze of the streaming relay until a standby held the slot
        self.takeover_seconds = float("nan")
        #: moto: messages put back after its restarts (_moto_restore)
        self.restored = 0
        self._stop = threading.Event()
        for i in range(2):
            self.start_relay(i)
        for i in range(len(self.consumer_names)):
            self.start_consumer(i)
        self._watch = threading.Thread(target=self._supervisor, daemon=True)
        self._watch.start()

    def _streams(self) -> None:
        if self.broker == "sqs":
            assert self.moto is not None
            _moto_resources(self.moto.endpoint)
            return
        if self.broker == "amqp1":
            _amqp1_resources(self.node.url)
            return
        import asyncio

        import nats
        from nats.js.api import ConsumerConfig

        assert self.nats is not None

        async def make() -> None:
            assert self.nats is not None
            nc = await nats.connect(self.nats.url)
            js = nc.jetstream()
            await js.add_stream(name=STREAM, subjects=[TOPIC], duplicate_window=120)
            for name in CONSUMERS:  # a short ack_wait: a crashed consumer's messages return soon
                await js.add_consumer(
                    STREAM, ConsumerConfig(durable_name=name, ack_wait=2.0, ack_policy="explicit")
                )
            await nc.close()

        asyncio.run(make())

    def _spawn(
        self, args: list[str], name: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"{name}.log", "ab") as log:  # the child keeps its own copy
            return subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )

    def start_relay(self, i: int) -> None:
        proxied = f"127.0.0.1:{self.broker_proxy.port}"
        env = {
            "OUTBOX_RELAY_PUBLISH_TIMEOUT": str(self.publish_timeout),
            "OUTBOX_RELAY_SHUTDOWN_TIMEOUT": "5",
            "OUTBOX_RELAY_HEARTBEAT_INTERVAL": "1",
        }
        if self.broker == "amqp1":  # the address comes from a destination map
            self.relays[i] = self._spawn(
                [sys.executable, str(HERE / "relay_proc.py"), self.url,
                 self.node.url.replace(f"127.0.0.1:{self.node.port}", proxied),
                 json.dumps({TOPIC: f"/exchange/{EXCHANGE}/{TOPIC}"}), str(self.lease)],
                f"relay{i}", env,
            )  # fmt: skip
            return
        broker = f"nats://{proxied}"
        if self.broker == "sqs":
            broker = f"sqs://{REGION}?endpoint=http://{proxied}&destination={SQS_QUEUE}"
        self.relays[i] = self._spawn(
            [sys.executable, "-m", "outbox.cli", "relay", "--url", self.url, "--broker", broker,
             "--lease-seconds", str(self.lease), "--poll-interval", "0.2", "--batch-size", "100"],
            f"relay{i}", env,
        )  # fmt: skip

    def start_consumer(self, i: int) -> None:
        name = self.consumer_names[i]
        if self.broker == "sqs":  # through the proxy: a restarted moto is on another port
            where = ["sqs", f"http://127.0.0.1:{self.broker_proxy.port}", SQS_QUEUE]
        elif self.broker == "amqp1":
            where = ["amqp1", self.node.url, f"/queue/{name}"]
        else:
            assert self.nats is not None
            where = ["nats", self.nats.url, STREAM]
        self.consumers[i] = self._spawn(
            [sys.executable, str(HERE / "consumer_proc.py"), self.url, *where, name,
             str(self.crash_probability)],
            f"consumer{i}",
        )  # fmt: skip

    def kill_broker(self) -> None:
        """``kill -9`` of the broker's process."""
        if self.moto is not None:
            self.moto.kill()
        elif self.node is not None:
            self.node.kill()
        else:
            assert self.nats is not None
            self.nats.kill()

    def restart_broker(self) -> None:
        """Start the broker again: NATS and the AMQP 1.0 node on their stores; moto empty, on
        another port, so its queue is recreated and what it lost is put back (_moto_restore)
        before the proxy lets anyone reach it."""
        if self.moto is not None:
            self.moto.start()
            _moto_resources(self.moto.endpoint)
            self.restored += _moto_restore(self.url, self.moto.endpoint, self.consumer_names[0])
            self.broker_proxy.retarget(self.moto.port)
        elif self.node is not None:
            self.node.restart()
        else:
            assert self.nats is not None
            self.nats.start()

    def _supervisor(self) -> None:
        """Restart a relay or consumer that died (killed, or exited on a lost broker)."""
        while not self._stop.wait(0.3):
            if not self.supervise:
                continue
            for i, proc in enumerate(self.relays):
                if proc is None or proc.poll() is not None:
                    self.start_relay(i)
            for i, proc in enumerate(self.consumers):
                if proc is None or proc.poll() is not None:
                    self.start_consumer(i)

    def close(self) -> None:
        self._stop.set()
        self._watch.join(5)
        for proc in [*self.relays, *self.consumers]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.pg_proxy.close()
        self.broker_proxy.close()
        if self.nats is not None:
            self.nats.stop()
        if self.moto is not None:
            self.moto.stop()
        if self.node is not None:
            self.node.stop()
        self.pg.stop()
        for old in self.retired_pg:
            old.stop()

    def move_database(self, to: PgCluster) -> None:
        """Everything that used the database uses ``to`` from now on (a failover, a restore):
        the producers' proxy points at it, and relays and consumers restart on it."""
        self.retired_pg.append(self.pg)
        self.pg = to
        self.url = to.url("app")
        self.pg_proxy.retarget(to.port)


# ---- the other brokers' resources -------------------------------------------------------

def _moto_resources(endpoint: str) -> None:
    """The FIFO queue; the same name, so the same queue URL, on every (re)start of moto."""
    import boto3

    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=REGION)
    sqs.create_queue(QueueName=SQS_QUEUE, Attributes={"FifoQueue": "true"})


def _moto_restore(url: str, endpoint: str, consumer: str) -> int:
    """Put back into the restarted moto what Amazon SQS would still hold and moto lost with its
    process (aws_server.put_back: what that models and what it does not). moto is also slow:
    each send and receive scans the queue, so at a few hundred messages a call takes seconds
    on a busy machine; the scenario runs at a gentle rate, with long call timeouts, and one
    consumer (an SNS fan-out to a queue per consumer, as the pipeline tests run it, would
    double moto's work)."""
    import boto3

    import tests.support.aws_server as aws_server

    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=REGION)
    queue = sqs.get_queue_url(QueueName=SQS_QUEUE)["QueueUrl"]
    return aws_server.put_back(url, sqs, queue, consumer)


def _amqp1_resources(broker_url: str) -> None:
    """A durable direct exchange and a durable queue per consumer bound to it, declared over
    AMQP 0-9-1 (the node speaks both; AMQP 1.0 has no bindings)."""
    import asyncio

    import aio_pika

    async def declare() -> None:
        conn = await aio_pika.connect(broker_url.replace("amqp1://", "amqp://"))
        async with conn:
            channel = await conn.channel()
            exchange = await channel.declare_exchange(EXCHANGE, "direct", durable=True)
            for name in CONSUMERS:
                queue = await channel.declare_queue(name, durable=True)
                await queue.bind(exchange, routing_key=TOPIC)

    asyncio.run(declare())


# ---- the workload ------------------------------------------------------------------------


def _produce(world: World, history: History, stop: threading.Event, seed: int,
             late_commits: bool, pause: float = 0.0) -> None:  # fmt: skip
    rng = random.Random(seed)
    keys = [f"order-{seed}-{i}" for i in range(40)]
    idem: list[tuple[str, str]] = []
    conn: psycopg.Connection[Any] | None = None
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(world.producer_url, connect_timeout=3)
            key = rng.choice(keys)
            order_id = uuid.uuid4()
            poison = rng.random() < 0.01
            roll = rng.random()
            republish = 0.03 <= roll < 0.08 and bool(idem)
            # Re-publishing an earlier idempotency key creates a message when the first one
            # never committed (rolled back, or cut before its commit): that message is new and
            # is accounted like any other, so a re-publish never carries a poison payload.
            poison = poison and not republish
            payload = {"order": str(order_id), "poison": poison}
            if roll < 0.03:  # oversized: refused before anything is written
                try:
                    publish(conn, topic=TOPIC, key=key, payload={"blob": "x" * 2_000_000})
                except PayloadTooLargeError:
                    with history.lock:
                        history.refused_oversized += 1
                conn.rollback()
                continue
            conn.execute("INSERT INTO orders (id, key) VALUES (%s, %s)", (order_id, key))
            if republish:  # an earlier idempotency key: a no-op if its message committed
                ikey_topic_key = rng.choice(idem)
                msg_id = publish(conn, topic=TOPIC, key=ikey_topic_key[1], payload=payload,
                                 idempotency_key=ikey_topic_key[0])  # fmt: skip
                published_again = True
            elif roll < 0.15:
                ikey = f"idem-{uuid.uuid4()}"
                msg_id = publish(conn, topic=TOPIC, key=key, payload=payload, idempotency_key=ikey)
                idem.append((ikey, key))
                published_again = False
            else:
                msg_id = publish(conn, topic=TOPIC, key=key, payload=payload)
                published_again = False
            if rng.random() < 0.10:
                conn.rollback()
                if not published_again:
                    with history.lock:
                        history.rolled_back.add(msg_id)
                continue
            if late_commits and rng.random() < 0.05:
                time.sleep(rng.uniform(1.0, 4.0))  # holds its key's counter row meanwhile
            try:
                conn.commit()
            except psycopg.OperationalError:
                with history.lock:
                    history.unknown.add(msg_id)
                    if poison and not published_again:  # if it did commit, it is poison
                        history.poison.add(msg_id)
                conn.close()
                conn = None
                continue
            with history.lock:
                history.committed.add(msg_id)
                if poison and not published_again:
                    history.poison.add(msg_id)
            time.sleep(pause or rng.uniform(0.0, 0.01))
        except psycopg.Error:
            if conn is not None:  # the database is away (crash, cut): reconnect and go on
                conn.close()
            conn = None
            time.sleep(0.2)
    if conn is not None:
        conn.close()


# ---- the nemeses ---------------------------------------------------------------------------


def _relay_kill9(world: World, stop: threading.Event) -> str:
    n = 0
    while not stop.wait(random.uniform(1.0, 2.5)):
        proc = world.relays[random.randrange(2)]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            n += 1
    return f"{n} relay kill -9"


def _relay_pause(world: World, stop: threading.Event) -> str:
    n = 0
    while not stop.wait(1.0):
        proc = world.relays[n % 2]
        if proc is None or proc.poll() is not None:
            continue
        proc.send_signal(signal.SIGSTOP)  # past its lease: its rows are taken over
        stop.wait(LEASE * 2)
        proc.send_signal(signal.SIGCONT)  # wakes up holding stale leases: must be fenced
        n += 1
    return f"{n} relay SIGSTOP for {LEASE * 2:g}s (lease {LEASE:g}s)"


FREEZE = 90.0


def _streaming_relay(world: World) -> tuple[subprocess.Popen[bytes], int] | None:
    """The relay process holding the capture lease now, and the lease's epoch."""
    with psycopg.connect(world.url) as conn:
        row = conn.execute(
            "SELECT r.pid, l.epoch FROM outbox_capture_lease AS l "
            "JOIN outbox_relays AS r ON r.relay_id = l.holder WHERE l.stream_pid IS NOT NULL"
        ).fetchone()
    for proc in world.relays:
        if row is not None and proc is not None and proc.pid == row[0] and proc.poll() is None:
            return proc, int(row[1])
    return None


def _streaming_relay_frozen(world: World, stop: threading.Event) -> str:
    """SIGSTOP the relay streaming the slot for FREEZE seconds: a standby must fence it and
    take the slot over within the lease."""
    stop.wait(3.0)
    holder = None
    while holder is None and not stop.wait(0.1):
        holder = _streaming_relay(world)
    if holder is None:
        return "no streaming relay found to freeze"
    proc, epoch = holder
    proc.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    took = float("nan")
    while time.monotonic() - frozen_at < FREEZE:
        now = _streaming_relay(world)
        if now is not None and now[1] > epoch:
            took = time.monotonic() - frozen_at
            break
        time.sleep(0.05)
    time.sleep(max(0.0, FREEZE - (time.monotonic() - frozen_at)))
    proc.send_signal(signal.SIGCONT)  # wakes up fenced: it must stand by
    world.takeover_seconds = took
    stop.wait()
    return (
        f"streaming relay SIGSTOP for {FREEZE:g}s (lease {LEASE:g}s), slot taken over after "
        f"{took:.1f}s"
    )


def _broker_kill9(world: World, stop: threading.Event) -> str:
    n = 0
    # moto: a kill every 10 s (a backlog slows it down, see the scenario), and 3 s down: a send
    # the killed server confirmed is marked published by then (its other sends failed at once,
    # their connections reset), so _moto_restore finds it
    while not stop.wait(10.0 if world.moto is not None else 3.0):
        world.kill_broker()
        time.sleep(3.0 if world.moto is not None else 1.5)
        world.restart_broker()
        n += 1
    what = {"nats": "nats-server", "sqs": "moto server (SQS)",
            "amqp1": "AMQP 1.0 node (RabbitMQ)"}[world.broker]  # fmt: skip
    return f"{n} {what} kill -9 and restart"


def _broker_blackhole(world: World, stop: threading.Event) -> str:
    n = 0
    while not stop.wait(2.0):
        world.broker_proxy.blackhole()
        time.sleep(4.0)
        world.broker_proxy.heal()
        world.broker_proxy.cut()  # the stuck connections go; clients reconnect
        n += 1
    return f"{n} relay-broker black-holes of 4s"


def _postgres_crash(world: World, stop: threading.Event) -> str:
    n = 0
    while not stop.wait(4.0):
        world.pg.crash()
        time.sleep(1.0)
        world.pg.start()
        n += 1
    return f"{n} PostgreSQL immediate stops and restarts"


def _producer_cut(world: World, stop: threading.Event) -> str:
    n = 0
    while not stop.wait(random.uniform(0.3, 1.0)):
        world.pg_proxy.cut()  # commits in flight: outcome unknown to the producer
        n += 1
    return f"{n} cuts of the producers' connections"


def _consumer_crash(world: World, stop: threading.Event) -> str:
    stop.wait()
    return "consumers SIGKILL themselves after 2% of commits, before the ack"


def _sigterm_while_down(
    world: World, stop: threading.Event, down: Callable[[], None], up: Callable[[], None],
    what: str,
) -> str:  # fmt: skip
    """Take a dependency down, SIGTERM both relays: each must exit 0 within its shutdown
    bound; bring it back and let the supervisor restart them."""
    exits: list[str] = []
    while not stop.wait(3.0):
        down()
        world.supervise = False
        for i, proc in enumerate(world.relays):
            if proc is None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = -9
            exits.append(f"relay{i}:{code}")
            world.unclean_exits += code != 0
        up()
        world.supervise = True
    clean = all(e.endswith(":0") for e in exits)
    verdict = "clean" if clean else "NOT clean"
    return f"SIGTERM with {what} down: {len(exits)} relay exits, {verdict}"


def _sigterm_broker_down(world: World, stop: threading.Event) -> str:
    return _sigterm_while_down(world, stop, world.kill_broker, world.restart_broker, "the broker")


def _sigterm_database_down(world: World, stop: threading.Event) -> str:
    return _sigterm_while_down(world, stop, world.pg.crash, world.pg.start, "the database")


def _relays_down(world: World) -> None:
    """``kill -9`` both relays and keep them down (the producers go on)."""
    world.supervise = False
    for proc in world.relays:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)


def _drop_slot(world: World) -> None:
    """Drop the capture slot as an operator, a failover or a restore loses it: any walsender on
    it is ended first (a drop refuses an active slot)."""
    with psycopg.connect(world.url, autocommit=True) as conn:
        for _ in range(200):
            conn.execute(
                "SELECT pg_terminate_backend(s.active_pid) FROM pg_replication_slots AS s "
                "JOIN outbox_capture AS c ON c.slot = s.slot_name WHERE s.active_pid IS NOT NULL"
            )
            try:
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = (SELECT slot FROM outbox_capture)"
                )
                return
            except psycopg.errors.ObjectInUse:  # its walsender is exiting, or a new one came
                time.sleep(0.05)


def _slot_dropped_while_down(world: World, stop: threading.Event) -> str:
    stop.wait(2.0)
    _relays_down(world)
    stop.wait(3.0)  # the slot holds what is committed meanwhile
    _drop_slot(world)
    stop.wait(1.0)
    world.supervise = True  # the relays come back to a missing slot
    stop.wait()
    return "relays kill -9 and kept down 4 s; slot dropped while they were down"


def _slot_invalidated_while_down(world: World, stop: threading.Event) -> str:
    stop.wait(2.0)
    _relays_down(world)
    with psycopg.connect(world.pg.admin_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("CREATE TABLE IF NOT EXISTS filler (x text)")
        lost = False
        for _ in range(60):
            conn.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 100)")
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            row = conn.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE wal_status = 'lost'"
            ).fetchone()
            if row and row[0]:
                lost = True
                break
        conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        conn.execute("SELECT pg_reload_conf()")
    stop.wait(1.0)
    world.supervise = True  # the relays come back to an invalidated slot
    stop.wait()
    return f"relays kill -9 and kept down; slot {'invalidated' if lost else 'NOT invalidated'}"


def _slot_dropped_while_streaming(world: World, stop: threading.Event) -> str:
    n = 0
    while not stop.wait(random.uniform(2.0, 3.0)):
        _drop_slot(world)
        n += 1
    return f"{n} slot drops while a relay streamed it"


def _consumers_down(world: World) -> None:
    for proc in world.consumers:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _moved(world: World, stop: threading.Event, to: PgCluster, what: str) -> str:
    """The relays are down; the database moves to ``to`` (its old server halted), and every
    process comes back on it. The replication slot stays behind: ``to`` has none."""
    _relays_down(world)
    stop.wait(2.0)  # the producers commit on; the old slot holds it, the new server will not
    world.pg.halt()  # a fast stop sends its standbys all the WAL first
    if what == "failover":
        to.promote()
    else:  # a restore takes back what committed after the backup: not expected any more
        with psycopg.connect(to.url("app")) as conn:
            kept = {r[0] for r in conn.execute(
                "SELECT id FROM outbox_messages UNION ALL SELECT id FROM outbox_wal_pending"
            )}  # fmt: skip
        history = world.history
        assert history is not None
        with history.lock:
            world.rewound = (history.committed | history.unknown) - kept
    world.move_database(to)
    for proc in world.consumers:  # their database is gone: the supervisor restarts them
        if proc is not None and proc.poll() is None:
            proc.kill()
    world.supervise = True
    stop.wait()
    return what


def _failover(world: World, stop: threading.Event) -> str:
    stop.wait(5.0)  # the relays stream (a loaded machine starts them slowly)
    standby = PgCluster(logical=True, copy_of=world.pg)  # pg_basebackup -R, streaming
    stop.wait(1.0)
    return _moved(world, stop, standby, "failover") + (
        ": relays down, a pg_basebackup standby promoted, the relays pointed at it"
    )


def _restore(world: World, stop: threading.Event) -> str:
    """A restore of a base backup taken while the relays were down: what committed after the
    backup is taken back with the database (the checks count the restored database's
    messages); what it holds, the slot it lacks never delivered."""
    stop.wait(5.0)  # the relays stream (a loaded machine starts them slowly)
    _relays_down(world)
    _consumers_down(world)  # a broker does not forget an ack when the inbox is restored
    stop.wait(2.0)
    restored = PgCluster(logical=True, copy_of=world.pg, standby=False)
    return _moved(world, stop, restored, "restore") + (
        ": relays down, a base backup of the running server started in its place"
    )


def _nothing(world: World, stop: threading.Event) -> str:
    stop.wait()
    return "no fault"


def _late_commits(world: World, stop: threading.Event) -> str:
    stop.wait()  # the producers hold the commits open themselves (Scenario.late_commits)
    return "5% of producer commits held open 1-4 s"


@dataclass(frozen=True)
class Scenario:
    name: str
    nemesis: Callable[[World, threading.Event], str]
    crash_probability: float = 0.0
    late_commits: bool = False
    capture: str = "polling"
    #: nats, sqs (an SNS FIFO topic to SQS FIFO queues on moto) or amqp1 (the private node)
    broker: str = "nats"
    #: the relays' lease and publish timeout (moto answers slower the more a queue holds)
    lease: float = LEASE
    publish_timeout: float = PUBLISH_TIMEOUT
    #: the workload runs at least this long (the nemesis needs it)
    min_seconds: float = 0.0
    #: each producer's pause after a commit (0: 0-10 ms at random): a long workload at a rate
    #: the consumers keep up with, so that a stall shows as a gap and not as a backlog
    producer_pause: float = 0.0


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("baseline", _nothing),
        Scenario("relay-kill-9", _relay_kill9),
        Scenario("relay-paused-past-lease", _relay_pause),
        Scenario("broker-kill-9", _broker_kill9),
        Scenario("relay-broker-blackhole", _broker_blackhole),
        Scenario("postgres-crash", _postgres_crash),
        Scenario("producer-cut-mid-commit", _producer_cut),
        Scenario("consumer-kill-9-after-commit", _consumer_crash, crash_probability=0.02),
        Scenario("late-commits", _late_commits, late_commits=True),
        Scenario("sigterm-broker-down", _sigterm_broker_down),
        Scenario("sigterm-database-down", _sigterm_database_down),
        # moto's queues slow down with their depth (each send and receive scans the queue; at a
        # few hundred messages a call takes seconds): a gentler rate, and time for a call
        Scenario("sqs-broker-kill-9", _broker_kill9, broker="sqs", min_seconds=30,
                 producer_pause=0.3, lease=12.0, publish_timeout=10.0),
        Scenario("amqp1-broker-kill-9", _broker_kill9, broker="amqp1", min_seconds=12),
        Scenario("wal-baseline", _nothing, capture="wal"),
        Scenario("wal-relay-kill-9", _relay_kill9, capture="wal"),
        Scenario("wal-broker-kill-9", _broker_kill9, capture="wal"),
        Scenario("wal-postgres-crash", _postgres_crash, capture="wal"),
        Scenario("wal-producer-cut-mid-commit", _producer_cut, capture="wal"),
        Scenario("wal-slot-dropped-while-relays-down", _slot_dropped_while_down,
                 capture="wal", min_seconds=10),
        Scenario("wal-slot-invalidated-while-relays-down", _slot_invalidated_while_down,
                 capture="wal", min_seconds=10),
        Scenario("wal-slot-dropped-while-streaming", _slot_dropped_while_streaming,
                 capture="wal", min_seconds=10),
        # the producers run on through the move (a base backup takes a while on a busy machine)
        Scenario("wal-failover-to-standby-without-slot", _failover, capture="wal",
                 min_seconds=40),
        Scenario("wal-restore-base-backup", _restore, capture="wal", min_seconds=40),
        Scenario(
            "wal-relay-frozen-90s",
            _streaming_relay_frozen,
            capture="wal",
            min_seconds=FREEZE + 10,
            producer_pause=0.02,
        ),
    )
}
SHORT = ("relay-kill-9", "consumer-kill-9-after-commit", "broker-kill-9", "wal-relay-kill-9",
         "wal-slot-dropped-while-relays-down",
         "sqs-broker-kill-9", "amqp1-broker-kill-9")


# ---- running and checking ------------------------------------------------------------------


@contextlib.contextmanager
def _world(log_dir: Path, scenario: Scenario) -> Iterator[World]:
    world = World(log_dir, scenario.capture, scenario.broker, scenario.lease,
                  scenario.publish_timeout)  # fmt: skip
    try:
        yield world
    finally:
        world.close()


def _applied(url: str, consumers: tuple[str, ...]) -> dict[str, list[tuple[uuid.UUID, str, int]]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT consumer, message_id, key, seq FROM effects ORDER BY n"
        ).fetchall()
    out: dict[str, list[tuple[uuid.UUID, str, int]]] = {c: [] for c in consumers}
    for consumer, message_id, key, seq in rows:
        out[consumer].append((message_id, key, int(seq)))
    return out


def _slot_caught_up(url: str, deadline: float) -> None:
    """Wait until the capture slot has confirmed the server's WAL as of now: every transaction
    committed so far has been decoded and recorded by a relay."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        while time.monotonic() < deadline:
            done = conn.execute(
                "SELECT s.confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots AS s "
                "JOIN outbox_capture AS c ON c.slot = s.slot_name",
                (row[0],),
            ).fetchone()
            if done and done[0]:
                return
            time.sleep(0.2)


def _pending_recorded(url: str, deadline: float) -> None:
    """Wait until the relay has recorded every message of outbox_wal_pending (what a lost slot
    did not deliver is published from the table)."""
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT count(*) FROM outbox_wal_pending").fetchone()
            if row and row[0] == 0:
                return
            time.sleep(0.2)


def run(name: str, seconds: float, log_dir: Path, settle_timeout: float = 120.0) -> Result:
    """One scenario: workload under its nemesis for ``seconds``, heal, settle, check."""
    scenario = SCENARIOS[name]
    log_dir.mkdir(parents=True, exist_ok=True)
    history = History()
    with _world(log_dir, scenario) as world:
        world.crash_probability = scenario.crash_probability
        world.history = history
        if scenario.crash_probability:
            for i in range(2):
                proc = world.consumers[i]
                if proc is not None:
                    proc.kill()  # the supervisor restarts them with the crash probability
        stop = threading.Event()
        producers = [
            threading.Thread(target=_produce, args=(world, history, stop, seed,
                                                    scenario.late_commits,
                                                    scenario.producer_pause))
            for seed in range(3)
        ]  # fmt: skip
        for t in producers:
            t.start()
        notes: list[str] = []
        nemesis = threading.Thread(target=lambda: notes.append(scenario.nemesis(world, stop)))
        nemesis.start()
        time.sleep(max(seconds, scenario.min_seconds))
        with psycopg.connect(world.url) as conn:
            row = conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            stopped_at = row[0]
        stop.set()
        nemesis.join(60)
        for t in producers:
            t.join(60)
        world.broker_proxy.heal()
        world.crash_probability = 0.0
        healed = time.monotonic()
        deadline = time.monotonic() + settle_timeout
        if world.capture == "wal":
            # a message has a row once the relay has decoded and recorded it
            _slot_caught_up(world.url, deadline)
            _pending_recorded(world.url, deadline)
        # the truth about commits of unknown outcome, from the database
        with psycopg.connect(world.url) as conn:
            in_outbox = {r[0] for r in conn.execute("SELECT id FROM outbox_messages")}
        committed = (history.committed | (history.unknown & in_outbox)) - world.rewound
        expected = committed - history.poison
        recovered = float("nan")
        names = world.consumer_names
        while time.monotonic() < deadline:
            applied = _applied(world.url, names)
            if all(expected <= {m for m, _, _ in applied[c]} for c in names):
                recovered = time.monotonic() - healed
                break
            time.sleep(0.5)
        applied = _applied(world.url, names)
        with psycopg.connect(world.url) as conn:
            dead = {
                (r[0], r[1])
                for r in conn.execute(
                    "SELECT consumer, message_id FROM inbox_messages WHERE status = 'dead'"
                )
            }
            outbox_ids = {r[0] for r in conn.execute("SELECT id FROM outbox_messages")}
        unclean = world.unclean_exits
        gap = _max_gap(world.url, stopped_at)
        takeover = world.takeover_seconds
        if world.moto is not None:
            notes.append(f"{world.restored} messages moto lost put back (see _moto_restore)")
    lost = duplicates = order = phantoms = 0
    for consumer in names:
        ids = [m for m, _, _ in applied[consumer]]
        lost += len(expected - set(ids))
        duplicates += len(ids) - len(set(ids))
        # a committed message is a row of the outbox (nothing is deleted here): any other id
        # applied is a phantom, a rolled-back message or one nobody wrote
        phantoms += len({m for m in ids if m not in outbox_ids})
        last: dict[str, int] = {}
        for _, key, seq in applied[consumer]:
            if seq <= last.get(key, 0):
                order += 1
            last[key] = seq
    dead_expected = sum(1 for c, m in dead if m in history.poison)
    dead_unexpected = len(dead) - dead_expected
    return Result(
        scenario=name,
        committed=len(committed),
        unknown_outcome=len(history.unknown),
        lost=lost,
        duplicates=duplicates,
        order_violations=order,
        phantoms=phantoms,
        dead_expected=dead_expected,
        dead_unexpected=dead_unexpected,
        recovery_seconds=round(recovered, 1),
        unclean_exits=unclean,
        notes="; ".join([
            *notes,
            f"{history.refused_oversized} oversized refused at publish",
            f"longest gap between sends {gap:.1f}s",
        ]),
        max_delivery_gap_seconds=round(gap, 2),
        takeover_seconds=round(takeover, 2),
    )


def _max_gap(url: str, until: Any) -> float:
    """The longest time between two messages sent to the broker while the producers ran: the
    relays stamp a row's published_at (the database's clock) as they send it. (The consumers'
    effects would hide a stall behind their backlog.)"""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT max(gap) FROM (SELECT extract(epoch FROM published_at - lag(published_at) "
            "OVER (ORDER BY published_at)) AS gap FROM outbox_messages "
            "WHERE published_at <= %s) AS g",
            (until,),
        ).fetchone()
    return float(row[0]) if row and row[0] is not None else float("nan")


def table(results: list[Result]) -> str:
    head = (
        "| scenario | committed | unknown outcome | lost | duplicate effects | order violations "
        "| phantoms | dead (expected / unexpected) | recovery s | faults injected |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [
        f"| {r.scenario} | {r.committed} | {r.unknown_outcome} | {r.lost} | {r.duplicates} | "
        f"{r.order_violations} | {r.phantoms} | {r.dead_expected} / {r.dead_unexpected} | "
        f"{r.recovery_seconds} | {r.notes} |"
        for r in results
    ]
    return "\n".join([head, *rows])


def as_json(results: list[Result]) -> str:
    return json.dumps([{**r.__dict__, "ok": r.ok} for r in results], indent=2)


if __name__ == "__main__":  # pragma: no cover - see run.py
    print(os.path.basename(__file__), "is a library: python -m tests.faults.run --help")
