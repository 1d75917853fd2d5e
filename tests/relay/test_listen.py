"""The LISTEN connection notices a half-open TCP connection and listens again.

Its liveness check (``SELECT 1``) had no timeout: on a connection whose bytes stopped flowing
without a close it waited forever, and the relay woke up only at its fallback poll, silently.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox._statements import WAKEUP_CHANNEL
from relay import Relay
from tests.relay.broker_helpers import Proxy
from tests.relay.relay_helpers import FakePublisher, await_for, config, running, write


def _write_and_notify(url: str, key: str) -> None:
    write(url, [("t", key)])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"NOTIFY {WAKEUP_CHANNEL}")


def test_relay_listener_reconnects_after_its_connection_goes_half_open(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="relay")
    # poll_interval 60 s, no commit watch: within the test only a notification (or a listener
    # reconnect) wakes it
    publisher = FakePublisher()
    relay = Relay(config(url, poll_interval=60, heartbeat_interval=0.5, watch=False), publisher)
    target = int(conninfo_to_dict(url).get("port") or 5432)

    def published() -> set[str]:
        return {env.key for _, env in publisher.log}

    async def go() -> None:
        proxy = Proxy(target)
        await proxy.up()
        relay.listen_dsn = make_conninfo(url, host="127.0.0.1", port=proxy.port)
        try:
            async with running(relay):
                await await_for(lambda: proxy.accepted == 1, what="the listener connected")
                await asyncio.to_thread(_write_and_notify, url, "before")
                await await_for(lambda: published() == {"before"}, within=10, what="before")
                proxy.freeze()  # the listener's connection goes silent, nothing is closed
                await await_for(lambda: proxy.accepted == 2, within=10, what="a reconnect")
                await asyncio.to_thread(_write_and_notify, url, "after")
                await await_for(lambda: published() == {"before", "after"}, within=10, what="after")
        finally:
            await proxy.down()

    asyncio.run(go())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("listener connection did not answer within 1.0s" in m for m in warnings), warnings
