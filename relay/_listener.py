"""Wake-ups: a dedicated connection LISTENs on the outbox's channel and wakes the claim loop.

Every call on it is bounded: on a half-open TCP connection (a peer or middlebox gone without a
FIN) an unbounded ``SELECT 1`` would wait forever, leaving the relay on its fallback poll
without a word in the log. Notifications sent while it was away are lost, so every (re)connect wakes
the loop once: the claim that follows finds what they announced.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from relay._connection import keep_connected
from relay._retry import Backoff
from relay._state import RunState
from relay._statements import relay_statements

__all__ = ["Listener"]


class Listener:
    def __init__(self, dsn: str, heartbeat_interval: float, state: RunState) -> None:
        self._dsn = dsn
        self._interval = heartbeat_interval
        self._state = state

    async def run(self) -> None:
        await keep_connected(
            self._dsn, self._state, max(self._interval, 1.0), "listener", self._listen
        )

    async def _listen(self, conn: psycopg.AsyncConnection[Any], backoff: Backoff) -> None:
        state = self._state
        bound = max(self._interval, 1.0)
        stmts = relay_statements(None)  # no table: the schema does not matter
        try:
            async with asyncio.timeout(bound):
                await conn.execute(stmts.listen)
            backoff.succeeded()
            state.listening = True
            state.notified()  # notifications sent while we were away are lost: look now
            while not state.stopping:
                async for _ in conn.notifies(timeout=self._interval):
                    state.notified()
                async with asyncio.timeout(bound):
                    await conn.execute(stmts.ping)  # detect a dead connection
        finally:
            state.listening = False
