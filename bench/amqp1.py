"""AMQP 1.0 on a private RabbitMQ node with its ``rabbitmq_amqp1_0`` plugin (started here, as the
tests start it), side by side in one run. Writes bench/results/amqp1.json.

    python bench/amqp1.py

(a) the raw client: python-qpid-proton's own reactor (``Container.run`` on this thread, a
``MessagingHandler``), each batch of 1,000 sent as the link's credit allows and every
``accepted`` disposition awaited before the next batch, the same messages (message-id,
group-id, application-properties, durable) as the relay sends; (b) the relay's adapter,
``Amqp1Publisher.publish_batch`` over the same batches (proton on its own thread, asyncio on
this one). Rounds alternate (a) and (b) on fresh durable queues, so both see the same machine;
the medians and their ratio are reported. (c) the relay end to end: rows committed first, then
one relay process publishes them all. (d) the pipeline: the same kind of backlog, one relay
process and, in this process, an ordered ``Amqp1Consumer`` with ``Batching(size=100,
workers=2)`` and the inbox (a no-op handler: the inbox's record is the work) running together;
rate = messages / (last commit seen by ``on_result`` - start), each message checked processed
once. The broker runs on this machine and takes CPU too: figures are for comparison.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import relay_e2e  # noqa: E402
from bench.common import write_result  # noqa: E402
from bench.relay import BATCH, adapter_rate, chunks, envelopes  # noqa: E402
from outbox.envelope import Envelope  # noqa: E402
from outbox.wire import amqp1 as wire  # noqa: E402

MESSAGES = 10_000
ROUNDS = 5
E2E = 10_000
PIPELINE = 10_000


def raw_proton(envs: list[Envelope], url: str, address: str) -> float:
    """(a): proton's own reactor on this thread, batch by batch, every disposition awaited."""
    from proton import Message, Terminus
    from proton.handlers import MessagingHandler
    from proton.reactor import Container, LinkOption

    class Durable(LinkOption):
        def apply(self, link: Any) -> None:
            link.target.durability = Terminus.DELIVERIES

    batches = chunks(envs)

    class Send(MessagingHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.batch = 0
            self.next = 0
            self.accepted = 0
            self.began = 0.0
            self.took = 0.0

        def on_start(self, event: Any) -> None:
            conn = event.container.connect(url, allowed_mechs="PLAIN", user="guest",
                                           password="guest")  # fmt: skip
            event.container.create_sender(conn, address, options=Durable())

        def on_sendable(self, event: Any) -> None:
            if not self.began:
                self.began = time.perf_counter()
            sender = event.sender
            batch = batches[self.batch] if self.batch < len(batches) else []
            while sender.credit and self.next < len(batch):
                m = wire.encode(batch[self.next])
                sender.send(Message(
                    body=m.body, inferred=True, id=m.message_id, group_id=m.group_id,
                    group_sequence=m.group_sequence, subject=m.subject,
                    content_type=m.content_type, properties=m.properties, durable=True,
                ))  # fmt: skip
                self.next += 1

        def on_accepted(self, event: Any) -> None:
            self.accepted += 1
            if self.accepted == len(batches[self.batch]):  # the batch is confirmed: the next
                self.batch, self.next, self.accepted = self.batch + 1, 0, 0
                if self.batch == len(batches):
                    self.took = time.perf_counter() - self.began
                    event.connection.close()
                else:
                    self.on_sendable(event)

        def on_rejected(self, event: Any) -> None:
            raise AssertionError(f"rejected: {event.delivery.remote.condition}")

    handler = Send()
    Container(handler).run()
    return len(envs) / handler.took


async def _pipeline(url: str, broker_url: str, topic: str, n: int) -> float:
    from psycopg_pool import AsyncConnectionPool

    from inbox import Amqp1Consumer, AsyncHandlerRunner, Batching

    last = [0.0]

    async def handler(conn: Any, env: Any) -> None:
        pass

    def seen(env: Any, result: Any) -> None:
        last[0] = time.time()

    async with AsyncConnectionPool(url, min_size=2, max_size=4, open=False) as pool:
        runner = AsyncHandlerRunner(pool, handler, consumer="bench", ordered=True)
        consumer = Amqp1Consumer(runner, address=f"/queue/{topic}", url=broker_url, credit=400,
                                 on_result=seen,
                                 batching=Batching(size=100, wait=0.01, workers=2))  # fmt: skip
        task = asyncio.create_task(consumer.run())
        await asyncio.wait_for(consumer.ready.wait(), 30)
        group = relay_e2e.Relays(url, broker_url)
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
                if time.time() - started > 300:
                    raise TimeoutError("the pipeline did not finish in 300 s")
        finally:
            group.stop()
            consumer.stop()
            await task
    return n / (last[0] - started)


def pipeline(broker_url: str, topic: str, n: int, keys: int = 200) -> dict[str, Any]:
    """(d): relay process + batched ordered consumer on one backlog."""
    name, url = relay_e2e.create_db()
    try:
        relay_e2e.fill(url, topic, n, keys)
        rate = asyncio.run(_pipeline(url, broker_url, topic, n))
        import psycopg

        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*), count(DISTINCT message_id) FROM inbox_messages "
                "WHERE consumer = 'bench' AND status = 'processed'"
            ).fetchone()
    finally:
        relay_e2e.drop_db(name)
    assert row is not None
    return {"messages": n, "keys": keys, "msg_per_s": round(rate),
            "processed_once": row[0] == row[1] == n}  # fmt: skip


