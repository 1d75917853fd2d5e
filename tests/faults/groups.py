"""The fault suite's scale-out scenarios: N ordered consumer processes share one consumer name
(tests/support/scale_worker.py), fed by a relay process from a producer that commits all along,
and one process is killed (``kill -9``), added, or frozen (SIGSTOP) past the time the broker
or the lease gives it, then thawed (SIGCONT).

Kafka (``kafka-group-...``; a private tansu broker; a consumer group over a topic of 6
partitions): the bound is the group's session timeout, after which a silent member is dropped,
plus the join phase of the rebalance that follows (tansu holds it open for half the session
timeout: bench/kafka_join.py). Kafka with leases (``kafka-partitioned-...``; the same topic):
inbox.PartitionedConsumer processes, each partition's KafkaConsumer assigned its Kafka
partition (no group join) with its offsets in the database; the bound is the lease. NATS
(``nats-partitioned-...``; a private nats-server; the relay writes 6 partitioned subjects,
``[broker.partitions]``): inbox.PartitionedConsumer processes share the partitions through
leases in the consumer's database; the bound is the lease. The check
(tests/support/scale_out.py): every committed message applied once, each key in order, no
key's handler running in two processes at overlapping times; and the
**takeover**: from the fault until another process applied one of the keys the faulty one was
applying (its partitions were handed over; "every key": until all of those keys that came
again were), and for an added process until it applied its first message; asserted within
the bound + 1 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from outbox import publish
from outbox._migrate import upgrade
from tests.faults.infra import NatsServer, PgCluster, free_port
from tests.faults.suite import Result
from tests.support.scale_out import (
    SCHEMA,
    applied,
    check,
    joined_at,
    refusals,
    spawn,
    takeover,
)

CONSUMER, KEYS, PARTITIONS = "svc", 60, 6
#: the Kafka group's session timeout: a silent member is dropped after it
SESSION = 6.0
#: the partitioned NATS consumer's lease (inbox.Lease(duration=...)): a silent member's
#: partitions lapse after it
LEASE = 4.0
TOPIC = "orders"
#: the longest a partition may go without an owner, per broker: Kafka, the session timeout,
#: then the rebalance's join phase, which tansu holds open for half the session timeout
#: (bench/kafka_join.py); leases (Kafka or NATS), the lease (a dead member's leases lapse
#: after it)
BOUND = {"kafka": SESSION * 1.5, "kafka-partitioned": LEASE, "nats": LEASE}


class GroupWorld:
    """A private PostgreSQL cluster and broker, a relay, and the consumer processes.

    ``kafka``: tansu, a topic of PARTITIONS partitions, a consumer group.
    ``kafka-partitioned``: the same topic, read by inbox.PartitionedConsumer processes whose
    KafkaConsumers are each assigned one Kafka partition (leases in the database). ``nats``: a
    nats-server, a stream whose subjects ``orders.p0`` .. ``orders.p5`` the relay writes
    (``[broker.partitions]``), one durable JetStream consumer per partition, consumed by
    inbox.PartitionedConsumer processes sharing leases in the database."""

    def __init__(self, log_dir: Path, broker: str) -> None:
        self.log_dir, self.broker = log_dir, broker
        self.bound = BOUND[broker]
        self.pg = PgCluster()
        with psycopg.connect(self.pg.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE app")
        self.url = self.pg.url("app")
        upgrade(self.url)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(SCHEMA)
        self.kafka: subprocess.Popen[bytes] | None = None
        self.nats: NatsServer | None = None
        env: dict[str, str] = {}
        if broker in ("kafka", "kafka-partitioned"):
            relay_url = self._kafka()
        else:
            relay_url = self._nats()
            env = {"OUTBOX_BROKER_PARTITIONS": f"{TOPIC}={PARTITIONS}",
                   "OUTBOX_BROKER_DESTINATIONS": f"{TOPIC}={TOPIC}.p{{partition}}"}  # fmt: skip
        with open(log_dir / "relay.log", "ab") as out:
            self.relay = subprocess.Popen(
                [sys.executable, "-m", "outbox.cli", "relay", "--url", self.url, "--broker",
                 relay_url, "--poll-interval", "0.1", "--batch-size", "100"],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
            )  # fmt: skip
        self.workers: list[subprocess.Popen[bytes]] = []

    def _kafka(self) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        from tests.support.kafka_broker import launch

        port = free_port()
        self.kafka = launch(port)
        self.server = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": self.server})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(20)
        return f"kafka://{self.server}"

    def _nats(self) -> str:
        import asyncio

        import nats
        from nats.js.api import ConsumerConfig, StreamConfig

        self.nats = NatsServer()
        self.server = self.nats.url

        async def make() -> None:
            nc = await nats.connect(self.server)
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="ORDERS", subjects=[f"{TOPIC}.>"]))
            for p in range(PARTITIONS):  # a short ack_wait: a dead member's leftovers return
                await js.add_consumer("ORDERS", ConsumerConfig(
                    durable_name=f"{CONSUMER}-p{p}", filter_subject=f"{TOPIC}.p{p}",
                    ack_wait=2.0, ack_policy="explicit", max_ack_pending=1000,
                ))  # fmt: skip
            await nc.close()

        asyncio.run(make())
        return self.server

    def add_worker(self) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"worker{len(self.workers)}.log"
        # the database ends the session of a process frozen inside a transaction after the
        # bound, so its message's inbox row (its key) is free for the next owner by then
        idle = ["--idle-ms", str(int(self.bound * 1000))]
        if self.broker == "kafka":
            proc = spawn(self.url, "kafka", self.server, TOPIC, CONSUMER, log, 2,
                         int(SESSION * 1000), *idle)  # fmt: skip
        elif self.broker == "kafka-partitioned":
            proc = spawn(self.url, "kafka-partitioned", self.server, TOPIC, CONSUMER, log, 2,
                         6000, "--partitions", str(PARTITIONS), "--lease", str(LEASE),
                         *idle)  # fmt: skip
        else:
            proc = spawn(self.url, "nats-partitioned", self.server, "ORDERS", CONSUMER, log, 2,
                         6000, "--partitions", str(PARTITIONS), "--subject",
                         f"{TOPIC}.p{{partition}}", "--lease", str(LEASE), *idle)  # fmt: skip
        self.workers.append(proc)
        return proc

    def close(self) -> None:
        for proc in [self.relay, *self.workers]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)
        if self.kafka is not None:
            from tests.support.kafka_broker import stop

            stop(self.kafka)
        if self.nats is not None:
            self.nats.stop()
        self.pg.stop()


def _produce(url: str, topic: str, stop: threading.Event, committed: list[uuid.UUID]) -> None:
    """One message per commit, keys in turn, about 100 a second."""
    with psycopg.connect(url) as conn:
        n = 0
        while not stop.is_set():
            committed.append(publish(conn, topic=topic, key=f"k{n % KEYS}", payload={"n": n}))
            conn.commit()
            n += 1
            time.sleep(0.01)


@dataclass(frozen=True)
class Fault:
    """What a nemesis did: to which process, when (wall clock), and how it went."""

    pid: int
    at: float
    note: str
    added: bool = False


def _kill(world: GroupWorld, victim: subprocess.Popen[bytes]) -> Fault:
    at = time.time()
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    return Fault(victim.pid, at, "kill -9 of one of 3 processes")


def _add(world: GroupWorld, _victim: subprocess.Popen[bytes]) -> Fault:
    at = time.time()
    proc = world.add_worker()
    return Fault(proc.pid, at, "a third process added to 2", added=True)


def _pause(world: GroupWorld, victim: subprocess.Popen[bytes]) -> Fault:
    at = time.time()
    frozen = world.bound + 3.0
    victim.send_signal(signal.SIGSTOP)
    time.sleep(frozen)  # past the session timeout: the group drops it
    victim.send_signal(signal.SIGCONT)  # it wakes up holding partitions it no longer owns
    return Fault(victim.pid, at, f"SIGSTOP of one of 3 processes for {frozen:g}s, then SIGCONT")


@dataclass(frozen=True)
class GroupScenario:
    name: str
    nemesis: Callable[[GroupWorld, subprocess.Popen[bytes]], Fault]
    broker: str = "kafka"
    processes: int = 3


SCENARIOS = {
    s.name: s
    for s in (
        GroupScenario("kafka-group-consumer-kill-9", _kill),
        GroupScenario("kafka-group-consumer-added", _add, processes=2),
        GroupScenario("kafka-group-consumer-paused-past-session", _pause),
        GroupScenario("kafka-partitioned-consumer-kill-9", _kill, broker="kafka-partitioned"),
        GroupScenario("kafka-partitioned-consumer-added", _add, broker="kafka-partitioned",
                      processes=2),
        GroupScenario("kafka-partitioned-consumer-paused-past-lease", _pause,
                      broker="kafka-partitioned"),
        GroupScenario("nats-partitioned-consumer-kill-9", _kill, broker="nats"),
        GroupScenario("nats-partitioned-consumer-added", _add, broker="nats", processes=2),
        GroupScenario("nats-partitioned-consumer-paused-past-lease", _pause, broker="nats"),
    )
}
_BOUND = {"kafka": f"session timeout {SESSION:g}s and tansu's join wait",
          "kafka-partitioned": f"the lease, {LEASE:g}s", "nats": f"the lease, {LEASE:g}s"}
#: in CI's short set (tests/faults/test_faults_short.py)
SHORT = ("nats-partitioned-consumer-kill-9", "kafka-partitioned-consumer-kill-9")


def _all_working(world: GroupWorld, since: float) -> bool:
    pids = {w.pid for w in world.workers if w.poll() is None}
    return pids <= {r.pid for r in applied(world.url, CONSUMER) if r.started >= since}


def _settle(world: GroupWorld, committed: list[uuid.UUID], timeout: float) -> float:
    start = time.monotonic()
    want = set(committed)
    while time.monotonic() - start < timeout:
        if want <= {r.message_id for r in applied(world.url, CONSUMER)}:
            return time.monotonic() - start
        time.sleep(0.5)
    return float("nan")


def _takeover(world: GroupWorld, fault: Fault, timeout: float) -> tuple[float, float]:
    """Wait (while the producers run) until the takeover can be measured, and measure it:
    until another process applied one of the faulty one's keys, and all of them (an added
    process: until it applied its first message)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = applied(world.url, CONSUMER)
        if fault.added:  # from when it started to join (not counting its interpreter's start)
            mine = [r.started for r in rows if r.pid == fault.pid]
            since = joined_at(world.url, fault.pid)
            if mine and since is not None:
                return min(mine) - since, min(mine) - since
        else:
            first, last = takeover(rows, fault.pid, fault.at)
            if first == first and time.time() - fault.at > world.bound + 2.0:
                return first, last
        time.sleep(0.5)
    return float("nan"), float("nan")


