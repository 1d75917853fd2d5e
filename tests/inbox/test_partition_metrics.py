"""A partitioned consumer reports its partition count and how many partitions each process holds
(``inbox_partitions``, ``inbox_partitions_owned``): two members split six partitions, and once
one leaves, the other holds all six. Real PostgreSQL leases; the partitions' consumers are idle
stand-ins (what they consume is tests/inbox/test_inbox_partitioned.py's)."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, InboxMetrics, Lease, PartitionedConsumer
from inbox.brokers import BrokerConsumer
from tests.support.poll import await_for

PARTITIONS = 6
LEASE = Lease(duration=5.0, heartbeat=0.3, stop_timeout=1.5, stall=3.0)


class _Idle(BrokerConsumer):
    """A partition's consumer that receives nothing until stopped."""

    async def _consume(self) -> None:
        self.ready.set()
        await self._stopping.wait()


def _owned(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("inbox_partitions_owned", {"consumer": "svc"})


async def _handler(_conn: Any, _message: Any) -> None:
    return None


def test_each_process_reports_the_partitions_it_holds(database_url: str) -> None:
    asyncio.run(_two_members(database_url))


async def _two_members(database_url: str) -> None:
    registries = [CollectorRegistry(), CollectorRegistry()]
    async with AsyncConnectionPool(database_url, min_size=1, max_size=6, open=False) as pool:
        members = []
        for i, registry in enumerate(registries):
            runner = AsyncHandlerRunner(
                pool, _handler, consumer="svc", metrics=InboxMetrics.prometheus(registry)
            )
            member = PartitionedConsumer(
                runner, partitions=PARTITIONS, factory=lambda p, r: _Idle(r), lease=LEASE,
                member=f"m{i}",
            )  # fmt: skip
            members.append(member)
        tasks = [asyncio.create_task(m.run()) for m in members]
        try:
            await await_for(
                lambda: [_owned(r) for r in registries] == [3.0, 3.0], what="three each"
            )
            for registry in registries:
                count = registry.get_sample_value("inbox_partitions", {"consumer": "svc"})
                assert count == PARTITIONS
            members[1].stop()
            await asyncio.wait_for(tasks[1], 10)
            assert _owned(registries[1]) == 0.0  # it left
            await await_for(lambda: _owned(registries[0]) == 6.0, what="the other holds all six")
        finally:
            for m in members:
                m.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
