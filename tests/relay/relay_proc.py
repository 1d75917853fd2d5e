"""A relay in its own process, for kill -9 and SIGTERM tests.

usage: relay_proc.py DATABASE_URL OUTPUT_FILE LEASE_SECONDS PUBLISH_DELAY
Every envelope it publishes is appended to OUTPUT_FILE as "key seq relay_pid id" lines.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

from outbox.envelope import Envelope
from relay import Relay, RelayConfig
from relay.brokers.base import BrokerFeatures


class FilePublisher:
    features = BrokerFeatures("file", 0.0, True, True, 0)

    def __init__(self, path: str, delay: float) -> None:
        self.path = path
        self.delay = delay

    async def start(self) -> None:
        pass

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        await asyncio.sleep(self.delay)
        with open(self.path, "a") as f:  # noqa: ASYNC230 - a test sink
            for env in envelopes:
                f.write(f"{env.key} {env.seq} {os.getpid()} {env.id}\n")
        return [None] * len(envelopes)

    async def close(self) -> None:
        pass


async def main(url: str, out: str, lease: float, delay: float) -> None:
    config = RelayConfig(
        database_url=url,
        lease_seconds=lease,
        publish_timeout=min(lease * 0.8, delay + 5),
        poll_interval=0.1,
        batch_size=50,
        per_key_batch=10,
        max_in_flight=2,
        shutdown_timeout=5,
    )
    relay = Relay(config, FilePublisher(out, delay))
    relay.install_signal_handlers()
    print("ready", flush=True)
    await relay.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
