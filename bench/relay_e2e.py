"""(c)-(e) of issue 3: the relay end to end against a live broker. Used by ``bench/relay.py``.

Every relay runs in its own process (``multiprocessing``, spawn), as ``outbox relay`` would,
through the broker adapter chosen by URL. The bench process only prepares the database, starts
the clock and watches.

* :func:`drain` (c, e): rows are committed to the outbox first; then the relays start at once
  and the rate is messages / (last ``published_at`` - start). Every relay counts what its broker
  acknowledged and how many marks were fenced, so "each message published once" is checked
  from the relays' side, not only from the broker (whose dedup would hide a second publish).
* :func:`latency` (d): producer threads in another process commit one message per transaction
  with ``outbox.publish`` at a fixed total rate; a NATS subscriber records when each message
  reaches the broker; latency = arrival - the producer's clock right after ``commit()``.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import statistics
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import psycopg
from psycopg import sql

from outbox import Message, publish, publish_batch
from outbox._migrate import upgrade
from outbox.envelope import Envelope
from relay.brokers.base import BrokerFeatures

ADMIN = os.environ.get("OUTBOX_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
PAYLOAD = {"order": 123, "amount": "19.99", "note": "x" * 150}
_CTX = mp.get_context("spawn")
#: the broker "URL" of a relay (or naive relay) that publishes nothing: its database side alone
NOOP = "noop"


# ---- databases -------------------------------------------------------------------------------


def create_db(*, capture: bool = False) -> tuple[str, str]:
    """A fresh, migrated database: (name, url); with ``capture``, in 'wal' capture mode (the
    server needs wal_level = logical)."""
    name = f"outbox_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = ADMIN.rsplit("/", 1)[0] + "/" + name
    upgrade(url)
    if capture:
        from relay.admin import enable_capture

        enable_capture(url, slot=f"bench_{name}")
    return name, url


def drop_db(name: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE database = %s",
            [name],
        )
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


class NoopPublisher:
    """A publisher that acknowledges everything at once: the relay's database side alone."""

    features = BrokerFeatures("noop", 0.0, True, True, 0)

    def __init__(self) -> None:
        self.count = 0

    async def start(self) -> None:
        pass

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        self.count += len(envelopes)
        return [None] * len(envelopes)

    async def close(self) -> None:
        pass


def fill(url: str, topic: str, n: int, keys: int) -> None:
    """Commit ``n`` messages over ``keys`` keys (round robin), 1000 per transaction."""
    with psycopg.connect(url) as conn:
        for start in range(0, n, 1000):
            msgs = [
                Message(topic, f"k{i % keys}", PAYLOAD, headers={"tenant": "acme"})
                for i in range(start, min(n, start + 1000))
            ]
            publish_batch(conn, msgs, wakeup=False)
            conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox_messages")  # autovacuum may be off: fresh stats


def numbered(url: str) -> None:
    """Number what the ledger holds into outbox_messages, as a relay's ledger reader does
    (relay/_ledger.py): the rows a naive writer would have inserted there itself."""
    from relay import RelayConfig
    from relay._ledger import record_ledger
    from relay._statements import relay_statements

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            config = RelayConfig(url, batch_size=5000)
            await record_ledger(conn, relay_statements(None), config)

    asyncio.run(go())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox_messages")


# ---- one relay process -----------------------------------------------------------------------


