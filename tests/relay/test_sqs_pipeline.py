"""The whole pipeline on Amazon SQS and SNS (moto's server): rows committed with the outbox,
relayed by ``outbox relay``'s ``Relay`` through ``sqs://`` or ``sns://``, then shuffled copies
of a third of them sent again (a relay re-sending after the dedup window), and a poison
message; an ordered, batched ``inbox.SqsConsumer`` applies every other message once, each key
in order, and records the poison message dead.

* a FIFO queue: SQS orders each key (message group) and drops repeats of an id;
* an SNS FIFO topic with a FIFO queue subscribed (raw message delivery);
* a standard queue: neither order nor dedup from SQS, the inbox's order guard and duplicate
  check carry both.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Batching, Outcome, SqsConsumer
from inbox.testing import ResultLog
from outbox.envelope import Envelope
from relay import Relay
from relay.brokers import publisher_for_url
from tests.relay.relay_helpers import config, running, write
from tests.support.services import import_or_missing

KEYS, PER_KEY = 6, 10


class Tee:
    """The adapter, remembering what it confirmed (to send copies of it again)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.features, self.sent = inner, inner.features, []

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        results: list[BaseException | None] = await self.inner.publish_batch(envelopes)
        self.sent += [e for e, r in zip(envelopes, results, strict=True) if r is None]
        return results


def _queue(sqs: Any, name: str, fifo: bool) -> tuple[str, str]:
    attributes = {"FifoQueue": "true"} if fifo else {}
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    return url, arn["QueueArn"]


def _resend(sqs: Any, url: str, fifo: bool, copies: list[Envelope]) -> None:
    """Copies of relayed messages, as a relay sends them after SQS's dedup window (a new
    MessageDeduplicationId, since SQS would drop the same one)."""
    from outbox.wire import sqs as wire

    for start in range(0, len(copies), 10):
        entries = []
        for n, env in enumerate(copies[start : start + 10]):
            msg = wire.encode(env)
            entry: dict[str, Any] = {
                "Id": str(n),
                "MessageBody": msg.body,
                "MessageAttributes": msg.attributes,
            }
            if fifo:
                entry["MessageGroupId"] = msg.group_id
                entry["MessageDeduplicationId"] = f"{env.id}-again"
            entries.append(entry)
        assert not sqs.send_message_batch(QueueUrl=url, Entries=entries).get("Failed")


