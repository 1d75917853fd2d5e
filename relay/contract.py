"""The broker contract suite: what every publisher keeps (:class:`relay.brokers.Publisher`)
and what its wire codec promises, checked live against the broker; for the built-in brokers
and for a broker plug-in's own tests (``pip install "outbox-inbox[contract]"``).

A plug-in declares a :class:`Harness` in its registration (``BrokerPlugin.harness``): how to
make a publisher for a fresh namespace on the broker and how to read back what was published
with the broker's own client. Its test module then runs the suite::

    from relay.contract import *  # noqa: F403 - the suite's tests
    from relay.contract import harness_fixture

    adapter = harness_fixture("redis-list")  # the plug-in's name

What runs follows the publisher's declared :class:`~outbox.brokers.BrokerFeatures`: the key
order test when ``keeps_key_order``, the dedup test when ``dedup_window_seconds``, the user
headers' round trip when ``headers``; and the harness: a permanent refusal when it names a bad
destination or a refused size, the unavailable destination when it names one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from outbox.brokers import BrokerFeatures, plugins, problems
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError
from outbox.kit import require
from relay.brokers.base import Publisher
from relay.exceptions import (
    DestinationUnavailableError,
    PermanentPublishError,
    RetryablePublishError,
)

if TYPE_CHECKING:
    import pytest
else:  # the contract extra's: a MissingDependencyError naming it
    pytest = require("pytest", "contract")

__all__ = [
    "DEADLINE",
    "WIRE_FEATURES",
    "Harness",
    "await_condition",
    "harness_fixture",
    "make_envelope",
    "publish_once",
    "run_harness",
    "test_contract_broker_dedup_drops_a_resent_id",
    "test_contract_close_is_idempotent_and_start_works_again",
    "test_contract_every_field_arrives_intact",
    "test_contract_keeps_key_order_in_a_large_batch",
    "test_contract_permanent_error_fails_only_that_message",
    "test_contract_refused_message_holds_back_its_key",
    "test_contract_unavailable_destination_fails_only_its_messages",
    "test_contract_unreachable_broker_is_retryable_and_bounded",
    "test_wire_round_trip",
]

#: seconds a harness waits for what was published
DEADLINE = 15.0
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Harness:
    """One broker under test: a unique namespace on the live broker, publishers for it, and a
    reader of what was published.

    Topic ``t`` goes to :attr:`dest`; ``bad`` to :meth:`bad_destination` (refused for good),
    ``gone`` to :meth:`unavailable_destination` (does not exist), when the broker has them.
    ``fetch`` returns messages as the broker's client hands them to a consumer, in the shape
    the codec's ``decode`` reads (compared with :meth:`encode`); :meth:`read` decodes them.
    """

    #: the broker's name: ``publisher.features.name``
    name = "?"
    #: a body size the broker (or the configured publisher) refuses for good, if any
    bad_payload: int | None = None
    #: messages in the key order test
    batch_size = 2000
    #: the publisher puts messages on a wire that ``fetch`` reads (the in-memory one does not)
    wire = True

    def __init__(self) -> None:
        self.ns = f"ct{uuid.uuid4().hex[:10]}"

    @property
    def dest(self) -> str:
        return self.ns

    def bad_destination(self) -> str | None:
        """A destination the broker refuses for good (the message is dead-lettered)."""
        return None

    def unavailable_destination(self) -> str | None:
        """A destination that does not exist (yet): a configuration to fix, the topic waits."""
        return None

    def destinations(self) -> dict[str, str]:
        """The ``destinations`` mapping the harness's publishers get."""
        out = {"t": self.dest}
        for topic, dest in (("bad", self.bad_destination()),
                            ("gone", self.unavailable_destination())):  # fmt: skip
            if dest is not None:
                out[topic] = dest
        return out

    async def open(self) -> None:
        """Create the namespace."""

    async def cleanup(self) -> None:
        """Delete what open() and the publishes created."""

    def publisher(self, **options: Any) -> Publisher:
        """A publisher sending to this namespace (``destinations()``), with ``options``."""
        raise NotImplementedError

    def unreachable(self) -> Publisher | None:
        """A publisher of a broker that does not answer (None: it has no connection)."""
        return None

    async def read(self, n: int) -> list[Envelope]:
        """At least ``n`` envelopes from the destination, in broker order."""
        return [self.decode(raw) for raw in await self.fetch(n)]

    async def fetch(self, n: int) -> list[Any]:
        """At least ``n`` messages as received, in the shape ``encode`` returns."""
        raise NotImplementedError

    def encode(self, env: Envelope) -> Any:
        """What the codec says the publisher sends for ``env``."""
        raise NotImplementedError

    def decode(self, raw: Any) -> Envelope:
        """The codec's ``decode`` of a fetched message."""
        raise NotImplementedError

    async def stored(self) -> int:
        """How many messages the destination holds (for the dedup test)."""
        raise NotImplementedError


