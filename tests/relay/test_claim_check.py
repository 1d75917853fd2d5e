"""Claim check end to end: a payload far over the broker's limit, committed with the outbox,
relayed through object storage (S3 on moto's server) and applied whole by a consumer; and
objects altered or deleted in the store refused with their reasons, never applied.

Live: PostgreSQL, moto's server (S3 and SQS, 256 KiB per message) and NATS JetStream (1 MiB
``max_payload``).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, ClaimCheckResolver, InboxMetrics, NatsConsumer, SqsConsumer
from inbox._consumer import BrokerConsumer
from inbox.testing import ResultLog
from outbox import Message, publish_batch
from outbox.claimcheck import ClaimCheck, DirectoryStore, S3Store, override
from relay import ClaimCheckPublisher, Relay
from relay.brokers import publisher_for_url
from relay.brokers.base import Publisher
from tests.relay.relay_helpers import config, running
from tests.support.services import import_or_missing, require_port

BIG = 5 * 1024 * 1024


def _payload(n: int, size: int = BIG) -> dict[str, Any]:
    """A JSON payload of about ``size`` bytes, different for each ``n``."""
    return {"n": n, "blob": f"{n:08d}" * (size // 8)}


def _write(url: str, messages: list[Message]) -> list[uuid.UUID]:
    with psycopg.connect(url) as conn:
        ids = publish_batch(conn, messages, max_payload_bytes=8 * BIG)
        conn.commit()
    return ids


def _bucket() -> S3Store:
    import_or_missing("boto3", "aws")
    from tests.support import aws_server

    endpoint = aws_server.endpoint()
    name = f"claims-{uuid.uuid4().hex[:10]}"
    aws_server.client("s3").create_bucket(Bucket=name)
    return S3Store(name, region=aws_server.REGION, endpoint_url=endpoint)


@asynccontextmanager
async def _sqs() -> AsyncIterator[tuple[Callable[..., Publisher], Callable[..., BrokerConsumer]]]:
    from tests.support import aws_server

    sqs = aws_server.client("sqs")
    name = f"claims-{uuid.uuid4().hex[:10]}.fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    endpoint = aws_server.endpoint()

    def publisher() -> Publisher:
        return publisher_for_url(
            f"sqs://{aws_server.REGION}?endpoint={endpoint}",
            destinations={"*": name},
            ack_timeout=8,
        )

    def consumer(runner: AsyncHandlerRunner, **kw: Any) -> BrokerConsumer:
        return SqsConsumer(runner, queue=url, endpoint_url=endpoint, wait_seconds=1,
                           visibility_timeout=30, redeliver_delay=0.2, **kw)  # fmt: skip

    try:
        yield publisher, consumer
    finally:
        sqs.delete_queue(QueueUrl=url)


@asynccontextmanager
async def _nats() -> AsyncIterator[tuple[Callable[..., Publisher], Callable[..., BrokerConsumer]]]:
    require_port(4222, "NATS")
    from tests.relay.broker_helpers import nats_stream

    async with nats_stream("claims") as (_js, stream, subject):

        def publisher() -> Publisher:
            return publisher_for_url("nats://127.0.0.1:4222", destinations={"*": subject})

        def consumer(runner: AsyncHandlerRunner, **kw: Any) -> BrokerConsumer:
            return NatsConsumer(runner, stream=stream, durable=f"d{uuid.uuid4().hex[:8]}",
                                subject=subject, redeliver_delay=0.2, **kw)  # fmt: skip

        yield publisher, consumer


BROKERS = {"sqs": _sqs, "nats": _nats}


async def _table(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS applied (id uuid, key text, seq bigint, "
                           "size bigint, sha256 text, content_type text)")  # fmt: skip


async def _handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
    await conn.execute(
        "INSERT INTO applied VALUES (%s, %s, %s, %s, %s, %s)",
        (env.id, env.key, env.seq, len(env.payload), hashlib.sha256(env.payload).hexdigest(),
         env.content_type),
    )  # fmt: skip


@pytest.mark.parametrize("broker", ["sqs", "nats"])
def test_a_5_mib_payload_published_in_a_transaction_reaches_the_consumer_whole(
    url: str, broker: str
) -> None:
    """Two 5 MiB payloads and a small one on one key, in one transaction: the large ones go
    through S3 (SQS takes 256 KiB, NATS 1 MiB), the small one as it is (except the one forced
    through the store by the per-message override); each is applied whole, in key order."""
    store = _bucket()
    big = [Message(topic="docs", key="k", payload=_payload(n)) for n in range(2)]
    small = Message(topic="docs", key="k", payload={"n": 2})
    forced = Message(topic="docs", key="k", payload={"n": 3}, headers=override("always"))
    messages = [big[0], small, big[1], forced]
    ids = _write(url, messages)
    log = ResultLog()

    async def go() -> None:
        await _table(url)
        async with BROKERS[broker]() as (publisher, consumer_for):
            pub = ClaimCheckPublisher(publisher(), ClaimCheck(store, threshold=64 * 1024))
            relay = Relay(config(url, publish_timeout=30, lease_seconds=60), pub)
            async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
                runner = AsyncHandlerRunner(pool, _handler, consumer="docs-svc", ordered=True)
                consumer = consumer_for(
                    runner, on_result=log, claim_check=ClaimCheckResolver(store)
                )
                task = asyncio.create_task(consumer.run())
                async with running(relay):
                    await log.wait_processed(ids, within=120)
                consumer.stop()
                await task
            # the two large ones and the forced one; a send retried after a timeout
            # (a loaded machine) uploads its object again, to the same key
            assert pub.uploaded >= 3

    asyncio.run(go())
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, seq, size, sha256, content_type FROM applied ORDER BY seq"
        ).fetchall()
        stored = conn.execute(
            "SELECT id, payload FROM outbox_messages WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
    assert [r[0] for r in rows] == ids  # each applied once, in key order
    assert [r[1] for r in rows] == [1, 2, 3, 4]
    for (msg_id, _, size, digest, content_type), (_, body) in zip(
        rows, sorted(stored, key=lambda r: ids.index(r[0])), strict=True
    ):
        assert content_type == "application/json", msg_id
        # the payload the relay read is the payload applied: same bytes, checked by hash
        assert size == len(body), msg_id
        assert digest == hashlib.sha256(body).hexdigest(), msg_id
    assert rows[0][2] > BIG
    assert rows[2][2] > BIG


def _refused(metrics: InboxMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "inbox_refused_total", {"consumer": "docs-svc", "reason": reason}
    )
    return value or 0.0


@pytest.mark.parametrize("broker", ["sqs", "nats"])
def test_an_altered_or_deleted_object_is_refused_with_its_reason_and_never_applied(
    url: str, broker: str
) -> None:
    """Three large messages on three keys are relayed; then, before the consumer starts, one
    object is overwritten with other bytes of the same size and one is deleted. The consumer
    applies the intact one and refuses the other two, each with its own reason, counted and
    recorded dead; the handler never sees them."""
    prometheus = import_or_missing("prometheus_client", "metrics")
    store = _bucket()
    ids = _write(url, [Message(topic="docs", key=f"k{n}", payload=_payload(n, 300_000))
                       for n in range(3)])  # fmt: skip
    intact, tampered, deleted = ids
    seen: list[uuid.UUID] = []

    async def handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        seen.append(env.id)
        await _handler(conn, env)

    async def go() -> InboxMetrics:
        await _table(url)
        log = ResultLog()
        async with BROKERS[broker]() as (publisher, consumer_for):
            claim = ClaimCheck(store, threshold=100_000)
            pub = ClaimCheckPublisher(publisher(), claim)
            relay = Relay(config(url, publish_timeout=30, lease_seconds=60), pub)
            async with running(relay):
                await _wait(lambda: pub.uploaded >= 3 and not _pending(url), 60)
            keys = {m: f"outbox/docs/{m}" for m in ids}
            body = store.get(keys[tampered], 10 * BIG)
            store.put(keys[tampered], body[:-2] + b"x}", "application/json")  # same size
            store.client.delete_object(Bucket=store.bucket, Key=keys[deleted])
            metrics = InboxMetrics(prometheus.CollectorRegistry())
            async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
                runner = AsyncHandlerRunner(pool, handler, consumer="docs-svc", ordered=True,
                                            metrics=metrics)  # fmt: skip
                consumer = consumer_for(
                    runner, on_result=log, claim_check=ClaimCheckResolver(store)
                )
                task = asyncio.create_task(consumer.run())
                await log.wait_processed([intact], within=60)
                await _wait(lambda: _dead(url) >= {tampered, deleted}, 60)
                consumer.stop()
                await task
        return metrics

    metrics = asyncio.run(go())
    assert seen == [intact]
    assert _refused(metrics, "claim_check_mismatch") == 1
    assert _refused(metrics, "claim_check_missing") == 1
    with psycopg.connect(url) as conn:
        errors = dict(conn.execute(
            "SELECT message_id, last_error FROM inbox_messages WHERE status = 'dead'"
        ).fetchall())  # fmt: skip
    assert "not what was published" in errors[tampered]
    assert "is not in S3Store" in errors[deleted]


def _pending(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_messages WHERE status <> 'published'")
        return bool(row.fetchone()[0])  # type: ignore[index]


def _dead(url: str) -> set[uuid.UUID]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT message_id FROM inbox_messages WHERE status = 'dead'")
        return {r[0] for r in rows.fetchall()}


async def _wait(predicate: Callable[[], bool], within: float) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await asyncio.to_thread(predicate):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.1)


def test_a_directory_store_round_trips_and_expires(tmp_path: Any) -> None:
    """The local directory store: what is put is got back whole; a key that climbs out of the
    directory is refused; expire() deletes objects older than the retention."""
    import datetime as dt
    import os

    from outbox.claimcheck import ObjectMissingError
    from outbox.exceptions import InvalidMessageError

    store = DirectoryStore(tmp_path / "objects")
    store.put("outbox/docs/a", b"x" * 1000, "application/octet-stream")
    assert store.get("outbox/docs/a", 1000) == b"x" * 1000
    with pytest.raises(InvalidMessageError, match="max_download_bytes"):
        store.get("outbox/docs/a", 999)
    with pytest.raises(InvalidMessageError, match="not one a store writes"):
        store.get("outbox/../../etc/passwd", 1000)
    old = tmp_path / "objects" / "outbox" / "docs" / "a"
    os.utime(old, (1, 1))
    store.put("outbox/docs/b", b"y", "text/plain")
    assert store.expire(dt.timedelta(days=1)) == 1
    with pytest.raises(ObjectMissingError):
        store.get("outbox/docs/a", 1000)
    assert store.get("outbox/docs/b", 10) == b"y"


def test_a_consumer_without_claim_check_refuses_a_reference_instead_of_applying_it(
    url: str, tmp_path: Any
) -> None:
    """A consumer given no ``claim_check`` never hands a reference to its handler as if it
    were the payload: the message is refused (``claim_check_unresolvable``) and recorded dead;
    the small message after it on another key is applied."""
    require_port(4222, "NATS")
    store = DirectoryStore(tmp_path / "objects")
    ids = _write(url, [Message(topic="docs", key="big", payload=_payload(0, 200_000)),
                       Message(topic="docs", key="small", payload={"n": 1})])  # fmt: skip
    seen: list[uuid.UUID] = []

    async def handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        seen.append(env.id)

    async def go() -> None:
        log = ResultLog()
        async with _nats() as (publisher, consumer_for):
            pub = ClaimCheckPublisher(publisher(), ClaimCheck(store, threshold=100_000))
            relay = Relay(config(url, publish_timeout=30, lease_seconds=60), pub)
            async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
                runner = AsyncHandlerRunner(pool, handler, consumer="docs-svc", ordered=True)
                consumer = consumer_for(runner, on_result=log)  # no claim_check
                task = asyncio.create_task(consumer.run())
                async with running(relay):
                    await log.wait_processed([ids[1]], within=60)
                    await _wait(lambda: ids[0] in _dead(url), 60)
                consumer.stop()
                await task

    asyncio.run(go())
    assert seen == [ids[1]]
    with psycopg.connect(url) as conn:
        error = conn.execute("SELECT last_error FROM inbox_messages WHERE message_id = %s",
                             (ids[0],)).fetchone()  # fmt: skip
    assert error is not None
    assert "has no claim_check" in error[0]


@pytest.mark.parametrize("broker", ["nats", "kafka", "rabbitmq", "mqtt", "sqs"])
def test_a_large_payload_goes_through_each_broker_as_a_cloudevent_and_arrives_whole(
    url: str, broker: str
) -> None:
    """Claim check and CloudEvents together, on each broker: a 2 MiB payload (over Kafka's and
    NATS's default limits, SQS's eight times over) goes through moto's S3; the consumer
    applies it whole, after a small message of the same key, in order."""
    from tests.relay.test_cloudevents_live import TARGETS

    store = _bucket()
    target = TARGETS[broker]()
    large = _payload(1, 2 * 1024 * 1024)
    ids = _write(url, [Message(topic="orders", key="k", payload={"n": 0}),
                       Message(topic="orders", key="k", payload=large)])  # fmt: skip
    log = ResultLog()
    applied: list[tuple[int, int, str]] = []

    async def handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        applied.append((env.seq, len(env.payload), hashlib.sha256(env.payload).hexdigest()))

    async def go() -> None:
        await target.setup()
        try:
            async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
                runner = AsyncHandlerRunner(pool, handler, consumer="docs-svc", ordered=True)
                consumer = target.consumer(runner, log)
                consumer.claim_check = ClaimCheckResolver(store)
                task = asyncio.create_task(consumer.run())
                async with asyncio.timeout(30):
                    await consumer.ready.wait()
                pub = ClaimCheckPublisher(target.publisher(), ClaimCheck(store, threshold=65536))
                relay = Relay(config(url, publish_timeout=30, lease_seconds=60), pub)
                async with running(relay):
                    await log.wait_processed(ids, within=120)
                consumer.stop()
                await task
                assert pub.uploaded >= 1  # more when a timed-out send was retried (same key)
        finally:
            await target.teardown()

    asyncio.run(go())
    with psycopg.connect(url) as conn:
        bodies = dict(conn.execute("SELECT seq, payload FROM outbox_messages").fetchall())
    assert [seq for seq, _, _ in applied] == [1, 2]
    for seq, size, digest in applied:
        assert size == len(bodies[seq])
        assert digest == hashlib.sha256(bodies[seq]).hexdigest()


class _FailingStore(DirectoryStore):
    """A directory store whose uploads of one message fail (a store outage for that key)."""

    def __init__(self, root: Any, failing: uuid.UUID) -> None:
        super().__init__(root)
        self.failing = failing

    def put(self, key: str, data: bytes, content_type: str) -> None:
        if key.endswith(str(self.failing)):
            raise ConnectionError("store unreachable")
        super().put(key, data, content_type)


def test_a_failed_upload_is_retried_and_holds_back_its_key_only(tmp_path: Any) -> None:
    """Pure logic (the publisher is the relay tests' recorder): the message whose upload failed
    comes back retryable, the later message of its key is not sent (NotSentError), another
    key's message is published; the override header never reaches the broker."""
    from outbox.envelope import Envelope
    from relay import NotSentError, RetryablePublishError
    from tests.relay.relay_helpers import FakePublisher

    big = Envelope(uuid.uuid4(), "docs", "k1", 1, b"x" * 2000)
    after = Envelope(uuid.uuid4(), "docs", "k1", 2, b"{}")
    other = Envelope(uuid.uuid4(), "docs", "k2", 1, b"y" * 2000, headers=override("never"))
    inner = FakePublisher()
    pub = ClaimCheckPublisher(inner, ClaimCheck(_FailingStore(tmp_path, big.id), threshold=1000))
    results = asyncio.run(pub.publish_batch([big, after, other]))
    assert isinstance(results[0], RetryablePublishError)
    assert "claim check upload" in str(results[0])
    assert isinstance(results[1], NotSentError)
    assert results[2] is None
    ((_, sent),) = inner.log
    assert sent.id == other.id
    assert sent.payload == other.payload  # "never": sent as it is
    assert "outbox-claim-check" not in sent.headers


def test_s3_lifecycle_rule_expires_the_prefix() -> None:
    """The rule the how-to gives, put on a bucket of moto's S3 and read back."""
    store = _bucket()
    store.apply_lifecycle(days=7)
    rules = store.client.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
    assert [(r["Status"], r["Expiration"]["Days"], r["Filter"]["Prefix"]) for r in rules] == [
        ("Enabled", 7, "outbox/")
    ]
