"""The relay's row in ``outbox_relays``: who runs under a relay id, and the upkeep it does
on every heartbeat (refresh the row, the backlog gauges, retention).

A relay id belongs to one live process at a time: registration refuses an id whose row was
refreshed by another process within the liveness window, and a relay's shutdown removes only
its own row (told apart by a per-process instance id).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from outbox.kit import redact
from relay._config import RelayConfig
from relay._metrics import RelayMetrics
from relay._retry import Backoff, retry
from relay._state import RunState
from relay._statements import RelayStatements
from relay.exceptions import RelayIdInUseError

__all__ = ["Registration"]

log = logging.getLogger("relay")


class Registration:
    """Registers the process, keeps its heartbeat and does the periodic upkeep."""

    def __init__(
        self,
        config: RelayConfig,
        stmts: RelayStatements,
        metrics: RelayMetrics,
        state: RunState,
        paused_destinations: Callable[[], object],
    ) -> None:
        self.config = config
        self._stmts = stmts
        self._metrics = metrics
        self._state = state
        self._paused_destinations = paused_destinations
        #: tells this process's outbox_relays row from another process's with the same id
        self.instance = uuid.uuid4().hex

    def row(self) -> dict[str, Any]:
        """The registration's parameters (``outbox status`` shows the config part)."""
        cfg = self.config
        config = {
            "broker": redact(cfg.broker_url) if cfg.broker_url else None,
            "batch_size": cfg.batch_size,
            "lease_seconds": cfg.lease_seconds,
            "instance": self.instance,
            # topics whose destination refuses messages: `outbox status` shows them
            "paused_destinations": self._paused_destinations(),
            # whether the broker answered (None: not tried yet), since when, and why not
            "broker_reachable": self._state.broker_up,
            "broker_since": time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._state.broker_since)
            ),
            "broker_error": self._state.broker_error,
        }
        return {
            "relay_id": cfg.relay_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "config": json.dumps(config),
            # a registration older than a lease (and a few heartbeats) belongs to a relay that
            # is gone or stalled: its leases have lapsed, so the id may be taken over
            "live_seconds": max(cfg.lease_seconds, cfg.heartbeat_interval * 3),
        }

    async def register(self, pool: AsyncConnectionPool[Any], backoff: Backoff) -> None:
        """Register this process under its relay id (waiting for the database); raise
        :class:`RelayIdInUseError` for an id that a live relay uses."""

        async def attempt() -> tuple[bool, Any]:
            async with pool.connection(timeout=5) as conn:
                if await self.refresh(conn):
                    return True, None
                cur = await conn.execute(
                    self._stmts.relay_holder, {"relay_id": self.config.relay_id}
                )
                return False, await cur.fetchone()

        outcome = await retry("registration", attempt, backoff, state=self._state)
        if outcome is None or outcome[0]:
            return
        holder = outcome[1]
        host, pid, silent = holder if holder is not None else ("?", "?", 0.0)
        raise RelayIdInUseError(
            f"relay id {self.config.relay_id!r} is in use by a live relay (host {host}, pid "
            f"{pid}, last heartbeat {silent:.1f}s ago): give every relay process its own id "
            "(omit --relay-id / relay_id for a unique default), or stop that relay first",
            relay_id=self.config.relay_id,
            hostname=host,
            pid=pid,
        )

    async def refresh(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Write our row (or refresh its heartbeat); False when another live process has it."""
        cur = await conn.execute(self._stmts.register, self.row())
        return await cur.fetchone() is not None

    async def unregister(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(
            self._stmts.unregister,
            {"relay_id": self.config.relay_id, "instance": self.instance},
        )

    async def heartbeat(self, pool: AsyncConnectionPool[Any]) -> None:
        """Until stopped, every ``heartbeat_interval``: refresh the row and the backlog
        gauges, and delete old published rows every ``retention_interval``."""
        next_retention = time.monotonic()
        while not self._state.stopping:
            try:
                async with pool.connection(timeout=5) as conn:
                    if not await self.refresh(conn):
                        log.error(
                            "relay: relay id %r was taken over by another live relay while our "
                            "heartbeat lapsed; give every relay process its own id",
                            self.config.relay_id,
                        )
                    await self._metrics.refresh_backlog(conn, self._stmts)
                    if self.config.retention_seconds and time.monotonic() >= next_retention:
                        await self._retention(conn)
                        next_retention = time.monotonic() + self.config.retention_interval
                self._state.db_ok()
                self._metrics.heartbeat.set(time.time())
            except Exception as exc:
                log.warning("relay: heartbeat failed (%s)", redact(exc))
            await self._state.sleep(self.config.heartbeat_interval)

    async def _retention(self, conn: psycopg.AsyncConnection[Any]) -> None:
        total = 0
        while not self._state.stopping:
            cur = await conn.execute(
                self._stmts.retention,
                {
                    "keep_seconds": self.config.retention_seconds,
                    "limit": self.config.retention_batch,
                },
            )
            total += cur.rowcount
            if cur.rowcount < self.config.retention_batch:
                break
        if total:
            log.info("relay: retention deleted %d published rows", total)