def harness_fixture(*names: str) -> Any:
    """A pytest fixture (assign it to ``adapter`` in a test module) giving, per broker plug-in
    named, an instance of the Harness its registration declares."""

    @pytest.fixture(params=list(names))
    def adapter(request: Any) -> Harness:
        plugin = plugins().get(request.param)
        if plugin is None:
            left_out = "".join(f"; {p}" for p in problems())
            raise ConfigurationError(
                f"no broker plug-in named {request.param!r} is installed{left_out}"
            )
        harness: Harness = plugin.load("harness")()
        return harness

    return adapter


async def await_condition(
    condition: Callable[[], Awaitable[bool]], what: str, within: float = DEADLINE
) -> None:
    """Ask ``condition()`` until it is true (for a harness's ``fetch``: a broker's count, which
    nothing signals), every 20 ms; fail naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(0.02)


def make_envelope(**overrides: Any) -> Envelope:
    """An envelope of topic ``t`` (the harness's destination), with ``overrides``."""
    fields: dict[str, Any] = {
        "id": uuid.uuid4(), "topic": "t", "key": "k", "seq": 1, "payload": b'{"n": 1}',
    }  # fmt: skip
    fields.update(overrides)
    return Envelope(**fields)


def run_harness(harness: Harness, body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` in an event loop between the harness's ``open`` and ``cleanup``."""
    async def main() -> None:
        await harness.open()
        try:
            await body()
        finally:
            await harness.cleanup()

    asyncio.run(main())


def _by_id(envelopes: list[Envelope]) -> dict[uuid.UUID, Envelope]:
    """Envelopes keyed by id (order across keys is not promised: Kafka partitions by key)."""
    out = {e.id: e for e in envelopes}
    assert len(out) == len(envelopes), "a message arrived twice"
    return out


async def publish_once(pub: Publisher, envelopes: list[Envelope]) -> list[BaseException | None]:
    """Start ``pub``, publish ``envelopes`` as one batch, close it: the batch's results."""
    await pub.start()
    try:
        return await pub.publish_batch(envelopes)
    finally:
        await pub.close()


def _features(adapter: Harness) -> BrokerFeatures:
    """What the harness's publisher declares (asked once the harness is open: a publisher may
    need what ``open`` made)."""
    features = adapter.publisher().features
    assert isinstance(features, BrokerFeatures), "publisher.features must be a BrokerFeatures"
    return features


def test_contract_every_field_arrives_intact(adapter: Harness) -> None:
    created = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)

    async def body() -> None:
        headers = {"tenant": "acme", "X-Trace": "ü"} if _features(adapter).headers else {}
        sent = [
            make_envelope(key="order-1", seq=7, headers=headers, traceparent=TRACEPARENT,
                          created_at=created),
            make_envelope(key="order 2/é", seq=1, payload=bytes(range(256)),
                          content_type="application/octet-stream"),
            make_envelope(key="k3", seq=3, payload=b"", content_type="text/plain; charset=utf-8"),
        ]  # fmt: skip
        pub = adapter.publisher()
        assert isinstance(pub, Publisher)
        assert pub.features.name == adapter.name
        assert await publish_once(pub, sent) == [None, None, None]
        assert _by_id(await adapter.read(len(sent))) == _by_id(sent)

    run_harness(adapter, body)


def test_contract_keeps_key_order_in_a_large_batch(adapter: Harness) -> None:
    n, keys = adapter.batch_size, 17
    sent = [make_envelope(key=f"key-{i % keys}", seq=i // keys + 1, payload=b"x" * 64)
            for i in range(n)]  # fmt: skip

    async def body() -> None:
        if not _features(adapter).keeps_key_order:
            pytest.skip(f"{adapter.name} declares that it does not keep a key's order")
        results = await publish_once(adapter.publisher(), sent)
        assert results == [None] * n
        got = await adapter.read(n)
        assert sorted(e.id for e in got) == sorted(e.id for e in sent)
        seqs: dict[str, list[int]] = defaultdict(list)
        for env in got:
            seqs[env.key].append(env.seq)
        for key, order in seqs.items():
            assert order == sorted(order), f"key {key} reordered: {order[:20]}"

    run_harness(adapter, body)


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
        results = await publish_once(adapter.publisher(), batch)
        assert isinstance(results[2], PermanentPublishError), results[2]
        assert str(bad.id) in str(results[2])
        assert results[:2] + results[3:] == [None] * 4
        assert _by_id(await adapter.read(4)) == _by_id(good)

    run_harness(adapter, body)


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
        results = await publish_once(adapter.publisher(), batch)
        for i in (1, 3):
            assert isinstance(results[i], DestinationUnavailableError), results[i]
            assert str(batch[i].id) in str(results[i])
        assert [results[i] for i in (0, 2, 4)] == [None] * 3
        assert _by_id(await adapter.read(3)) == _by_id(good)

    run_harness(adapter, body)


def test_contract_refused_message_holds_back_its_key(adapter: Harness) -> None:
    """A message refused before sending keeps later messages of its key in the batch unsent."""
    if adapter.bad_payload is None:
        pytest.skip(f"{adapter.name}: no refusal known before sending (checked by the broker)")
    first = make_envelope(key="held", seq=1, payload=b"x" * adapter.bad_payload)
    second = make_envelope(key="held", seq=2)
    other = make_envelope(key="other", seq=1)

    async def body() -> None:
        results = await publish_once(adapter.publisher(), [first, second, other])
        assert isinstance(results[0], PermanentPublishError)
        assert isinstance(results[1], RetryablePublishError)
        assert str(first.id) in str(results[1])
        assert results[2] is None
        assert await adapter.read(1) == [other]

    run_harness(adapter, body)


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

    run_harness(adapter, body)


def test_contract_broker_dedup_drops_a_resent_id(adapter: Harness) -> None:
    env = make_envelope()

    async def body() -> None:
        if not _features(adapter).dedup_window_seconds:
            pytest.skip(f"{adapter.name} has no broker-side dedup: the consumer's inbox dedups")
        pub = adapter.publisher()
        await pub.start()
        try:
            assert await pub.publish_batch([env]) == [None]
            assert await pub.publish_batch([env, env]) == [None, None]  # acked as duplicates
        finally:
            await pub.close()
        assert await adapter.stored() == 1
        assert await adapter.read(1) == [env]

    run_harness(adapter, body)


def _env(**fields: Any) -> Callable[[], Envelope]:
    return lambda: make_envelope(**fields)


#: one envelope per feature of the envelope, for the wire round trip
WIRE_FEATURES: dict[str, Callable[[], Envelope]] = {
    "id-and-dedup-id": _env(id=uuid.UUID("0192f5a4-7b3c-7d2e-8f10-123456789abc")),
    "unicode-key": _env(key="commande/été 42 ✓"),
    "large-seq": _env(seq=2**62 + 7),
    "content-type": _env(content_type="application/vnd.acme.order+protobuf"),
    "trace-context": _env(traceparent=TRACEPARENT),
    "created-at": _env(created_at=dt.datetime(2026, 11, 25, 1, 2, 3, 456789, tzinfo=dt.UTC)),
    "user-headers": _env(headers={"tenant": "acme", "X-Reason": "re-sent ü", "empty": ""}),
    "binary-body": _env(payload=bytes(range(256)) * 3, content_type="application/octet-stream"),
    "empty-body": _env(payload=b"", content_type="text/plain"),
}


@pytest.mark.parametrize("feature", list(WIRE_FEATURES))
def test_wire_round_trip(adapter: Harness, feature: str) -> None:
    """What the publisher sends is what the codec says, byte for byte, and the codec's
    ``decode`` (the consumer's) returns the very envelope published."""
    if not adapter.wire:
        pytest.skip(f"{adapter.name} puts nothing on a wire")
    sent = WIRE_FEATURES[feature]()

    async def body() -> None:
        if feature == "user-headers" and not _features(adapter).headers:
            pytest.skip(f"{adapter.name} declares that user headers do not travel")
        pub = adapter.publisher()
        await pub.start()
        try:
            assert await pub.publish_batch([sent]) == [None]
        finally:
            await pub.close()
        (received,) = await adapter.fetch(1)
        assert received == adapter.encode(sent), "the broker delivered other bytes"
        assert adapter.decode(received) == sent

    run_harness(adapter, body)
