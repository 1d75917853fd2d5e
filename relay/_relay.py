"""The relay daemon: claim batches and hand them to the dispatcher, many in flight; start-up
checks; clean shutdown.

Its parts, each owning one job: :class:`~relay._dispatch.Dispatcher` (send, decide, mark,
outages), :class:`~relay._registration.Registration` (the relay's row, heartbeat, retention),
:class:`~relay._listener.Listener` (wake-ups), :class:`~relay._capture.WalCapture` (the WAL
capture mode), :mod:`relay._retry` (every backoff), :class:`~relay._state.RunState` (stop and
wake signals).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from outbox.exceptions import ConfigurationError
from outbox.kit import (
    connect_failure,
    describe_database_error,
    redact,
    redact_library_logs,
    remember_secrets,
    schema_not_installed,
)
from relay._capture import WalCapture
from relay._claim import Claim, claim_batch, relay_session, resume_point
from relay._config import RelayConfig
from relay._dispatch import Dispatcher
from relay._ledger import LedgerReader
from relay._listener import Listener
from relay._metrics import RelayMetrics
from relay._origin import read_origin
from relay._registration import Registration
from relay._retry import DB_BACKOFF, Backoff, retry
from relay._state import RunState
from relay._statements import relay_statements
from relay._watch import CommitWatch
from relay.brokers.base import Publisher

__all__ = ["Relay"]

log = logging.getLogger("relay")

#: seconds a connection attempt may take at start-up (a host that drops packets never answers)
_CONNECT_BOUND = 10.0


class Relay:
    """Publishes committed outbox messages through ``publisher``, in per-key order.

    ``await relay.run()`` runs until :meth:`stop` (or SIGTERM/SIGINT with
    :meth:`install_signal_handlers`). The relay calls ``publisher.start()`` first and
    ``publisher.close()`` at the end.
    """

    def __init__(
        self,
        config: RelayConfig,
        publisher: Publisher,
        *,
        metrics: RelayMetrics | None = None,
        gate: asyncio.Semaphore | None = None,
        pool_size: int | None = None,
    ) -> None:
        _check_ack_timeout(config, publisher)
        remember_secrets(config.database_url, config.broker_url)  # masked in every output
        redact_library_logs()
        self.config = config
        self.publisher = publisher
        self.metrics = metrics or RelayMetrics.disabled()
        self.stmts = relay_statements(config.schema)
        self.state = RunState()
        self.dispatcher = Dispatcher(config, publisher, self.metrics, self.stmts, self.state)
        self.registration = Registration(
            config, self.stmts, self.metrics, self.state, self.dispatcher.destinations.snapshot
        )
        #: consecutive database failures of the start-up checks and the claims
        self.db_backoff = Backoff.of(DB_BACKOFF)
        self._inflight: set[asyncio.Task[None]] = set()
        self._after = ("", "")  # the claim rotates over keys from here
        #: tokens of this process's claims not marked yet: what a shutdown gives back
        self._open_claims: set[uuid.UUID] = set()
        #: the LISTEN connection's DSN (tests put a proxy here)
        self.listen_dsn = config.database_url
        self.capture: WalCapture | None = None
        #: the commit watch ('polling' mode wake-ups; None with watch = false)
        self.watch: CommitWatch | None = None
        self._capture_task: asyncio.Task[None] | None = None
        #: set once run() has found its tables, registered and connected to the broker: the
        #: relay is publishing (``outbox.fastapi.consumer_lifespan`` waits for it)
        self.ready = asyncio.Event()
        #: registered under its relay id: it started, so it says when it stops
        self._registered = False
        #: shared by the relays of one process serving many databases (relay/_fleet.py): held
        #: from a claim to its batch's marks, so that at most its size of them work at once
        self.gate = gate
        #: most connections of its pool (None: max_in_flight + 3); a relay serving many
        #: databases keeps each one's small
        self.pool_size = pool_size

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; in-flight batches finish (or are released) and run() returns."""
        self.state.stop()

    @property
    def stopping(self) -> bool:
        return self.state.stopping

    @property
    def last_db_ok(self) -> float:
        """Monotonic time of the database's last answer (0.0: none yet)."""
        return self.state.last_db_ok

    @property
    def in_flight(self) -> int:
        """Claimed batches being published or marked now."""
        return len(self._inflight)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("relay %s: %s received, stopping", self.config.relay_id, sig.name)
        self.stop()

    async def run(self) -> None:
        """Relay until stopped. Never raises for broker or database outages: it retries.

        Raises SchemaNotInstalledError at once when the database answers but the outbox tables
        are missing (or too old), RelayIdInUseError when another live relay process has
        registered this relay id, and ConfigurationError when the database can never answer
        (it does not exist, the login is refused, the URL is malformed): retrying would not
        help.
        """
        await self._wait_for_database()
        if self.state.stopping:  # stopped while the database was still unreachable: it never
            return  # started, so no "stopped" line (it would read as another relay's news)
        pool = AsyncConnectionPool(
            self.config.database_url,
            min_size=1,
            max_size=self.pool_size or self.config.max_in_flight + 3,
            kwargs={"autocommit": True},
            configure=relay_session,
            open=False,
            name=f"relay-{self.config.relay_id}",
        )
        await pool.open(wait=False)
        background: list[asyncio.Task[None]] = []
        try:
            await self._check_schema(pool)
            if self.dispatcher.origin is None:
                self.dispatcher.origin = await self._read_origin(pool)
            await self.registration.register(pool, self.db_backoff)
            if self.state.stopping:
                return
            self._registered = True
            await self._announce(pool)
            background.append(asyncio.create_task(self.registration.heartbeat(pool)))
            if self.config.listen:
                listener = Listener(self.listen_dsn, self.config.heartbeat_interval, self.state)
                background.append(asyncio.create_task(listener.run()))
            if self.config.watch:
                self.watch = CommitWatch(
                    self.config.database_url,
                    self.stmts,
                    self.state,
                    interval=self.config.watch_interval,
                    idle_interval=self.config.watch_idle_interval,
                    bound=max(self.config.heartbeat_interval, 1.0),
                )
                background.append(asyncio.create_task(self.watch.run()))
            await self._start_publisher(pool)
            self.ready.set()
            # 'wal' mode: stream the slot too (it waits while the database polls)
            capture = WalCapture(self.config, pool, self.stmts, self.dispatcher, self.state)
            self.capture = capture
            self._capture_task = asyncio.create_task(capture.run())
            background.append(self._capture_task)
            # 'polling' mode: number what the ledger holds (it waits while the slot streams)
            reader = LedgerReader(self.config, pool, self.stmts, self.state, capture)
            background.append(asyncio.create_task(reader.run()))
            await self._loop(pool)
        finally:
            await self._shutdown(pool, background)

    async def _wait_for_database(self) -> None:
        """Connect once before the pool opens (the pool would retry anything, twice a second).

        A failure that no retry can heal (the database does not exist, the login is refused,
        the URL is malformed) raises ConfigurationError at once, in one line with the hint the
        other commands give. One that can heal (refused, no answer, starting up or shutting
        down, out of connection slots) is retried with the database backoff, logged once per
        change of reason rather than per attempt.
        """
        last: str | None = None
        while not self.state.stopping:
            try:
                async with asyncio.timeout(_CONNECT_BOUND):
                    conn = await psycopg.AsyncConnection.connect(self.config.database_url)
            except (psycopg.Error, TimeoutError) as exc:
                if isinstance(exc, psycopg.Error) and connect_failure(exc) is not None:
                    raise ConfigurationError(
                        f"the relay cannot use its database: {describe_database_error(exc)}"
                    ) from None  # the driver's text is in the line, masked
                reason = " ".join(redact(exc).split()) or f"no answer within {_CONNECT_BOUND:g}s"
                delay = self.db_backoff.failed()
                if reason != last:
                    log.warning(
                        "relay: database unreachable (%s); retrying with backoff until it answers",
                        reason,
                    )
                last = reason
                await self.state.sleep(delay)
                continue
            await conn.close()
            if last is not None:
                log.info("relay: database reachable again")
            self.db_backoff.succeeded()
            return

    async def _check_schema(self, pool: AsyncConnectionPool[Any]) -> None:
        """Wait for the database, then fail fast if the relay's tables are not installed."""

        async def probe() -> tuple[Any, ...]:
            async with pool.connection(timeout=self.config.poll_interval * 5) as conn:
                cur = await conn.execute(self.stmts.tables_present)
                return await cur.fetchone() or (False, False)

        row = await retry("schema check", probe, self.db_backoff, state=self.state)
        if row is None:
            return
        tables, leases = row
        if not (tables and leases):
            raise schema_not_installed(
                self.config.schema,
                "do not exist"
                if not tables
                else "predate this relay (its lease columns, its write counter)",
                then="then start the relay",
            )

    async def _read_origin(self, pool: AsyncConnectionPool[Any]) -> str | None:
        """The database's origin (relay/_origin.py), retried while the database is away."""

        async def read() -> str | None:
            async with pool.connection(timeout=self.config.poll_interval * 5) as conn:
                return await read_origin(conn, self.stmts.origin)

        return await retry("reading the origin", read, self.db_backoff, state=self.state)

    async def _announce(self, pool: AsyncConnectionPool[Any]) -> None:
        """The one line that says what this relay does: id, mode, broker, destinations,
        metrics address."""
        mode = "polling"
        with contextlib.suppress(Exception):
            async with pool.connection(timeout=5) as conn:
                cur = conn.cursor(row_factory=dict_row)
                row = await (await cur.execute(self.stmts.capture_mode)).fetchone()
                mode = str(row["mode"]) if row else mode
        cfg = self.config
        routes = ", ".join(f"{t} -> {d}" for t, d in cfg.destinations.items())
        metrics = (
            f"http://{cfg.metrics_host}:{cfg.metrics_port}/metrics"
            if cfg.metrics_port is not None
            else "off"
        )
        log.info(
            "relay %s started: mode %s, broker %s, destinations %s, schema %s, metrics %s",
            cfg.relay_id,
            mode,
            redact(cfg.broker_url) if cfg.broker_url else type(self.publisher).__name__,
            routes or "the topic names",
            cfg.schema or "the search_path",
            metrics,
        )

    async def _show_broker_state(self, pool: AsyncConnectionPool[Any]) -> None:
        """Write the broker's new state to our row now (``outbox status`` shows it), not at
        the next heartbeat."""
        self.metrics.broker_changed.set(self.state.broker_since)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5), pool.connection(timeout=3) as conn:
                await self.registration.refresh(conn)

    async def _start_publisher(self, pool: AsyncConnectionPool[Any]) -> None:
        async def start() -> None:
            # the attempt itself ends when the relay stops (a host that drops packets would
            # hold it for the whole connect timeout)
            attempt = asyncio.ensure_future(self.publisher.start())
            stop = asyncio.ensure_future(self.state.stopped())
            try:
                await asyncio.wait([attempt, stop], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            if not attempt.done():
                attempt.cancel()
                with contextlib.suppress(BaseException):
                    await attempt
                return
            try:
                attempt.result()
            except Exception as exc:
                self.metrics.broker_unreachable.set(1)
                if self.state.broker_seen(False, redact(str(exc) or type(exc).__name__)):
                    await self._show_broker_state(pool)
                raise
            self.metrics.broker_unreachable.set(0)
            if self.state.broker_seen(True):
                await self._show_broker_state(pool)

        await retry("connecting to the broker", start, Backoff.of((0.05, 10.0)), state=self.state)

    async def _shutdown(
        self, pool: AsyncConnectionPool[Any], tasks: list[asyncio.Task[None]]
    ) -> None:
        self.state.stop()
        # everything below fits in shutdown_timeout, also while the broker is down
        end = time.monotonic() + self.config.shutdown_timeout

        def left(at_most: float) -> float:
            return max(0.1, min(at_most, end - time.monotonic()))

        if self._inflight:
            _, pending = await asyncio.wait(self._inflight, timeout=self.config.shutdown_timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._capture_task is not None:  # it ends its batch (sent, recorded, confirmed)
            await asyncio.wait([self._capture_task], timeout=left(self.config.shutdown_timeout))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(left(5)), pool.connection(timeout=left(3)) as conn:
                if self._open_claims:  # only our own claims: another process may share the id
                    cur = await conn.execute(
                        self.stmts.release_owner,
                        {"owner": self.config.relay_id, "tokens": list(self._open_claims)},
                    )
                    if cur.rowcount:
                        log.info("relay: released %d leased rows at shutdown", cur.rowcount)
                await self.registration.unregister(conn)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(left(self.config.shutdown_timeout)):
                await self.publisher.close()
        await pool.close(timeout=left(5))
        if self._registered:  # a relay that never started (its id in use, no tables) says
            # nothing here: its error says why
            log.info("relay %s stopped", self.config.relay_id)

    # -- the loop ----------------------------------------------------------------------------

    async def _loop(self, pool: AsyncConnectionPool[Any]) -> None:
        slots = asyncio.Semaphore(self.config.max_in_flight)
        state = self.state
        while not state.stopping:
            await slots.acquire()
            if state.stopping:
                slots.release()
                break
            pause = self.dispatcher.paused_until - time.monotonic()
            if pause > 0:  # the broker is down: probe again after the backoff
                slots.release()
                await state.sleep(pause)
                continue
            state.wake.clear()  # a wake-up during the claim below keeps it set
            if self.gate is not None:
                await self.gate.acquire()
                if state.stopping:
                    self._open_gate()
                    slots.release()
                    break
            claim = await self.claim(pool)
            if claim is None:
                self._open_gate()
                slots.release()
                await state.wait_for_work(self.config.poll_interval)
                continue
            self._open_claims.add(claim.token)
            task = asyncio.create_task(self._process(pool, claim))
            self._inflight.add(task)
            task.add_done_callback(lambda t: self._done(t, slots))

    def _open_gate(self) -> None:
        if self.gate is not None:
            self.gate.release()

    def _done(self, task: asyncio.Task[None], slots: asyncio.Semaphore) -> None:
        self._inflight.discard(task)
        self._open_gate()
        slots.release()
        self.state.wake.set()  # the batch's keys may have new heads now
        if not task.cancelled() and task.exception() is not None:
            log.error("relay: batch failed unexpectedly", exc_info=task.exception())

    async def claim(self, pool: AsyncConnectionPool[Any]) -> Claim | None:
        """Lease the next batch; None when there is nothing to claim or the database failed
        (after the database backoff's wait)."""
        try:
            async with pool.connection(timeout=self.config.poll_interval * 5) as conn:
                started = time.perf_counter()
                paused = self.dispatcher.destinations.paused()
                claim = await claim_batch(conn, self.stmts, self.config, self._after, paused)
                self._after = resume_point(claim, self.config)
                self.metrics.claim_seconds.observe(time.perf_counter() - started)
        except Exception as exc:
            delay = self.db_backoff.failed()
            log.warning("relay: claim failed (%s); retrying in %.1fs", exc, delay)
            await self.state.sleep(delay)
            return None
        self.db_backoff.succeeded()
        self.state.db_ok()
        return claim

    async def _process(self, pool: AsyncConnectionPool[Any], claim: Claim) -> None:
        await self.dispatcher.process(pool, claim)
        # Marked (or its marks gave up and the lease will lapse): nothing left to release. A
        # batch cancelled or failed on the way keeps its token for the shutdown's release.
        self._open_claims.discard(claim.token)


def _check_ack_timeout(config: RelayConfig, publisher: Publisher) -> None:
    """Refuse an adapter that may keep a message longer than the relay waits for it.

    When the relay's budget for a batch ends, it releases the rows and another relay may
    publish them and the key's later rows. A message the adapter's client still holds (Kafka's
    librdkafka keeps it until ``message.timeout.ms``) could then reach the broker after them.
    The budget is ``publish_timeout``, and never more than the 90 % of the lease a claim has.
    """
    features = getattr(publisher, "features", None)
    ack = getattr(features, "ack_timeout_seconds", None)
    budget = min(config.publish_timeout, config.lease_seconds * 0.9)
    if ack is None or ack < budget:
        return
    name = getattr(features, "name", type(publisher).__name__)
    raise ConfigurationError(
        f"the {name} adapter's ack timeout ({ack:g}s) must be shorter than the relay's publish "
        f"budget ({budget:g}s: publish_timeout {config.publish_timeout:g}s, at most 90% of "
        f"lease_seconds {config.lease_seconds:g}s), or a message it still holds after the relay "
        "released its rows could reach the broker after the key's later messages: lower the "
        "adapter's timeout option or raise publish_timeout (and lease_seconds)",
        setting="publish_timeout",
        ack_timeout=ack,
        publish_budget=budget,
    )