def main() -> None:
    from relay.brokers.amqp1 import Amqp1Publisher
    from tests.support import amqp1_broker

    node = amqp1_broker.Node()
    raw_url = f"amqp://127.0.0.1:{node.port}"
    try:
        ns = f"bench{uuid.uuid4().hex[:8]}"
        envs = envelopes(MESSAGES, ns)
        raw: list[float] = []
        adapter: list[float] = []
        raw_proton(envs[:2000], raw_url, f"/queue/{ns}-warm-raw")  # warm-up
        asyncio.run(adapter_rate(Amqp1Publisher(node.url, destinations={"*": f"/queue/{ns}-w"}),
                                 envs[:2000]))  # fmt: skip
        for i in range(ROUNDS):
            raw.append(raw_proton(envs, raw_url, f"/queue/{ns}-raw-{i}"))
            pub = Amqp1Publisher(node.url, destinations={"*": f"/queue/{ns}-adapter-{i}"})
            adapter.append(asyncio.run(adapter_rate(pub, envs)))
            print({"round": i, "raw": round(raw[-1]), "adapter": round(adapter[-1])}, flush=True)
        e2e = relay_e2e.drain(node.url, f"{ns}-e2e", E2E, keys=1000)
        print({"relay_e2e": e2e}, flush=True)
        pipe = pipeline(node.url, f"{ns}-pipe", PIPELINE)
        print({"pipeline": pipe}, flush=True)
    finally:
        node.stop()
    raw_median, adapter_median = statistics.median(raw), statistics.median(adapter)
    import proton

    result: dict[str, Any] = {
        "broker": "RabbitMQ 3.10 rabbitmq_amqp1_0 plugin (private node, durable queues, "
        "same machine)",
        "python_qpid_proton": ".".join(map(str, proton.VERSION)),
        "messages_per_round": MESSAGES,
        "batch": BATCH,
        "rounds": ROUNDS,
        "raw_msg_per_s": [round(r) for r in raw],
        "adapter_msg_per_s": [round(a) for a in adapter],
        "raw_median_msg_per_s": round(raw_median),
        "adapter_median_msg_per_s": round(adapter_median),
        "ratio_adapter_to_raw_median": round(adapter_median / raw_median, 3),
        "relay_e2e": e2e,
        "ratio_relay_e2e_to_raw_median": round(e2e["msg_per_s"] / raw_median, 3),
        "pipeline_relay_and_batched_consumer": pipe,
        "ratio_pipeline_to_relay_e2e": round(pipe["msg_per_s"] / e2e["msg_per_s"], 3),
    }
    print(write_result("amqp1", result))


if __name__ == "__main__":
    main()
