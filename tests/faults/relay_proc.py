"""``outbox relay`` with a destination map, for the fault suite's brokers whose URL cannot name
the destination (AMQP 1.0: each topic's address).

    python relay_proc.py DATABASE_URL BROKER_URL DESTINATIONS_JSON LEASE_SECONDS

The rest of the configuration comes from the ``OUTBOX_RELAY_*`` environment, as for the CLI;
the adapter's budget is the CLI's (relay.cli.make_publisher). Exits on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import json
import sys

from relay import Relay, RelayConfig
from relay._logs import configure_logging
from relay.brokers import publisher_for_url


async def main(url: str, broker: str, destinations: dict[str, str], lease: float) -> None:
    configure_logging("info", "text")
    config = RelayConfig.load(
        None, database_url=url, broker_url=broker, lease_seconds=lease, poll_interval=0.2,
        batch_size=100,
    )  # fmt: skip
    budget = min(config.publish_timeout, config.lease_seconds * 0.9)
    publisher = publisher_for_url(broker, destinations=destinations,
                                  ack_timeout=round(budget * 0.8, 3))  # fmt: skip
    relay = Relay(config, publisher)
    relay.install_signal_handlers()
    await relay.run()


if __name__ == "__main__":
    url, broker, destinations, lease = sys.argv[1:5]
    asyncio.run(main(url, broker, json.loads(destinations), float(lease)))
