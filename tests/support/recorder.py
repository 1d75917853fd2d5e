"""A broker adapter for tests that keeps what the relay hands it and refuses payloads marked
``relay-poison`` for good (the trace tests' dead-at-the-relay state)."""

from __future__ import annotations

from collections.abc import Sequence

from outbox.envelope import Envelope
from relay import PermanentPublishError
from relay.brokers.base import BrokerFeatures


class Recorder:
    """A broker adapter that keeps what it is given; refuses payloads marked poison."""

    features = BrokerFeatures("recorder", 0.0, True, True, 0)

    def __init__(self) -> None:
        self.sent: list[Envelope] = []

    async def start(self) -> None:
        pass

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for env in envelopes:
            if b"relay-poison" in env.payload:
                out.append(PermanentPublishError("rejected by the broker"))
            else:
                self.sent.append(env)
                out.append(None)
        return out

    async def close(self) -> None:
        pass