@pytest.mark.parametrize("kind", ["sqs-fifo", "sns-fifo", "sqs-standard"])
def test_outbox_relay_sqs_inbox_each_message_once_in_key_order(url: str, kind: str) -> None:
    import_or_missing("boto3", "aws")
    from tests.support import aws_server
    fifo = kind.endswith("fifo")
    suffix = ".fifo" if fifo else ""
    tag = uuid.uuid4().hex[:10]
    sqs = aws_server.client("sqs")
    queue_url, queue_arn = _queue(sqs, f"orders-{tag}{suffix}", fifo)
    scheme, destination = "sqs", f"orders-{tag}{suffix}"
    if kind == "sns-fifo":
        sns = aws_server.client("sns")
        topic = sns.create_topic(Name=f"orders-{tag}.fifo", Attributes={"FifoTopic": "true"})
        sns.subscribe(
            TopicArn=topic["TopicArn"],
            Protocol="sqs",
            Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "true"},
        )
        scheme, destination = "sns", topic["TopicArn"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE applied (id uuid, key text, seq bigint, tenant text, "
            "at timestamptz DEFAULT clock_timestamp())"
        )
    pairs = [("orders", f"k{i % KEYS}") for i in range(KEYS * PER_KEY)]
    ids = write(url, pairs, headers={"tenant": "acme"})
    (poison,) = write(url, [("orders", "k0")], headers={"tenant": "poison"})
    (after,) = write(url, [("orders", "k0")], headers={"tenant": "acme"})
    log = ResultLog()

    async def handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        if env.headers.get("tenant") == "poison":
            raise ValueError("cannot apply this one")
        await conn.execute(
            "INSERT INTO applied (id, key, seq, tenant) VALUES (%s, %s, %s, %s)",
            (env.id, env.key, env.seq, env.headers.get("tenant")),
        )

    async def go() -> None:
        endpoint = aws_server.endpoint()
        pub = Tee(
            publisher_for_url(
                f"{scheme}://{aws_server.REGION}?endpoint={endpoint}",
                destinations={"orders": destination},
                ack_timeout=8,
            )
        )
        relay = Relay(config(url, publish_timeout=10, lease_seconds=20), pub)
        async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
            runner = AsyncHandlerRunner(
                pool, handler, consumer="orders-svc", ordered=True, max_attempts=2
            )
            consumer = SqsConsumer(
                runner,
                queue=queue_url,
                endpoint_url=endpoint,
                wait_seconds=1,
                visibility_timeout=10,
                redeliver_delay=0.2,
                on_result=log,
                batching=Batching(size=10, workers=2),
            )
            task = asyncio.create_task(consumer.run())
            async with running(relay):
                await log.wait_for(lambda _: len(pub.sent) >= len(ids) + 2, within=60)
            copies = random.Random(7).sample(pub.sent, len(pub.sent) // 3)
            await asyncio.to_thread(_resend, sqs, queue_url, fifo, copies)
            await log.wait_processed([*ids, after], within=90)
            await log.wait_for(lambda lg: poison in lg.outcomes(Outcome.DEAD), within=30)
            # every copy settled: nothing left in the queue
            await log.wait_for(lambda lg: len(lg.results) >= len(ids) + len(copies), within=30)
            consumer.stop()
            await task

    try:
        asyncio.run(go())
    finally:
        sqs.delete_queue(QueueUrl=queue_url)
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, key, seq, tenant FROM applied ORDER BY at").fetchall()
        dead = conn.execute(
            "SELECT status FROM inbox_messages WHERE message_id = %s", (poison,)
        ).fetchone()
    assert sorted(r[0] for r in rows) == sorted([*ids, after])  # each applied exactly once
    assert dead == ("dead",)
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, key, seq, tenant in rows:
        assert tenant == "acme"
        by_key[key].append(seq)
    expected = {f"k{k}": list(range(1, PER_KEY + 1)) for k in range(KEYS)}
    expected["k0"] += [PER_KEY + 2]  # past its dead message, seq PER_KEY + 1
    assert by_key == expected


@pytest.mark.parametrize("fifo", [True, False], ids=["fifo", "standard"])
def test_outbox_relay_cli_publishes_a_backlog_to_sqs(url: str, fifo: bool) -> None:
    """``outbox relay --broker sqs://...`` as an operator runs it: a backlog committed first
    arrives once per message, each key in order (a FIFO queue; moto keeps a standard queue's
    order too, which AWS would not promise)."""
    import_or_missing("boto3", "aws")
    from tests.support import aws_server
    suffix = ".fifo" if fifo else ""
    tag = uuid.uuid4().hex[:8]
    sqs = aws_server.client("sqs")
    queue_url, _ = _queue(sqs, f"cli-{tag}-orders{suffix}", fifo)
    ids = write(url, [("orders", f"k{i % KEYS}") for i in range(KEYS * PER_KEY)])
    broker = f"sqs://{aws_server.REGION}?endpoint={aws_server.endpoint()}"
    broker += f"&destination=cli-{tag}-{{topic}}{suffix}"
    outbox = str(Path(sys.executable).with_name("outbox"))
    proc = subprocess.Popen(  # credentials: the dummy ones in the environment (default chain)
        [outbox, "relay", "--url", url, "--broker", broker, "--poll-interval", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    got: list[Envelope] = []
    try:
        from outbox.wire import sqs as wire

        deadline = time.monotonic() + 60
        while len(got) < len(ids) and time.monotonic() < deadline and proc.poll() is None:
            messages = sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                MessageAttributeNames=["All"],
            ).get("Messages", [])  # fmt: skip
            got += [wire.decode(m["Body"], m["MessageAttributes"]) for m in messages]
            if messages:
                sqs.delete_message_batch(QueueUrl=queue_url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)])  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode()
        sqs.delete_queue(QueueUrl=queue_url)
    assert sorted(e.id for e in got) == sorted(ids), output[-2000:]
    by_key: dict[str, list[int]] = defaultdict(list)
    for env in got:
        by_key[env.key].append(env.seq)
    assert by_key == {f"k{k}": list(range(1, PER_KEY + 1)) for k in range(KEYS)}
    assert proc.returncode == 0, output[-2000:]


def test_moto_killed_mid_stream_the_inbox_still_applies_each_message_once_in_order(
    url: str,
) -> None:
    """``kill -9`` of the SQS server in the middle of the stream, then a new one (moto loses
    everything: the FIFO queue is recreated and what AWS would have kept is put back, see
    aws_server.put_back), reached again through the same endpoint. Messages committed while it
    is down are sent after; the consumer, polling through the outage, applies each message
    once, each key in order."""
    import_or_missing("boto3", "aws")
    import boto3

    import tests.support.aws_server as aws_server
    from tests.relay.broker_helpers import Proxy
    from tests.support.server_process import free_port

    aws_server.aws_env()
    ports = [free_port()]
    procs = [aws_server.launch(ports[0])]
    name = f"kill-{uuid.uuid4().hex[:8]}.fifo"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE applied (id uuid, key text, seq bigint, "
                     "at timestamptz DEFAULT clock_timestamp())")  # fmt: skip
    ids = write(url, [("orders", f"k{i % KEYS}") for i in range(KEYS * PER_KEY)])
    log = ResultLog()
    put_back: list[int] = []

    async def handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        await conn.execute("INSERT INTO applied (id, key, seq) VALUES (%s, %s, %s)",
                           (env.id, env.key, env.seq))  # fmt: skip

    def queue(port: int) -> str:
        sqs = boto3.client("sqs", endpoint_url=f"http://127.0.0.1:{port}",
                           region_name=aws_server.REGION)  # fmt: skip
        sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})
        return str(sqs.get_queue_url(QueueName=name)["QueueUrl"])

    async def go() -> None:
        proxy = Proxy(ports[0])
        await proxy.up()
        endpoint = f"http://127.0.0.1:{proxy.port}"
        queue(ports[0])
        pub = publisher_for_url(f"sqs://{aws_server.REGION}?endpoint={endpoint}",
                                destinations={"orders": name}, ack_timeout=8)  # fmt: skip
        relay = Relay(config(url, publish_timeout=10, lease_seconds=20), pub)
        async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer="orders-svc", ordered=True)
            consumer = SqsConsumer(runner, queue=name, endpoint_url=endpoint, wait_seconds=1,
                                   visibility_timeout=10, redeliver_delay=0.2, on_result=log,
                                   batching=Batching(size=10, workers=2))  # fmt: skip
            task = asyncio.create_task(consumer.run())
            async with running(relay):
                await log.wait_for(lambda lg: len(lg.settled_ids()) >= 20, within=60)
                await proxy.down()  # nobody reaches the new server before it is ready
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait(10)
                ids.extend(await asyncio.to_thread(
                    write, url, [("orders", f"k{i % KEYS}") for i in range(KEYS)]))  # fmt: skip
                await asyncio.sleep(1.0)  # the relay and the consumer meet the outage
                ports.append(free_port())
                procs.append(await asyncio.to_thread(aws_server.launch, ports[1]))
                direct = boto3.client("sqs", endpoint_url=f"http://127.0.0.1:{ports[1]}",
                                      region_name=aws_server.REGION)  # fmt: skip
                put_back.append(await asyncio.to_thread(
                    aws_server.put_back, url, direct, queue(ports[1]), "orders-svc"))  # fmt: skip
                proxy.target_port = ports[1]
                await proxy.up()
                await log.wait_processed(ids, within=120)
            consumer.stop()
            await task
        await proxy.down()

    try:
        asyncio.run(go())
    finally:
        for proc in procs:
            aws_server.stop(proc)
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, key, seq FROM applied ORDER BY at").fetchall()
    assert sorted(r[0] for r in rows) == sorted(ids)  # each applied exactly once
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, key, seq in rows:
        by_key[key].append(seq)
    assert by_key == {f"k{k}": list(range(1, PER_KEY + 2)) for k in range(KEYS)}
    assert put_back[0] > 0, "moto held nothing at the kill: it came too late to test this"