class _Counting:
    """Wraps the adapter: counts acknowledged and failed messages, notes when the last
    acknowledgement came (wall clock); starts the adapter once."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.features = inner.features
        self.acked = 0
        self.failed = 0
        self.last_ack = 0.0
        self._started = False

    async def start(self) -> None:
        if not self._started:
            await self.inner.start()
            self._started = True

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        results = await self.inner.publish_batch(envelopes)
        ok = sum(r is None for r in results)
        if ok:
            self.last_ack = time.time()
        self.acked += ok
        self.failed += len(results) - ok
        return results

    async def close(self) -> None:
        await self.inner.close()
        self._started = False


async def _relay_main(
    url: str, broker: str, settings: Mapping[str, Any], go: MpEvent, stop: MpEvent, out: Any,
    options: Mapping[str, Any] | None = None,
) -> None:  # fmt: skip
    from prometheus_client import CollectorRegistry

    from relay import Relay, RelayConfig
    from relay._metrics import RelayMetrics
    from relay.brokers import publisher_for_url

    # "noop": a publisher that acknowledges at once, the relay's database side alone
    pub = _Counting(
        NoopPublisher() if broker == NOOP else publisher_for_url(broker, **(options or {}))
    )
    await pub.start()  # connecting is not part of the measured time
    registry = CollectorRegistry()
    relay = Relay(RelayConfig(database_url=url, **settings), pub, metrics=RelayMetrics(registry))
    out.put(("ready", os.getpid()))
    await asyncio.to_thread(go.wait)
    task = asyncio.create_task(relay.run())
    await asyncio.to_thread(stop.wait)
    relay.stop()
    await task
    fenced = registry.get_sample_value("outbox_relay_fenced_total") or 0.0
    out.put(("done", {"acked": pub.acked, "failed": pub.failed, "fenced": int(fenced),
                      "last_ack": pub.last_ack}))  # fmt: skip


def _relay_process(
    url: str, broker: str, settings: Mapping[str, Any], go: MpEvent, stop: MpEvent, out: Any,
    options: Mapping[str, Any] | None = None,
) -> None:  # fmt: skip
    asyncio.run(_relay_main(url, broker, settings, go, stop, out, options))


@dataclass
class Relays:
    """``count`` relay processes, started, waiting for :meth:`go`."""

    url: str
    broker: str
    count: int = 1
    settings: Mapping[str, Any] | None = None
    #: the adapter's options (publisher_for_url's keyword arguments)
    options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        self._go = _CTX.Event()
        self._stop = _CTX.Event()
        self._out: Any = _CTX.Queue()
        settings = {"poll_interval": 0.5, **(self.settings or {})}
        self._procs = [
            _CTX.Process(
                target=_relay_process,
                args=(
                    self.url, self.broker, settings, self._go, self._stop, self._out, self.options
                ),
                daemon=True,
            )
            for _ in range(self.count)
        ]
        for p in self._procs:
            p.start()
        for _ in self._procs:
            kind, _pid = self._out.get(timeout=60)
            assert kind == "ready", kind

    def go(self) -> float:
        """Let every relay start; returns the wall-clock start."""
        started = time.time()
        self._go.set()
        return started

    def stop(self) -> list[dict[str, int]]:
        """Stop every relay (SIGTERM-like: finish in-flight work); their counts."""
        self._stop.set()
        self._go.set()
        reports = []
        for _ in self._procs:
            kind, report = self._out.get(timeout=60)
            assert kind == "done", kind
            reports.append(report)
        for p in self._procs:
            p.join(30)
        return reports


# ---- (c) and (e): drain a pre-written backlog ------------------------------------------------


def _pending(conn: psycopg.Connection[Any], n: int) -> bool:
    """Messages not published yet: rows not marked, or (in 'wal' mode, where the relay writes
    the rows as it publishes them) fewer than ``n`` published rows."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status <> 'published'), "
        "count(*) FILTER (WHERE status = 'published') FROM outbox_messages"
    ).fetchone()
    assert row is not None
    return bool(row[0]) or row[1] < n


