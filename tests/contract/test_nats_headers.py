"""NATS-only checks the contract cannot express: what the NATS protocol cannot carry in a header,
and the server's max_payload counting headers too. Either would make the server close the
connection (failing every message in flight), so the adapter refuses the one message instead."""

from __future__ import annotations

import pytest

from relay.contract import make_envelope, publish_once, run_harness
from relay.exceptions import PermanentPublishError
from tests.contract.contract_harness import NatsHarness
from tests.support.services import require_port


@pytest.fixture(autouse=True)
def _nats() -> None:
    require_port(4222, "NATS")


@pytest.mark.parametrize(
    ("headers", "key", "culprit"),
    [
        ({"note": "two\nlines"}, "k", "note"),
        ({"bad name": "v"}, "k", "bad name"),
        ({"a:b": "v"}, "k", "a:b"),
        ({}, "key\r\nwith a break", "outbox-key"),
    ],
)
def test_nats_refuses_a_header_it_cannot_carry(
    headers: dict[str, str], key: str, culprit: str
) -> None:
    harness = NatsHarness()
    bad = make_envelope(key=key, headers=headers)
    good = make_envelope(key="good", headers={"tenant": "acme"})

    async def body() -> None:
        results = await publish_once(harness.publisher(), [bad, good])
        assert isinstance(results[0], PermanentPublishError), results[0]
        assert repr(culprit) in str(results[0])
        assert str(bad.id) in str(results[0])
        assert results[1] is None
        assert await harness.read(1) == [good]

    run_harness(harness, body)


def test_nats_payload_limit_counts_the_headers() -> None:
    """A body under max_payload whose headers push the message over it is refused, by size."""
    harness = NatsHarness()

    async def body() -> None:
        pub = harness.publisher()
        await pub.start()
        limit = pub.features.max_payload_bytes
        await pub.close()
        fits = make_envelope(key="fits", payload=b"x" * (limit - 4096))
        over = make_envelope(key="over", payload=b"x" * (limit - 100), headers={"pad": "y" * 200})
        results = await publish_once(harness.publisher(), [over, fits])
        assert isinstance(results[0], PermanentPublishError), results[0]
        assert "max_payload minus headers" in str(results[0])
        assert results[1] is None
        assert await harness.read(1) == [fits]

    run_harness(harness, body)


def test_nats_refuses_a_header_name_the_client_would_refuse() -> None:
    """A name outside the HTTP token characters (nats-py's own check) is refused on its own by
    the batch's frame path, as the client's publish would refuse it; the rest goes out."""
    harness = NatsHarness()
    bad = make_envelope(key="k", headers={"a/b": "v"})
    good = make_envelope(key="good", headers={"tenant": "acme", "x-trace": " padded "})

    async def body() -> None:
        results = await publish_once(harness.publisher(), [bad, good])
        assert isinstance(results[0], PermanentPublishError), results[0]
        assert "'a/b'" in str(results[0])
        assert results[1] is None
        (received,) = await harness.read(1)
        assert received.id == good.id
        assert received.headers == {"tenant": "acme", "x-trace": "padded"}  # as nats-py strips

    run_harness(harness, body)


def test_nats_without_the_frame_path_publishes_through_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client without the internals the frame path writes through: ``publish_async``."""
    import relay.brokers.nats as nats_adapter

    monkeypatch.setattr(nats_adapter, "_frames_supported", lambda nc: False)
    harness = NatsHarness()
    envelopes = [make_envelope(key=f"k{i % 3}", seq=i // 3 + 1) for i in range(9)]

    async def body() -> None:
        results = await publish_once(harness.publisher(), envelopes)
        assert results == [None] * 9
        assert await harness.read(9) == envelopes

    run_harness(harness, body)
