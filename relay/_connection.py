"""A connection of its own, kept up: what the LISTEN connection and the commit watch share.

Connecting and every statement on it are bounded (``bound`` seconds): on a half-open TCP
connection (a peer or middlebox gone without a FIN) an unbounded call waits forever, silently.
A failure or a silence is logged as a warning and followed by a reconnect, with the database
backoff between failed attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from relay._retry import DB_BACKOFF, Backoff
from relay._state import RunState

__all__ = ["keep_connected"]

log = logging.getLogger("relay")

Session = Callable[[psycopg.AsyncConnection[Any], Backoff], Awaitable[None]]


async def keep_connected(
    dsn: str, state: RunState, bound: float, what: str, session: Session
) -> None:
    """Run ``session`` on an autocommit connection to ``dsn`` until the relay stops,
    reconnecting whenever it fails. ``session`` calls ``backoff.succeeded()`` once it is set up.
    """
    backoff = Backoff.of(DB_BACKOFF)
    while not state.stopping:
        try:
            async with asyncio.timeout(bound):
                conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        except (psycopg.Error, TimeoutError) as exc:
            delay = backoff.failed()
            log.warning(
                "relay: %s cannot connect (%s); retrying in %.1fs", what, exc or "timed out", delay
            )
            await state.sleep(delay)
            continue
        try:
            await session(conn, backoff)
        except TimeoutError:
            log.warning(
                "relay: %s connection did not answer within %.1fs (half-open TCP connection?); "
                "reconnecting, wake-ups rely on poll_interval meanwhile",
                what,
                bound,
            )
        except psycopg.Error as exc:
            log.warning("relay: %s connection lost (%s); reconnecting", what, exc)
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(bound):
                    await conn.close()