def run(name: str, seconds: float, log_dir: Path) -> Result:
    """One scenario on fresh infrastructure: start the processes, let them all work, inject
    the fault, run on for ``seconds`` more, stop the producers, settle, check."""
    scenario = SCENARIOS[name]
    log_dir.mkdir(parents=True, exist_ok=True)
    world = GroupWorld(log_dir, scenario.broker)
    committed: list[uuid.UUID] = []
    stop = threading.Event()
    producer = threading.Thread(target=_produce, args=(world.url, TOPIC, stop, committed))
    try:
        for _ in range(scenario.processes):
            world.add_worker()
        began = time.time()
        producer.start()
        deadline = time.monotonic() + 90
        while not _all_working(world, began) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2.0)  # a steady state
        victim = world.workers[0]
        fault = scenario.nemesis(world, victim)
        took, every_key = _takeover(world, fault, timeout=60)
        time.sleep(max(0.0, seconds - (time.time() - fault.at)))
        stop.set()
        producer.join(30)
        recovered = _settle(world, committed, timeout=120)
        rows = applied(world.url, CONSUMER)
        refused = refusals(world.url, CONSUMER)
    finally:
        stop.set()
        world.close()
    result = check(rows, committed)
    per = ", ".join(str(n) for n in result.per_process.values())
    return Result(
        scenario=name, committed=len(committed), unknown_outcome=0, lost=result.lost,
        duplicates=result.duplicates, order_violations=result.order_violations, phantoms=0,
        dead_expected=0, dead_unexpected=0, recovery_seconds=round(recovered, 1),
        overlaps=result.overlaps, takeover_seconds=round(took, 2),
        notes=(f"{fault.note}; takeover {took:.1f}s, every key {every_key:.1f}s (bound "
               f"{world.bound:g}s: {_BOUND[scenario.broker]}); "
               f"applies per process {per}; {result.overlaps} overlapping applies of a key; "
               f"{refused} out-of-order refusals"),
    )  # fmt: skip
