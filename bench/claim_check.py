"""Claim check and CloudEvents, issue 41. Writes bench/results/claim_check.json.

    python bench/claim_check.py [--quick]

(a) A 5 MiB payload end to end, on NATS JetStream and on SQS (moto's server, with S3 on the
    same server): the relay and the consumer run (in this process, as in the tests); five
    payloads are committed in one transaction; the clock runs from the commit to the last
    handler's commit. Per message: upload, reference, publish, fetch, SHA-256 check, apply.
(b) The claim check's cost per message: the relay's upload (``store.put``) and the consumer's
    fetch and check (``ClaimCheckResolver.resolve``), per payload size, on moto's S3 and on a
    local directory. moto keeps objects in its Python process: real S3's figures differ (a
    round trip over the network), these say what the library adds around the store.
(c) The relay's rate with CloudEvents on vs our own format: the same backlog (rows committed
    first) drained by one in-process relay through the NATS adapter, alternating the two formats
    (A/B/A/B...), median of each; and the wire encoding alone (µs a message).

Sized for 2 cores; the figures are noisy on a shared machine (load average recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import statistics
import sys
import tempfile
import time
import timeit
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.common import write_result
from bench.relay_e2e import create_db, drop_db, fill
from inbox import AsyncHandlerRunner, ClaimCheckResolver, NatsConsumer, SqsConsumer
from inbox.testing import ResultLog
from outbox import Message, publish_batch
from outbox.claimcheck import CONTENT_TYPE, ClaimCheck, DirectoryStore, S3Store
from outbox.envelope import Envelope
from outbox.wire import nats as nats_wire
from outbox.wire.cloudevents import CloudEvents
from relay import ClaimCheckPublisher, Relay, RelayConfig
from relay.brokers import publisher_for_url

MIB = 1024 * 1024
CE = CloudEvents(source="//bench.example.com")


def _config(url: str) -> RelayConfig:
    return RelayConfig(database_url=url, poll_interval=0.05, publish_timeout=30,
                       lease_seconds=60)  # fmt: skip


def _moto() -> tuple[Any, str]:
    from tests.support import aws_server

    return aws_server, aws_server.endpoint()


def _bucket() -> S3Store:
    aws, endpoint = _moto()
    name = f"bench-{uuid.uuid4().hex[:8]}"
    aws.client("s3").create_bucket(Bucket=name)
    return S3Store(name, region=aws.REGION, endpoint_url=endpoint)


# ---- (a) 5 MiB end to end ---------------------------------------------------------------------


async def _e2e(broker: str, n: int) -> dict[str, Any]:
    name, url = create_db()
    store = _bucket()
    cleanup: list[Any] = []
    try:
        if broker == "nats":
            import nats

            nc = await nats.connect("nats://127.0.0.1:4222")
            js = nc.jetstream()
            stream, subject = f"BENCH_{uuid.uuid4().hex[:8]}", f"bench.{uuid.uuid4().hex[:8]}"
            await js.add_stream(name=stream, subjects=[subject])
            cleanup.append(nc.close)  # run in reverse: the stream is deleted first
            cleanup.append(lambda: js.delete_stream(stream))
            inner = publisher_for_url("nats://127.0.0.1:4222", destinations={"*": subject})

            def consumer(runner: AsyncHandlerRunner, **kw: Any) -> Any:
                return NatsConsumer(runner, stream=stream, durable="b", subject=subject, **kw)
        else:
            aws, endpoint = _moto()
            sqs = aws.client("sqs")
            qname = f"bench-{uuid.uuid4().hex[:8]}.fifo"
            qurl = sqs.create_queue(QueueName=qname, Attributes={"FifoQueue": "true"})["QueueUrl"]
            inner = publisher_for_url(f"sqs://{aws.REGION}?endpoint={endpoint}",
                                      destinations={"*": qname}, ack_timeout=8)  # fmt: skip

            def consumer(runner: AsyncHandlerRunner, **kw: Any) -> Any:
                return SqsConsumer(runner, queue=qurl, endpoint_url=endpoint, wait_seconds=1, **kw)

        log = ResultLog()

        async def handler(conn: Any, env: Any) -> None:
            assert len(env.payload) > 5 * MIB

        pub = ClaimCheckPublisher(inner, ClaimCheck(store, threshold=256 * 1024))
        async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer="bench", ordered=True)
            cons = consumer(runner, on_result=log, claim_check=ClaimCheckResolver(store))
            task = asyncio.create_task(cons.run())
            await asyncio.wait_for(cons.ready.wait(), 30)
            relay = Relay(_config(url), pub)
            relay_task = asyncio.create_task(relay.run())
            blob = "x" * (5 * MIB)
            msgs = [Message("docs", f"k{i}", {"n": i, "blob": blob}) for i in range(n)]
            with psycopg.connect(url) as conn:
                ids = publish_batch(conn, msgs, max_payload_bytes=8 * MIB)
                conn.commit()
            start = time.perf_counter()
            await log.wait_processed(ids, within=300)
            took = time.perf_counter() - start
            relay.stop()
            await relay_task
            cons.stop()
            await task
        return {"broker": broker, "messages": n, "payload_bytes": 5 * MIB + 17,
                "seconds": round(took, 3), "seconds_per_message": round(took / n, 3),
                "MiB_per_second": round(n * 5 / took, 1)}  # fmt: skip
    finally:
        for step in reversed(cleanup):
            await step()
        drop_db(name)


# ---- (b) the claim check's cost per message ---------------------------------------------------


def _store_cost(store: Any, size: int, reps: int) -> dict[str, Any]:
    claim = ClaimCheck(store, threshold=0)
    resolver = ClaimCheckResolver(store, max_download_bytes=64 * MIB)
    payload = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    uploads, fetches, hashes = [], [], []
    for _ in range(reps):
        env = Envelope(uuid.uuid4(), "docs", "k", 1, payload)
        key = claim.object_key(env)
        t0 = time.perf_counter()
        hashlib.sha256(payload).hexdigest()
        t1 = time.perf_counter()
        store.put(key, payload, "application/octet-stream")
        t2 = time.perf_counter()
        ref = claim.reference(env, key)
        reference = Envelope(env.id, "docs", "k", 1, ref.to_bytes(), CONTENT_TYPE)
        resolved = asyncio.run(resolver.resolve(reference))
        t3 = time.perf_counter()
        assert resolved.payload == payload
        hashes.append(t1 - t0)
        uploads.append(t2 - t1)
        fetches.append(t3 - t2)
    ms = lambda xs: round(statistics.median(xs) * 1000, 2)  # noqa: E731
    return {"store": store.kind, "payload_bytes": size, "reps": reps,
            "sha256_ms": ms(hashes), "relay_upload_ms": ms(uploads),
            "consumer_fetch_and_verify_ms": ms(fetches)}  # fmt: skip


# ---- (c) CloudEvents on vs our format ---------------------------------------------------------


async def _drain(url: str, subject: str, cloudevents: CloudEvents | None) -> float:
    pub = publisher_for_url("nats://127.0.0.1:4222", destinations={"*": subject},
                            cloudevents=cloudevents)  # fmt: skip
    relay = Relay(_config(url), pub)
    with psycopg.connect(url) as conn:
        n = conn.execute("SELECT count(*) FROM outbox_messages").fetchone()[0]  # type: ignore[index]
    start = time.perf_counter()
    task = asyncio.create_task(relay.run())
    while True:
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT count(*) FROM outbox_messages "
                                "WHERE status <> 'published'").fetchone()[0]  # type: ignore[index]  # fmt: skip
        if not left:
            break
        await asyncio.sleep(0.02)
    took = time.perf_counter() - start
    relay.stop()
    await task
    return float(n) / took


async def _ce_rate(n: int, rounds: int) -> dict[str, Any]:
    import nats

    nc = await nats.connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    rates: dict[str, list[float]] = {"ours": [], "cloudevents": []}
    try:
        for r in range(rounds):
            for fmt in (("ours", "cloudevents") if r % 2 == 0 else ("cloudevents", "ours")):
                stream, subject = f"CEB_{uuid.uuid4().hex[:8]}", f"ceb.{uuid.uuid4().hex[:8]}"
                await js.add_stream(name=stream, subjects=[subject])
                name, url = create_db()
                try:
                    fill(url, "orders", n, 1000)
                    rate = await _drain(url, subject, CE if fmt == "cloudevents" else None)
                    rates[fmt].append(round(rate))
                finally:
                    drop_db(name)
                    await js.delete_stream(stream)
    finally:
        await nc.close()
    ours, ce = statistics.median(rates["ours"]), statistics.median(rates["cloudevents"])
    return {"messages": n, "rounds": rounds, "rates_msg_per_s": rates, "median_ours": ours,
            "median_cloudevents": ce, "ratio": round(ce / ours, 3)}  # fmt: skip


async def _adapter_rate(n: int, rounds: int) -> dict[str, Any]:
    """The NATS adapter's publish_batch alone (no database), CloudEvents vs ours, alternated."""
    import nats

    nc = await nats.connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    rates: dict[str, list[float]] = {"ours": [], "cloudevents": []}
    try:
        for r in range(rounds):
            for fmt in (("ours", "cloudevents") if r % 2 == 0 else ("cloudevents", "ours")):
                stream, subject = f"CEA_{uuid.uuid4().hex[:8]}", f"cea.{uuid.uuid4().hex[:8]}"
                await js.add_stream(name=stream, subjects=[subject])
                ce = CE if fmt == "cloudevents" else None
                pub = publisher_for_url("nats://127.0.0.1:4222", destinations={"*": subject},
                                        cloudevents=ce)  # fmt: skip
                await pub.start()
                now = dt.datetime.now(dt.UTC)
                envs = [Envelope(uuid.uuid4(), "orders", f"k{i % 1000}", i // 1000 + 1,
                                 b'{"order": 123, "note": "' + b"x" * 150 + b'"}',
                                 headers={"tenant": "acme"}, created_at=now)
                        for i in range(n)]  # fmt: skip
                start = time.perf_counter()
                for i in range(0, n, 1000):
                    assert not any(await pub.publish_batch(envs[i : i + 1000]))
                rates[fmt].append(round(n / (time.perf_counter() - start)))
                await pub.close()
                await js.delete_stream(stream)
    finally:
        await nc.close()
    ours, ce = statistics.median(rates["ours"]), statistics.median(rates["cloudevents"])
    return {"messages": n, "rounds": rounds, "rates_msg_per_s": rates, "median_ours": ours,
            "median_cloudevents": ce, "ratio": round(ce / ours, 3)}  # fmt: skip


