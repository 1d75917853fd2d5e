"""Amazon SQS on moto's server (``moto[server]``, on a free port), side by side in one run.
Writes bench/results/sqs.json.

    python bench/sqs.py

(a) the raw client: boto3's ``send_message_batch``, the same envelopes encoded with
``outbox.wire.sqs`` (the same body, attributes, group and dedup ids), ten per call in input
order, the calls spread over ``CONCURRENCY`` threads (boto3 clients are thread-safe; boto3 has
no asyncio API); (b) the relay's adapter, ``SqsPublisher.publish_batch`` over the same
messages in batches of 1,000, with the same ``concurrency``. Rounds alternate (a) and (b), each
on a fresh FIFO queue (moto's cost per message grows with the queue's depth, so every round
starts empty), and the same again on standard queues; the medians and the ratios are reported.
(c) the relay end to end: ``PIPELINE`` rows committed first, then one relay process (``sqs://``)
publishes them all to a fresh queue; (d) the pipeline: the same kind of backlog, one relay
process and, in this process, an ordered ``SqsConsumer`` with ``Batching(size=10, workers=2)``
and the inbox (a no-op handler: the inbox's record is the work) running together; rate =
messages / (last commit seen by ``on_result`` - start), each message checked processed once.
(c) and (d) on a FIFO queue and on a standard one.
moto runs on this machine and takes most of the CPU: the figures compare the two clients, they
say nothing of AWS's own throughput (SQS FIFO: 300 calls/s per group-less partition, more
with high-throughput mode).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import relay_e2e  # noqa: E402
from bench.common import write_result  # noqa: E402
from bench.relay import adapter_rate, envelopes  # noqa: E402

MESSAGES = 500
ROUNDS = 5
CONCURRENCY = 16
#: messages of (c) and (d); keys
PIPELINE, PIPELINE_KEYS = 500, 50
#: (c) and (d): a relay's settings and its adapter's, with room for moto's slow calls (seconds
#: each once a queue holds a few hundred messages on a busy machine); the raw client's (a) and
#: the adapter's (b) calls have no timeout that could end them
RELAY_SETTINGS = {"publish_timeout": 50.0, "lease_seconds": 60.0}
ADAPTER_OPTIONS = {"timeout": 40.0, "call_timeout": 30.0, "concurrency": CONCURRENCY}


def raw_sqs(envs: list[Any], client: Any, url: str, fifo: bool) -> float:
    """(a): boto3 alone, ten messages a call, ``CONCURRENCY`` calls in flight."""
    from outbox.wire import sqs as wire

    def send(chunk: list[Any]) -> None:
        entries = []
        for n, env in enumerate(chunk):
            msg = wire.encode(env)
            entry: dict[str, Any] = {"Id": str(n), "MessageBody": msg.body,
                                     "MessageAttributes": msg.attributes}  # fmt: skip
            if fifo:
                entry["MessageGroupId"] = msg.group_id
                entry["MessageDeduplicationId"] = msg.deduplication_id
            entries.append(entry)
        response = client.send_message_batch(QueueUrl=url, Entries=entries)
        assert not response.get("Failed"), response["Failed"][:3]

    chunks = [envs[i : i + 10] for i in range(0, len(envs), 10)]
    began = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(send, chunks))
    return len(envs) / (time.perf_counter() - began)


async def _pipeline(url: str, broker_url: str, queue_url: str, endpoint: str, n: int) -> float:
    from psycopg_pool import AsyncConnectionPool

    from inbox import AsyncHandlerRunner, Batching, SqsConsumer

    last = [0.0]

    async def handler(conn: Any, env: Any) -> None:
        pass

    def seen(env: Any, result: Any) -> None:
        last[0] = time.time()

    async with AsyncConnectionPool(url, min_size=2, max_size=4, open=False) as pool:
        runner = AsyncHandlerRunner(pool, handler, consumer="bench", ordered=True)
        consumer = SqsConsumer(
            runner, queue=queue_url, endpoint_url=endpoint, wait_seconds=1,
            visibility_timeout=60, receivers=2, redeliver_delay=0.2, on_result=seen,
            batching=Batching(size=10, wait=0.01, workers=2),
        )  # fmt: skip
        task = asyncio.create_task(consumer.run())
        await asyncio.wait_for(consumer.ready.wait(), 30)
        group = relay_e2e.Relays(url, broker_url, 1, RELAY_SETTINGS, ADAPTER_OPTIONS)
        started = group.go()
        try:
            while True:
                await asyncio.sleep(0.2)
                async with pool.connection() as conn:
                    cur = await conn.execute(
                        "SELECT count(*) FROM inbox_messages WHERE consumer = 'bench' "
                        "AND status = 'processed'"
                    )
                    row = await cur.fetchone()
                if row is not None and row[0] >= n:
                    break
                if time.time() - started > 600:
                    raise TimeoutError("the pipeline did not finish in 600 s")
        finally:
            group.stop()
            consumer.stop()
            await task
    return n / (last[0] - started)


def pipeline(sqs: Any, endpoint: str, name: str, fifo: bool, n: int) -> dict[str, Any]:
    """(d): a relay process and the batched ordered consumer on one backlog."""
    import tests.support.aws_server as aws_server

    attributes = {"FifoQueue": "true"} if fifo else {}
    queue_url = str(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])
    db, url = relay_e2e.create_db()
    try:
        relay_e2e.fill(url, "orders", n, PIPELINE_KEYS)
        broker = f"sqs://{aws_server.REGION}?endpoint={endpoint}&destination={name}"
        rate = asyncio.run(_pipeline(url, broker, queue_url, endpoint, n))
        import psycopg

        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*), count(DISTINCT message_id) FROM inbox_messages "
                "WHERE consumer = 'bench' AND status = 'processed'"
            ).fetchone()
    finally:
        relay_e2e.drop_db(db)
        sqs.delete_queue(QueueUrl=queue_url)
    assert row is not None
    return {"messages": n, "keys": PIPELINE_KEYS, "msg_per_s": round(rate),
            "processed_once": row[0] == row[1] == n}  # fmt: skip


def e2e(sqs: Any, endpoint: str, name: str, fifo: bool, n: int) -> dict[str, Any]:
    """(c): a relay process drains a committed backlog into a fresh queue."""
    import tests.support.aws_server as aws_server

    attributes = {"FifoQueue": "true"} if fifo else {}
    queue_url = str(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])
    try:
        broker = f"sqs://{aws_server.REGION}?endpoint={endpoint}&destination={name}"
        return relay_e2e.drain(broker, "orders", n, keys=PIPELINE_KEYS, settings=RELAY_SETTINGS,
                               options=ADAPTER_OPTIONS, timeout=600)  # fmt: skip
    finally:
        sqs.delete_queue(QueueUrl=queue_url)


def main() -> None:
    from relay.brokers.sqs import SqsPublisher
    from tests.support import aws_server

    endpoint = aws_server.endpoint()
    sqs = aws_server.client("sqs")
    import boto3
    from botocore.config import Config

    raw_client = boto3.client("sqs", endpoint_url=endpoint, region_name=aws_server.REGION,
                              config=Config(max_pool_connections=CONCURRENCY,
                                            retries={"total_max_attempts": 1}))  # fmt: skip
    ns = f"bench{uuid.uuid4().hex[:8]}"
    envs = envelopes(MESSAGES, ns)
    result: dict[str, Any] = {
        "broker": "moto server (SQS emulation, same machine)",
        "moto": metadata.version("moto"),
        "boto3": metadata.version("boto3"),
        "messages_per_round": MESSAGES,
        "keys": 100,
        "concurrency": CONCURRENCY,
        "rounds": ROUNDS,
    }

    def queue(name: str, fifo: bool) -> str:
        attributes = {"FifoQueue": "true"} if fifo else {}
        return str(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])

    for kind, fifo in (("fifo", True), ("standard", False)):
        suffix = ".fifo" if fifo else ""
        raw: list[float] = []
        adapter: list[float] = []
        for i in range(ROUNDS + 1):  # round 0 warms both up (connections, credentials)
            url = queue(f"{ns}-raw-{kind}-{i}{suffix}", fifo)
            r = raw_sqs(envs, raw_client, url, fifo)
            sqs.delete_queue(QueueUrl=url)
            name = f"{ns}-adapter-{kind}-{i}{suffix}"
            url = queue(name, fifo)
            pub = SqsPublisher(endpoint_url=endpoint, destinations={"*": name},
                               concurrency=CONCURRENCY, timeout=600, call_timeout=60)  # fmt: skip
            a = asyncio.run(adapter_rate(pub, envs))
            sqs.delete_queue(QueueUrl=url)
            if i:
                raw.append(r)
                adapter.append(a)
            print({"queue": kind, "round": i, "raw": round(r), "adapter": round(a)}, flush=True)
        raw_median, adapter_median = statistics.median(raw), statistics.median(adapter)
        result[kind] = {
            "raw_msg_per_s": [round(r) for r in raw],
            "adapter_msg_per_s": [round(a) for a in adapter],
            "raw_median_msg_per_s": round(raw_median),
            "adapter_median_msg_per_s": round(adapter_median),
            "ratio_adapter_to_raw_median": round(adapter_median / raw_median, 3),
        }
        drained = e2e(sqs, endpoint, f"{ns}-e2e-{kind}{suffix}", fifo, PIPELINE)
        print({"queue": kind, "relay_e2e": drained}, flush=True)
        pipe = pipeline(sqs, endpoint, f"{ns}-pipe-{kind}{suffix}", fifo, PIPELINE)
        print({"queue": kind, "pipeline": pipe}, flush=True)
        result[kind] |= {
            "relay_e2e": drained,
            "pipeline_relay_and_batched_consumer": pipe,
            "ratio_pipeline_to_relay_e2e": round(pipe["msg_per_s"] / drained["msg_per_s"], 3),
        }
    print(write_result("sqs", result))


if __name__ == "__main__":
    main()
