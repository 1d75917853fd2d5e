"""Kafka adapter specifics on a real Kafka-protocol broker (tansu): a batch larger than
librdkafka's local queue waits for deliveries and still sends everything, each key in order."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict

from outbox.envelope import Envelope
from tests.contract.contract_harness import KafkaHarness
from tests.support.kafka_broker import bootstrap
from tests.support.services import import_or_missing


def test_a_batch_larger_than_the_local_queue_is_sent_whole_in_key_order() -> None:
    import_or_missing("confluent_kafka", "kafka")
    from relay.brokers.kafka import KafkaPublisher

    harness = KafkaHarness()
    harness.bootstrap = bootstrap()
    sent = [Envelope(id=uuid.uuid4(), topic="t", key=f"k{i % 7}", seq=i // 7 + 1,
                     payload=b"%d" % i) for i in range(300)]  # fmt: skip

    async def go() -> list[Envelope]:
        pub = KafkaPublisher(harness.bootstrap, destinations=harness.destinations(), timeout=10,
                             config={"queue.buffering.max.messages": 16})  # fmt: skip
        await pub.start()
        try:
            assert await pub.publish_batch(sent) == [None] * len(sent)
        finally:
            await pub.close()
        return await harness.read(len(sent))

    got = asyncio.run(go())
    assert sorted(e.id for e in got) == sorted(e.id for e in sent)
    seqs: dict[str, list[int]] = defaultdict(list)
    for env in got:
        seqs[env.key].append(env.seq)
    assert all(order == sorted(order) for order in seqs.values()), seqs