def _encode_cost() -> dict[str, Any]:
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    env = Envelope(uuid.uuid4(), "orders", "k1", 42, b'{"order": 123}', headers={"t": "a"},
                   traceparent=trace)  # fmt: skip
    n = 200_000
    ours = min(timeit.repeat(lambda: nats_wire.encode(env), number=n, repeat=5)) / n
    ce = min(timeit.repeat(lambda: nats_wire.encode(env, CE), number=n, repeat=5)) / n
    return {"nats_encode_us_ours": round(ours * 1e6, 2),
            "nats_encode_us_cloudevents": round(ce * 1e6, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and rounds")
    quick = parser.parse_args().quick
    result: dict[str, Any] = {"description": {
        "a": "5 MiB payloads end to end (commit -> last handler commit), claim check via "
             "moto's S3, relay and consumer in one process",
        "b": "claim check cost per message: SHA-256, the relay's upload, the consumer's fetch "
             "and check; median; moto's S3 (in-process server, not AWS) and a local directory",
        "c": "relay drain rate through the NATS adapter, CloudEvents binary mode vs our "
             "format, A/B alternated, median; the NATS adapter's publish_batch alone (no "
             "database), A/B alternated; and the NATS wire encoding alone",
    }}  # fmt: skip
    result["a_5mib_end_to_end"] = [asyncio.run(_e2e(b, 3 if quick else 5))
                                   for b in ("nats", "sqs")]  # fmt: skip
    print(result["a_5mib_end_to_end"], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        stores = [_bucket(), DirectoryStore(tmp)]
        result["b_cost_per_message"] = [
            _store_cost(store, size, 5 if quick else 15)
            for store in stores for size in (256 * 1024, MIB, 5 * MIB)
        ]  # fmt: skip
    print(result["b_cost_per_message"], flush=True)
    result["c_cloudevents_rate"] = asyncio.run(_ce_rate(10_000 if quick else 20_000,
                                                        2 if quick else 6))  # fmt: skip
    result["c_adapter_rate"] = asyncio.run(_adapter_rate(20_000, 4 if quick else 10))
    result["c_encode"] = _encode_cost()
    print(result["c_cloudevents_rate"], result["c_adapter_rate"], result["c_encode"], flush=True)
    print(write_result("claim_check", result))


if __name__ == "__main__":
    main()
