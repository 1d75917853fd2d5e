"""Helpers for the relay tests: writing messages, a recording publisher, running relays.

A module of its own, not conftest.py: with ``pytest tests/relay tests/contract`` pytest loads
both folders' conftest.py first, and the last one would shadow ``from conftest import ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import psycopg

from outbox import Message, publish_batch
from outbox.envelope import Envelope
from relay import Relay, RelayConfig
from relay.brokers.base import BrokerFeatures
from tests.support.ledger import record as record  # re-exported
from tests.support.poll import await_for as await_for  # re-exported: the one poll-until helper
from tests.support.poll import wait_for as wait_for


def write(
    url: str, pairs: Sequence[tuple[str, str]], *, numbered: bool = True, **extra: Any
) -> list[uuid.UUID]:
    """Commit one message per (topic, key), in order, in one transaction. ``numbered``: then
    number and record them in outbox_messages, as a relay's ledger reader does (unless a
    running relay holds the capture lock: it records them), for tests that claim rows."""
    with psycopg.connect(url) as conn:
        msgs = [
            Message(topic=t, key=k, payload={"n": i}, **extra) for i, (t, k) in enumerate(pairs)
        ]
        ids = publish_batch(conn, msgs, wakeup=False)
        conn.commit()
    if numbered:
        record(url)
    return ids


def statuses(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return dict(
            conn.execute("SELECT status, count(*) FROM outbox_messages GROUP BY 1").fetchall()
        )


async def db_clock_past(url: str, query: str, within: float = 20.0) -> None:
    """Wait until the database's clock passes the time ``query`` returns (a lease's end, a
    retry's due time): the claim compares with that clock, so the test waits for it, not for a
    guessed interval of its own."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:

        async def passed() -> bool:
            row = await (await conn.execute(f"SELECT clock_timestamp() > ({query})")).fetchone()
            return row is not None and bool(row[0])

        await await_for(passed, within=within, what=f"the database clock to pass {query}")


class ClaimRounds:
    """Counts a relay's claim rounds, so a test that checks something does *not* happen can
    wait for the relay to have looked several times, instead of sleeping."""

    def __init__(self, relay: Relay) -> None:
        self.count = 0
        inner = relay.claim

        async def counted(pool: Any) -> Any:
            try:
                return await inner(pool)
            finally:
                self.count += 1

        relay.claim = counted  # type: ignore[method-assign]

    async def more(self, rounds: int = 3, within: float = 20.0) -> None:
        """Return once ``rounds`` more claims have finished."""
        target = self.count + rounds
        await await_for(lambda: self.count >= target, within, f"{rounds} more claim rounds")


class FakePublisher:
    """Records what it sends (shared log across relays); failures are injected per call."""

    features = BrokerFeatures("fake", 0.0, True, True, 0)

    def __init__(self, log: list[tuple[str, Envelope]] | None = None, name: str = "p") -> None:
        self.log: list[tuple[str, Envelope]] = [] if log is None else log
        self.name = name
        self.delay = 0.0
        #: called per envelope; returns an exception to report for it, or None
        self.fail: Callable[[Envelope], BaseException | None] = lambda env: None
        #: raise this from publish_batch (nothing attempted), e.g. broker down
        self.down: BaseException | None = None
        self.started = 0
        self.closed = 0
        self.calls = 0  # publish_batch calls, including those that raised

    async def start(self) -> None:
        self.started += 1

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        self.calls += 1
        if self.down is not None:
            raise self.down
        out: list[BaseException | None] = []
        if self.delay:
            await asyncio.sleep(self.delay)
        for env in envelopes:
            err = self.fail(env)
            if err is None:
                self.log.append((self.name, env))
            out.append(err)
        return out

    async def close(self) -> None:
        self.closed += 1


def config(url: str, **kw: Any) -> RelayConfig:
    defaults: dict[str, Any] = {
        "poll_interval": 0.1,
        "lease_seconds": 5.0,
        "publish_timeout": 2.0,
        "heartbeat_interval": 0.5,
        "shutdown_timeout": 3.0,
        "backoff_base": 0.05,
        "backoff_max": 0.2,
    }
    defaults.update(kw)
    return RelayConfig(database_url=url, **defaults)


@contextlib.asynccontextmanager
async def running(*relays: Relay) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.create_task(r.run()) for r in relays]
    try:
        yield tasks
    finally:
        for r in relays:
            r.stop()
        done, pending = await asyncio.wait(tasks, timeout=15)
        for t in done:
            t.result()  # re-raise a relay's crash in the test
        assert not pending, "relay did not stop within 15 s"


def per_key_in_order(log: Sequence[tuple[str, Envelope]]) -> bool:
    """Per (topic, key), the first publication of each seq comes in strictly increasing order."""
    seen: dict[tuple[str, str], int] = {}
    for _, env in log:
        key = (env.topic, env.key)
        last = seen.get(key, 0)
        if env.seq <= last:
            continue  # a re-send of something already out (at-least-once)
        if env.seq != last + 1:
            return False
        seen[key] = env.seq
    return True
