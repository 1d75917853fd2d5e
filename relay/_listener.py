"""Wake-ups: a dedicated connection LISTENs on the outbox's channel and wakes the claim loop.

Every call on it is bounded: on a half-open TCP connection (a peer or middlebox gone without a
FIN) a plain ``SELECT 1`` waited forever, and the relay was left on its fallback poll without
a word in the log. Notifications sent while it was away are lost, so every (re)connect wakes
the loop once: the claim that follows finds what they announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg

from outbox._statements import WAKEUP_CHANNEL
from relay._retry import DB_BACKOFF, Backoff
from relay._state import RunState

__all__ = ["Listener"]

log = logging.getLogger("relay")


class Listener:
    def __init__(self, dsn: str, heartbeat_interval: float, state: RunState) -> None:
        self._dsn = dsn
        self._interval = heartbeat_interval
        self._state = state

    async def run(self) -> None:
        backoff = Backoff.of(DB_BACKOFF)
        bound = max(self._interval, 1.0)
        state = self._state
        while not state.stopping:
            try:
                async with asyncio.timeout(bound):
                    conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
            except (psycopg.Error, TimeoutError) as exc:
                delay = backoff.failed()
                log.warning(
                    "relay: listener cannot connect (%s); retrying in %.1fs",
                    exc or "timed out",
                    delay,
                )
                await state.sleep(delay)
                continue
            try:
                async with asyncio.timeout(bound):
                    await conn.execute(f"LISTEN {WAKEUP_CHANNEL}")
                backoff.succeeded()
                state.listening = True
                state.wake.set()  # notifications sent while we were away are lost: poll now
                while not state.stopping:
                    async for _ in conn.notifies(timeout=self._interval):
                        state.wake.set()
                    async with asyncio.timeout(bound):
                        await conn.execute("SELECT 1")  # detect a dead connection
            except TimeoutError:
                log.warning(
                    "relay: listener connection did not answer within %.1fs (half-open TCP "
                    "connection?); reconnecting, wake-ups rely on poll_interval meanwhile",
                    bound,
                )
            except psycopg.Error as exc:
                log.warning("relay: listener connection lost (%s); reconnecting", exc)
            finally:
                state.listening = False
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(bound):
                        await conn.close()
