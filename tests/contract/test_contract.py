"""The contract every adapter keeps (see relay/brokers/base.py), checked live per adapter."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from outbox.envelope import Envelope
from relay.brokers import Publisher
from relay.exceptions import (
    DestinationUnavailableError,
    PermanentPublishError,
    RetryablePublishError,
)
from tests.contract.contract_harness import DEADLINE, Harness

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def make_envelope(**overrides: Any) -> Envelope:
    fields: dict[str, Any] = {
        "id": uuid.uuid4(), "topic": "t", "key": "k", "seq": 1, "payload": b'{"n": 1}',
    }  # fmt: skip
    fields.update(overrides)
    return Envelope(**fields)


def run(harness: Harness, body: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await harness.open()
        try:
            await body()
        finally:
            await harness.cleanup()

    asyncio.run(main())


def by_id(envelopes: list[Envelope]) -> dict[uuid.UUID, Envelope]:
    """Envelopes keyed by id (order across keys is not promised: Kafka partitions by key)."""
    out = {e.id: e for e in envelopes}
    assert len(out) == len(envelopes), "a message arrived twice"
    return out


async def publish(pub: Publisher, envelopes: list[Envelope]) -> list[BaseException | None]:
    await pub.start()
    try:
        return await pub.publish_batch(envelopes)
    finally:
        await pub.close()


def test_contract_every_field_arrives_intact(adapter: Harness) -> None:
    created = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    sent = [
        make_envelope(key="order-1", seq=7, headers={"tenant": "acme", "X-Trace": "ü"},
                      traceparent=TRACEPARENT, created_at=created),
        make_envelope(key="order 2/é", seq=1, payload=bytes(range(256)),
                      content_type="application/octet-stream"),
        make_envelope(key="k3", seq=3, payload=b"", content_type="text/plain; charset=utf-8"),
    ]  # fmt: skip

    async def body() -> None:
        pub = adapter.publisher()
        assert isinstance(pub, Publisher)
        assert pub.features.name == adapter.name
        assert await publish(pub, sent) == [None, None, None]
        assert by_id(await adapter.read(len(sent))) == by_id(sent)

    run(adapter, body)


def test_contract_keeps_key_order_in_a_large_batch(adapter: Harness) -> None:
    n, keys = adapter.batch_size, 17
    sent = [make_envelope(key=f"key-{i % keys}", seq=i // keys + 1, payload=b"x" * 64)
            for i in range(n)]  # fmt: skip

    async def body() -> None:
        results = await publish(adapter.publisher(), sent)
        assert results == [None] * n
        got = await adapter.read(n)
        assert sorted(e.id for e in got) == sorted(e.id for e in sent)
        seqs: dict[str, list[int]] = defaultdict(list)
        for env in got:
            seqs[env.key].append(env.seq)
        for key, order in seqs.items():
            assert order == sorted(order), f"key {key} reordered: {order[:20]}"

    run(adapter, body)


def test_contract_permanent_error_fails_only_that_message(adapter: Harness) -> None:
    if adapter.bad_destination() is not None:
        bad = make_envelope(topic="bad", key="bad-key")
    elif adapter.bad_payload is not None:
        bad = make_envelope(key="bad-key", payload=b"x" * adapter.bad_payload)
    else:
        pytest.skip(f"{adapter.name}: refuses no message for good that a test can send")
    good = [make_envelope(key=f"g{i}", seq=i + 1) for i in range(4)]
    batch = [good[0], good[1], bad, good[2], good[3]]

    async def body() -> None:
        results = await publish(adapter.publisher(), batch)
        assert isinstance(results[2], PermanentPublishError), results[2]
        assert str(bad.id) in str(results[2])
        assert results[:2] + results[3:] == [None] * 4
        assert by_id(await adapter.read(4)) == by_id(good)

    run(adapter, body)


def test_contract_unavailable_destination_fails_only_its_messages(adapter: Harness) -> None:
    """A destination that does not exist is the topic's configuration, not the message's fault
    and not an outage: DestinationUnavailableError for its messages, saying what to fix, and
    every other message goes through (the relay pauses only that topic)."""
    if adapter.unavailable_destination() is None:
        pytest.skip(f"{adapter.name}: no destination a test can make unavailable")
    gone = [make_envelope(topic="gone", key=f"x{i}") for i in range(2)]
    good = [make_envelope(key=f"g{i}", seq=i + 1) for i in range(3)]
    batch = [good[0], gone[0], good[1], gone[1], good[2]]

    async def body() -> None:
        results = await publish(adapter.publisher(), batch)
        for i in (1, 3):
            assert isinstance(results[i], DestinationUnavailableError), results[i]
            assert str(batch[i].id) in str(results[i])
        assert [results[i] for i in (0, 2, 4)] == [None] * 3
        assert by_id(await adapter.read(3)) == by_id(good)

    run(adapter, body)


def test_contract_refused_message_holds_back_its_key(adapter: Harness) -> None:
    """A message refused before sending keeps later messages of its key in the batch unsent."""
    if adapter.bad_payload is None:
        pytest.skip(f"{adapter.name}: no refusal known before sending (checked by the broker)")
    first = make_envelope(key="held", seq=1, payload=b"x" * adapter.bad_payload)
    second = make_envelope(key="held", seq=2)
    other = make_envelope(key="other", seq=1)

    async def body() -> None:
        results = await publish(adapter.publisher(), [first, second, other])
        assert isinstance(results[0], PermanentPublishError)
        assert isinstance(results[1], RetryablePublishError)
        assert str(first.id) in str(results[1])
        assert results[2] is None
        assert await adapter.read(1) == [other]

    run(adapter, body)


def test_contract_unreachable_broker_is_retryable_and_bounded(adapter: Harness) -> None:
    pub = adapter.unreachable()
    if pub is None:
        pytest.skip(f"{adapter.name} has no network connection to lose")

    async def body() -> None:
        began = time.monotonic()
        with pytest.raises(RetryablePublishError, match=r"(?i)connect|reach"):
            await pub.start()
        with pytest.raises(RetryablePublishError):
            await pub.publish_batch([make_envelope()])
        await pub.close()
        assert time.monotonic() - began < DEADLINE

    asyncio.run(body())


def test_contract_close_is_idempotent_and_start_works_again(adapter: Harness) -> None:
    first, second = make_envelope(seq=1), make_envelope(seq=2)

    async def body() -> None:
        pub = adapter.publisher()
        await pub.close()  # never started
        await pub.start()
        assert await pub.publish_batch([first]) == [None]
        await pub.close()
        await pub.close()
        await pub.start()
        assert await pub.publish_batch([second]) == [None]
        await pub.close()
        assert await adapter.read(2) == [first, second]

    run(adapter, body)


def test_contract_broker_dedup_drops_a_resent_id(adapter: Harness) -> None:
    if not adapter.dedup:
        pytest.skip(f"{adapter.name} has no broker-side dedup: the consumer's inbox dedups")
    env = make_envelope()

    async def body() -> None:
        pub = adapter.publisher()
        await pub.start()
        try:
            assert pub.features.dedup_window_seconds > 0
            assert await pub.publish_batch([env]) == [None]
            assert await pub.publish_batch([env, env]) == [None, None]  # acked as duplicates
        finally:
            await pub.close()
        assert await adapter.stored() == 1
        assert await adapter.read(1) == [env]

    run(adapter, body)
