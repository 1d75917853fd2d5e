"""What the relay sends is what the inbox decodes, byte for byte, live on each broker.

One test per feature of the envelope, run through every adapter: the adapter publishes an
envelope that exercises the feature; the broker's own client fetches it back; the message as
received equals what ``outbox.wire.<broker>.encode`` says is sent (headers, ids, key, content
type, body bytes), and ``outbox.wire.<broker>.decode`` (the inbox consumers' decoder) returns
the very envelope that was published.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import pytest

from outbox.envelope import Envelope
from tests.contract.contract_harness import Harness

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _env(**fields: Any) -> Envelope:
    base: dict[str, Any] = {"id": uuid.uuid4(), "topic": "t", "key": "k", "seq": 1,
                            "payload": b'{"n":1}'}  # fmt: skip
    return Envelope(**{**base, **fields})


FEATURES: dict[str, Any] = {
    "id-and-dedup-id": lambda: _env(id=uuid.UUID("0192f5a4-7b3c-7d2e-8f10-123456789abc")),
    "unicode-key": lambda: _env(key="commande/été 42 ✓"),
    "large-seq": lambda: _env(seq=2**62 + 7),
    "content-type": lambda: _env(content_type="application/vnd.acme.order+protobuf"),
    "trace-context": lambda: _env(traceparent=TRACEPARENT),
    "created-at": lambda: _env(
        created_at=dt.datetime(2026, 11, 25, 1, 2, 3, 456789, tzinfo=dt.UTC)
    ),
    "user-headers": lambda: _env(headers={"tenant": "acme", "X-Reason": "re-sent ü", "empty": ""}),
    "binary-body": lambda: _env(
        payload=bytes(range(256)) * 3, content_type="application/octet-stream"
    ),
    "empty-body": lambda: _env(payload=b"", content_type="text/plain"),
}


@pytest.mark.parametrize("feature", list(FEATURES))
def test_wire_round_trip(wire_adapter: Harness, feature: str) -> None:
    sent: Envelope = FEATURES[feature]()

    async def body() -> None:
        await wire_adapter.open()
        try:
            pub = wire_adapter.publisher()
            await pub.start()
            try:
                assert await pub.publish_batch([sent]) == [None]
            finally:
                await pub.close()
            (received,) = await wire_adapter.fetch(1)
        finally:
            await wire_adapter.cleanup()
        assert received == wire_adapter.encode(sent), "the broker delivered other bytes"
        assert wire_adapter.decode(received) == sent

    asyncio.run(body())
