"""A polling relay wakes up on commits it watches for, with no NOTIFY from the writer.

Every relay here polls only every 60 s and does not LISTEN: within a test, only its commit
watch (relay/_watch.py) can wake it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest

from outbox import Message, publish, publish_batch
from relay import Relay
from tests.relay.relay_helpers import ClaimRounds, FakePublisher, await_for, config, running


def _relay(url: str) -> tuple[Relay, FakePublisher, ClaimRounds]:
    pub = FakePublisher()
    relay = Relay(config(url, poll_interval=60.0, listen=False), pub)
    return relay, pub, ClaimRounds(relay)


async def _idle(relay: Relay, rounds: ClaimRounds) -> None:
    """Past the first claim and with the watch reading: nothing else can wake it now."""
    await await_for(
        lambda: rounds.count >= 1 and relay.watch is not None and relay.watch.readings >= 3,
        what="the relay idle, its watch reading",
    )


def _woken(url: str, work: Callable[[], None], expected: int) -> list[str]:
    """Run ``work`` (it commits messages) beside an idle relay that only its watch can wake;
    the keys published, once ``expected`` messages are."""
    relay, pub, rounds = _relay(url)

    async def go() -> None:
        async with running(relay):
            await _idle(relay, rounds)
            await asyncio.to_thread(work)
            await await_for(
                lambda: len(pub.log) == expected, within=5.0, what="woken by the watch"
            )

    asyncio.run(go())
    return [env.key for _, env in pub.log]


def test_a_commit_wakes_the_relay_without_a_notification(url: str) -> None:
    def commit() -> None:
        with psycopg.connect(url) as conn:
            publish(conn, topic="t", key="k", payload=1)  # wakeup defaults to off
            conn.commit()

    assert _woken(url, commit, 1) == ["k"]


def test_a_writer_that_commits_long_after_publishing_is_seen(url: str) -> None:
    relay, pub, rounds = _relay(url)

    async def go() -> None:
        async with running(relay):
            await _idle(relay, rounds)
            watch = relay.watch
            assert watch is not None
            conn = await psycopg.AsyncConnection.connect(url)
            try:
                async with conn.cursor() as cur:
                    await cur.execute("SELECT 1")  # the transaction starts
                from outbox import publish_batch_async

                await publish_batch_async(conn, [Message(topic="t", key="late", payload=1)])
                # open across many readings: the watch has backed off to its idle interval
                seen = watch.readings
                await await_for(lambda: watch.readings >= seen + 10, what="ten more readings")
                assert pub.log == []
                await conn.commit()
            finally:
                await conn.close()
            await await_for(lambda: len(pub.log) == 1, within=5.0, what="the late commit seen")

    asyncio.run(go())


def test_a_sql_publish_wakes_the_relay(url: str) -> None:
    def commit() -> None:
        with psycopg.connect(url) as conn:
            conn.execute("SELECT outbox_publish('t', 'sql', '{\"n\": 1}'::jsonb)")
            conn.commit()

    assert _woken(url, commit, 1) == ["sql"]


def test_a_batch_and_a_rollback(url: str) -> None:
    def work() -> None:
        with psycopg.connect(url) as conn:
            publish_batch(conn, [Message(topic="t", key="gone", payload=0)])
            conn.rollback()
            publish_batch(conn, [Message(topic="t", key=f"b{i}", payload=i) for i in range(5)])
            conn.commit()

    assert sorted(_woken(url, work, 5)) == [f"b{i}" for i in range(5)]


def test_a_relay_refuses_a_database_without_the_write_counter(empty_database_url: str) -> None:
    from outbox._migrate import upgrade
    from outbox.exceptions import SchemaNotInstalledError

    upgrade(empty_database_url, revision="outbox_0011")  # before the commit watch's counter
    relay = Relay(config(empty_database_url), FakePublisher())
    with pytest.raises(SchemaNotInstalledError, match="predate this relay") as raised:
        asyncio.run(relay.run())
    assert "outbox migrate upgrade" in str(raised.value)
