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

from bench.common import write_result  # noqa: E402
from bench.relay import adapter_rate, envelopes  # noqa: E402

MESSAGES = 500
ROUNDS = 5
CONCURRENCY = 16


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
                               concurrency=CONCURRENCY, timeout=60)  # fmt: skip
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
    print(write_result("sqs", result))


if __name__ == "__main__":
    main()