def _last_published(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute("SELECT extract(epoch FROM max(published_at)) FROM outbox_messages")
    value = row.fetchone()
    assert value is not None
    assert value[0] is not None
    return float(value[0])


def rate_row(n: int, keys: int, took: float, **extra: Any) -> dict[str, Any]:
    """The common fields of a drain result: size, time and rate, then ``extra``."""
    return {"messages": n, "keys": keys, **extra, "seconds": round(took, 3),
            "msg_per_s": round(n / took)}  # fmt: skip


def wait_drained(url: str, started: float, timeout: float, n: int) -> float:
    """Seconds from ``started`` (wall clock) to the last ``published_at`` once all ``n`` are
    published.

    One connection, polled every 50 ms: the watcher shares the two cores with the relay.
    """
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while _pending(conn, n):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the relay did not drain the outbox within {timeout}s")
            time.sleep(0.05)
        return _last_published(conn) - started


def drain(
    broker: str,
    topic: str,
    n: int,
    *,
    keys: int = 1000,
    relays: int = 1,
    settings: Mapping[str, Any] | None = None,
    timeout: float = 300.0,
    capture: bool = False,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Commit ``n`` messages, then let ``relays`` relay processes publish them all; the rate.
    With ``capture``, in 'wal' capture mode: the messages wait in the slot."""
    name, url = create_db(capture=capture)
    try:
        fill(url, topic, n, keys)
        group = Relays(url, broker, relays, settings, options)
        started = group.go()
        try:
            took = wait_drained(url, started, timeout, n)
        finally:
            reports = group.stop()
    finally:
        drop_db(name)
    # In 'wal' mode a batch's rows are written while the broker confirms it: its last ack may
    # come after the last published_at (the batch commits only after both).
    took = max(took, max(r["last_ack"] for r in reports) - started)
    acked = sum(r["acked"] for r in reports)
    return {
        **rate_row(n, keys, took, relays=relays),
        "acked_by_broker": acked,
        "failed": sum(r["failed"] for r in reports),
        "fenced_marks": sum(r["fenced"] for r in reports),
        "per_relay_acked": [r["acked"] for r in reports],
        "each_published_once": acked == n,
    }


async def stream_check(js: Any, stream: str, subject: str) -> dict[str, Any]:
    """Read a JetStream stream back: message count, duplicates, per-key order."""
    sub = await js.pull_subscribe(subject, durable=None, stream=stream)
    seen: set[str] = set()
    last: dict[str, int] = {}
    dupes = order_breaks = total = 0
    while True:
        try:
            msgs = await sub.fetch(1000, timeout=2)
        except TimeoutError:
            break
        for msg in msgs:
            await msg.ack()
            env = Envelope.from_headers(msg.headers or {}, msg.data)
            total += 1
            if str(env.id) in seen:
                dupes += 1
            seen.add(str(env.id))
            if env.seq != last.get(env.key, 0) + 1:
                order_breaks += 1
            last[env.key] = env.seq
    await sub.unsubscribe()
    return {
        "stream_messages": total,
        "distinct_ids": len(seen),
        "duplicates_in_stream": dupes,
        "per_key_order_breaks": order_breaks,
    }


# ---- a naive NATS relay, for reference (c') -------------------------------------------------

# What a relay written in an afternoon does: the oldest pending rows by id, locked in a
# transaction held open while they are published, marked published, committed. No per-key
# claim (a second instance or a late commit breaks key order), no leases, no retries, no dead
# letters; default durability. The same envelope headers as the adapter sends.
_NAIVE_CLAIM = """
SELECT id, topic, key, seq, payload, content_type, headers, traceparent, created_at
FROM outbox_messages WHERE status = 'pending' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
"""
_NAIVE_MARK = """
UPDATE outbox_messages SET status = 'published', published_at = clock_timestamp()
WHERE id = ANY(%s)
"""


async def _naive_main(url: str, nats_url: str, batch: int, go: MpEvent, out: Any) -> None:
    import nats

    noop = nats_url == NOOP  # the naive relay's database side alone
    nc = None if noop else await nats.connect(nats_url)
    js = None if nc is None else nc.jetstream()
    conn = await psycopg.AsyncConnection.connect(url)
    out.put(("ready", os.getpid()))
    await asyncio.to_thread(go.wait)
    acked = 0
    try:
        while True:
            async with conn.transaction():
                rows = await (await conn.execute(_NAIVE_CLAIM, [batch])).fetchall()
                if not rows:
                    break
                acks = []
                if js is None:
                    acked += len(rows)
                    await conn.execute(_NAIVE_MARK, [[r[0] for r in rows]])
                    continue
                for id_, topic, key, seq, payload, ctype, headers, tparent, created in rows:
                    env = Envelope(id_, topic, key, seq, bytes(payload), ctype, headers or {},
                                   tparent, created)  # fmt: skip
                    wire = env.to_headers()
                    wire["Nats-Msg-Id"] = wire["outbox-id"]
                    acks.append(await js.publish_async(topic, env.payload, headers=wire))
                await asyncio.gather(*acks)
                acked += len(acks)
                await conn.execute(_NAIVE_MARK, [[r[0] for r in rows]])
    finally:
        await conn.close()
        if nc is not None:
            await nc.close()
    out.put(("done", {"acked": acked, "failed": 0, "fenced": 0}))


def _naive_process(url: str, nats_url: str, batch: int, go: MpEvent, out: Any) -> None:
    asyncio.run(_naive_main(url, nats_url, batch, go, out))


def naive_drain(nats_url: str, topic: str, n: int, *, keys: int = 1000, batch: int = 1000,
                timeout: float = 300.0) -> dict[str, Any]:  # fmt: skip
    """Commit ``n`` rows, then let one naive relay process publish them all; the rate."""
    name, url = create_db()
    try:
        fill(url, topic, n, keys)
        numbered(url)  # a naive writer's rows: the table the naive relay reads
        go, out = _CTX.Event(), _CTX.Queue()
        proc = _CTX.Process(target=_naive_process, args=(url, nats_url, batch, go, out))
        proc.start()
        try:
            kind, _pid = out.get(timeout=60)
            assert kind == "ready", kind
            started = time.time()
            go.set()
            took = wait_drained(url, started, timeout, n)
            kind, report = out.get(timeout=60)
            assert kind == "done", kind
        finally:
            go.set()
            proc.join(30)
    finally:
        drop_db(name)
    return rate_row(n, keys, took, batch=batch) | {"acked_by_broker": report["acked"]}


# ---- (d) commit -> broker latency at a steady rate -------------------------------------------


def _producer_thread(
    url: str, topic: str, rate: float, seconds: float, start: float, out: list[tuple[str, float]]
) -> None:
    interval = 1.0 / rate
    rng = random.Random()
    with psycopg.connect(url) as conn:
        i = 0
        while True:
            due = start + i * interval
            if due - start >= seconds:
                break
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            msg_id = publish(conn, topic=topic, key=f"k{rng.randrange(100)}", payload=PAYLOAD)
            conn.commit()
            out.append((str(msg_id), time.time()))
            i += 1


def _producers(url: str, topic: str, rate: float, seconds: float, threads: int, q: Any) -> None:
    start = time.time() + 0.5
    results: list[list[tuple[str, float]]] = [[] for _ in range(threads)]
    workers = [
        threading.Thread(
            target=_producer_thread,
            args=(url, topic, rate / threads, seconds, start + k / rate, results[k]),
        )
        for k in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    q.put([item for r in results for item in r])


def _percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def latency(
    nats_url: str,
    subject_topic: str,
    *,
    rate: float = 1000.0,
    seconds: float = 20.0,
    warmup: float = 2.0,
    threads: int = 4,
    settings: Mapping[str, Any] | None = None,
    capture: bool = False,
) -> dict[str, Any]:
    """Commit -> NATS arrival latency at a steady ``rate`` msg/s (one message per commit)."""
    import nats

    name, url = create_db(capture=capture)
    arrivals: dict[str, float] = {}
    nc = await nats.connect(nats_url)

    async def on_msg(msg: Any) -> None:
        arrivals[(msg.headers or {}).get("Nats-Msg-Id", "")] = time.time()

    try:
        await nc.subscribe(subject_topic, cb=on_msg, pending_msgs_limit=1_000_000)
        group = Relays(url, nats_url, 1, settings)
        group.go()
        q: Any = _CTX.Queue()
        prod = _CTX.Process(target=_producers, args=(url, subject_topic, rate, seconds, threads, q))
        prod.start()
        commits: list[tuple[str, float]] = await asyncio.to_thread(q.get, True, seconds + 120)
        await asyncio.to_thread(prod.join, 30)
        deadline = time.monotonic() + 30
        while len(arrivals) < len(commits) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        reports = group.stop()
    finally:
        await nc.close()
        drop_db(name)
    first = min(t for _, t in commits)
    measured = [(i, t) for i, t in commits if t - first >= warmup]
    lat_ms = [(arrivals[i] - t) * 1000 for i, t in measured if i in arrivals]
    span = max(t for _, t in commits) - first
    return {
        "target_rate_msg_per_s": rate,
        "achieved_commit_rate_msg_per_s": round(len(commits) / span),
        "producer_threads": threads,
        "seconds": seconds,
        "warmup_seconds_excluded": warmup,
        "messages_measured": len(measured),
        "arrived": len(lat_ms),
        "p50_ms": round(_percentile(lat_ms, 50), 2),
        "p90_ms": round(_percentile(lat_ms, 90), 2),
        "p99_ms": round(_percentile(lat_ms, 99), 2),
        "max_ms": round(max(lat_ms), 2),
        "mean_ms": round(statistics.fmean(lat_ms), 2),
        "relay": reports[0],
    }
