"""Number and record what the outbox's ledger holds, as a relay does, for tests that read
outbox_messages or claim rows without a relay running.

Every writer puts a message in the ledger (outbox_wal_pending); in 'polling' mode the relays'
ledger reader gives it its per-(topic, key) seq after commit and records it in outbox_messages
(relay/_ledger.py). :func:`record` runs that reader once (``relay._ledger.record_ledger``):
when a running relay is numbering at that moment it leaves the rest to it, and in 'wal' mode
it does nothing (the streaming relay records them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import psycopg

from relay import RelayConfig
from relay._ledger import record_ledger
from relay._statements import relay_statements

__all__ = ["record"]


def record(url: str, schema: str | None = None) -> int:
    """Number and record what the ledger holds now; how many messages."""

    async def go() -> int:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            config = RelayConfig(url, schema=schema)
            return await record_ledger(conn, relay_statements(schema), config)

    # in a thread of its own: callers may be inside a running event loop
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(go())).result()
