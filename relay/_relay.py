"""The relay daemon's loop: wake, claim, publish, mark; many claims in flight; clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from outbox._statements import WAKEUP_CHANNEL
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError, SchemaNotInstalledError
from relay._capture import WalCapture
from relay._claim import (
    Claim,
    Outcome,
    claim_batch,
    decide,
    mark_batch,
    relay_session,
    resume_point,
)
from relay._config import RelayConfig
from relay._destinations import PausedDestinations
from relay._metrics import RelayMetrics
from relay._queries import relay_statements
from relay._tracing import publish_span
from relay.brokers.base import Publisher
from relay.exceptions import (
    BrokerUnreachableError,
    DestinationUnavailableError,
    RelayIdInUseError,
    RetryablePublishError,
)

__all__ = ["Relay"]

_T = TypeVar("_T")

log = logging.getLogger("relay")

_DB_BACKOFF = (0.1, 5.0)
_BROKER_BACKOFF = (0.1, 10.0)


class Relay:
    """Publishes committed outbox messages through ``publisher``, in per-key order.

    ``await relay.run()`` runs until :meth:`stop` (or SIGTERM/SIGINT with
    :meth:`install_signal_handlers`). The relay calls ``publisher.start()`` first and
    ``publisher.close()`` at the end.
    """

    def __init__(
        self, config: RelayConfig, publisher: Publisher, *, metrics: RelayMetrics | None = None
    ) -> None:
        _check_ack_timeout(config, publisher)
        self.config = config
        self.publisher = publisher
        self.metrics = metrics or RelayMetrics.disabled()
        self._stmts = relay_statements(config.schema)
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._broker_failures = 0
        #: keys of the claims that failed entirely since the broker last acknowledged anything
        self._failing_keys: set[tuple[str, str]] = set()
        self._db_failures = 0
        self._paused_until = 0.0
        #: topics whose destination refuses messages: skipped by claims until their backoff ends
        self._destinations = PausedDestinations(config, self.metrics)
        self._after = ("", "")  # the claim rotates over keys from here
        #: tells this process's outbox_relays row from another process's with the same id
        self._instance = uuid.uuid4().hex
        #: tokens of this process's claims not marked yet: what a shutdown gives back
        self._open_claims: set[uuid.UUID] = set()
        self._listen_dsn = config.database_url  # the LISTEN connection's (tests put a proxy here)
        self.last_db_ok = 0.0
        self.capture: WalCapture | None = None
        self._capture_task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; in-flight batches finish (or are released) and run() returns."""
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

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
        are missing (or too old), and RelayIdInUseError when another live relay process has
        registered this relay id: retrying would not help.
        """
        pool = AsyncConnectionPool(
            self.config.database_url,
            min_size=1,
            max_size=self.config.max_in_flight + 3,
            kwargs={"autocommit": True},
            configure=relay_session,
            open=False,
            name=f"relay-{self.config.relay_id}",
        )
        await pool.open(wait=False)
        background: list[asyncio.Task[None]] = []
        try:
            await self._check_schema(pool)
            await self._register(pool)
            background.append(asyncio.create_task(self._heartbeat(pool)))
            if self.config.listen:
                background.append(asyncio.create_task(self._listen()))
            await self._start_publisher()
            # 'wal' mode: stream the slot too (it waits while the database polls)
            self.capture = WalCapture(self, pool)
            self._capture_task = asyncio.create_task(self.capture.run())
            background.append(self._capture_task)
            await self._loop(pool)
        finally:
            await self._shutdown(pool, background)

    async def _until_done(self, what: str, attempt: Callable[[], Awaitable[_T]]) -> _T | None:
        """``attempt()``'s result, retried with backoff while the database fails; None if the
        relay is stopped first."""
        while not self.stopping:
            try:
                result = await attempt()
            except Exception as exc:
                self._db_failures += 1
                delay = _backoff(self._db_failures, _DB_BACKOFF)
                log.warning("relay: %s failed (%s); retrying in %.1fs", what, exc, delay)
                await self._sleep(delay)
                continue
            self._db_failures = 0
            return result
        return None

    async def _check_schema(self, pool: AsyncConnectionPool[Any]) -> None:
        """Wait for the database, then fail fast if the relay's tables are not installed."""

        async def probe() -> tuple[Any, ...]:
            async with pool.connection(timeout=self.config.poll_interval * 5) as conn:
                cur = await conn.execute(self._stmts.tables_present)
                return await cur.fetchone() or (False, False)

        row = await self._until_done("schema check", probe)
        if row is None:
            return
        tables, leases = row
        if not (tables and leases):
            where = f"schema {self.config.schema!r}" if self.config.schema else "the search_path"
            missing = "do not exist" if not tables else "predate the relay's lease columns"
            raise SchemaNotInstalledError(
                f"the outbox tables in {where} {missing}: run `outbox migrate upgrade` "
                "(with --schema if you use one) against this database, then start the relay",
                schema=self.config.schema,
            )

    async def _start_publisher(self) -> None:
        delay = _BROKER_BACKOFF[0]
        while not self.stopping:
            try:
                await self.publisher.start()
                return
            except Exception as exc:
                log.warning("relay: broker unavailable (%s); retrying in %.1fs", exc, delay)
                await self._sleep(delay)
                delay = min(delay * 2, _BROKER_BACKOFF[1])

    async def _shutdown(
        self, pool: AsyncConnectionPool[Any], tasks: list[asyncio.Task[Any]]
    ) -> None:
        self._stopping.set()
        if self._inflight:
            _, pending = await asyncio.wait(self._inflight, timeout=self.config.shutdown_timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._capture_task is not None:  # it ends its batch (sent, recorded, confirmed)
            await asyncio.wait([self._capture_task], timeout=self.config.shutdown_timeout)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        relay_id = self.config.relay_id
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5), pool.connection(timeout=3) as conn:
                if self._open_claims:  # only our own claims: another process may share the id
                    cur = await conn.execute(
                        self._stmts.release_owner,
                        {"owner": relay_id, "tokens": list(self._open_claims)},
                    )
                    if cur.rowcount:
                        log.info("relay: released %d leased rows at shutdown", cur.rowcount)
                await conn.execute(
                    self._stmts.unregister, {"relay_id": relay_id, "instance": self._instance}
                )
        with contextlib.suppress(Exception):
            await self.publisher.close()
        await pool.close(timeout=5)
        log.info("relay %s stopped", self.config.relay_id)

    # -- the loop ----------------------------------------------------------------------------

    async def _loop(self, pool: AsyncConnectionPool[Any]) -> None:
        slots = asyncio.Semaphore(self.config.max_in_flight)
        while not self.stopping:
            await slots.acquire()
            if self.stopping:
                slots.release()
                break
            pause = self._paused_until - time.monotonic()
            if pause > 0:  # the broker is down: probe again after the backoff
                slots.release()
                await self._sleep(pause)
                continue
            self._wake.clear()  # a wake-up during the claim below keeps it set
            claim = await self._claim(pool)
            if claim is None:
                slots.release()
                await self._wait_for_work()
                continue
            self._open_claims.add(claim.token)
            task = asyncio.create_task(self._process(pool, claim))
            self._inflight.add(task)
            task.add_done_callback(lambda t: self._done(t, slots))

    def _done(self, task: asyncio.Task[None], slots: asyncio.Semaphore) -> None:
        self._inflight.discard(task)
        slots.release()
        self._wake.set()  # the batch's keys may have new heads now
        if not task.cancelled() and task.exception() is not None:
            log.error("relay: batch failed unexpectedly", exc_info=task.exception())

    async def _wait_for_work(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.poll_interval):
                await self._wake.wait()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _claim(self, pool: AsyncConnectionPool[Any]) -> Claim | None:
        try:
            async with pool.connection(timeout=self.config.poll_interval * 5) as conn:
                started = time.perf_counter()
                paused = self._destinations.paused()
                claim = await claim_batch(conn, self._stmts, self.config, self._after, paused)
                self._after = resume_point(claim, self.config)
                self.metrics.claim_seconds.observe(time.perf_counter() - started)
        except (psycopg.Error, Exception) as exc:
            if isinstance(exc, asyncio.CancelledError):  # pragma: no cover
                raise
            self._db_failures += 1
            delay = _backoff(self._db_failures, _DB_BACKOFF)
            log.warning("relay: claim failed (%s); retrying in %.1fs", exc, delay)
            await self._sleep(delay)
            return None
        self._db_failures = 0
        self.last_db_ok = time.monotonic()
        return claim

    async def _process(self, pool: AsyncConnectionPool[Any], claim: Claim) -> None:
        await self._process_claim(pool, claim)
        # Marked (or its marks gave up and the lease will lapse): nothing left to release. A
        # batch cancelled or failed on the way keeps its token for the shutdown's release.
        self._open_claims.discard(claim.token)

    async def _process_claim(self, pool: AsyncConnectionPool[Any], claim: Claim) -> None:
        started = time.perf_counter()
        amo_ids = {e.id for e in claim.envelopes if self._amo(e.topic)}
        if amo_ids:
            # At-most-once: marked published *before* sending, never retried.
            marked = await self._mark(
                pool, claim, [Outcome(i, "published") for i in amo_ids], durable=True
            )
            amo_ids &= marked
        to_send = [e for e in claim.envelopes if e.id in amo_ids or not self._amo(e.topic)]
        results, unreachable = await self._publish(to_send, claim.deadline)
        by_id = dict(zip((e.id for e in to_send), results, strict=True))
        self._count_at_most_once(to_send, amo_ids, by_id)
        keep = [i for i, e in enumerate(claim.envelopes) if not self._amo(e.topic)]
        alo = Claim(
            claim.token,
            [claim.envelopes[i] for i in keep],
            [claim.attempts[i] for i in keep],
            claim.deadline,
        )
        alo_results = [by_id[e.id] for e in alo.envelopes]
        if any(r is None for r in results):
            self._failing_keys.clear()  # the broker acknowledged something: it is up
        self._note_destinations(to_send, results)
        # A destination that refuses messages is one topic's configuration, not an outage:
        # those rows are released by decide() and only their topic is paused.
        rest = [
            (e, r)
            for e, r in zip(alo.envelopes, alo_results, strict=True)
            if not isinstance(r, DestinationUnavailableError)
        ]
        outage = bool(rest) and self._outage([e for e, _ in rest], [r for _, r in rest])
        if alo.envelopes and (unreachable or outage):
            # The broker is down: give every row back untried and pause claiming, so an
            # outage never counts towards max_attempts or dead-letters anything.
            await self._mark(pool, claim, [Outcome(e.id, "release") for e in alo.envelopes])
            self._pause(alo_results[0])
            return
        outcomes = decide(alo, alo_results, self.config)
        await self._mark(pool, claim, outcomes)
        self._count(alo, outcomes)
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        lost = [r for r in results if isinstance(r, BrokerUnreachableError)]
        if lost:  # the connection dropped during the batch: those rows were released
            self._pause(lost[0])
        else:
            self._broker_failures = 0

    def _note_destinations(
        self, sent: Sequence[Envelope], results: Sequence[BaseException | None]
    ) -> None:
        """Pause the topics whose destination refused messages; resume those that took one."""
        refused: dict[str, BaseException] = {}
        for env, result in zip(sent, results, strict=True):
            if result is None:
                self._destinations.accepted(env.topic)
            elif isinstance(result, DestinationUnavailableError):
                refused.setdefault(env.topic, result)
        for topic, error in refused.items():
            self._destinations.refused(topic, error)

    def _pause(self, reason: BaseException | None) -> None:
        """Stop claiming for a while (exponential backoff): the broker is unreachable."""
        self._broker_failures += 1
        delay = _backoff(self._broker_failures, _BROKER_BACKOFF)
        log.warning("relay: broker unavailable (%s); pausing %.1fs", reason, delay)
        self._paused_until = time.monotonic() + delay

    def _count_at_most_once(
        self, sent: list[Envelope], amo_ids: set[Any], by_id: dict[Any, BaseException | None]
    ) -> None:
        for env in sent:
            if env.id not in amo_ids:
                continue
            if by_id[env.id] is None:
                self.metrics.published.labels(env.topic).inc()
            else:
                self.metrics.failed.labels(env.topic).inc()
                log.warning("relay: at-most-once message %s lost: %s", env.id, by_id[env.id])

    def _amo(self, topic: str) -> bool:
        return self.config.policy(topic).semantics == "at-most-once"

    def _outage(
        self, envelopes: Sequence[Envelope], results: Sequence[BaseException | None]
    ) -> bool:
        """The broker, not the messages: every message of this claim failed retryably, and so
        did every message of the claims before it since the last acknowledgement, over two or
        more keys together.

        One key alone never counts as an outage, so a message that fails on its own reaches
        ``max_attempts`` (or dead) even when it is the only one pending. At a low rate a claim
        often holds one key; the keys of consecutive failed claims add up.
        """
        if not all(isinstance(r, RetryablePublishError) for r in results):
            return False
        self._failing_keys.update((e.topic, e.key) for e in envelopes)
        return len(self._failing_keys) > 1

    async def _publish(
        self, envelopes: list[Envelope], deadline: float
    ) -> tuple[list[BaseException | None], bool]:
        """The broker's result per envelope, and whether the broker was unreachable.
        ``deadline``: the monotonic time after which nothing may be sent (a claim's lease)."""
        if not envelopes:
            return [], False
        budget = min(self.config.publish_timeout, deadline - time.monotonic())
        err: RetryablePublishError
        if budget <= 0:
            err = RetryablePublishError("lease about to lapse; not sent")
            return [err] * len(envelopes), True
        try:
            with publish_span(envelopes):
                async with asyncio.timeout(budget):
                    results = await self.publisher.publish_batch(envelopes)
        except TimeoutError:
            err = RetryablePublishError(f"broker did not confirm within {budget:.1f}s")
            return [err] * len(envelopes), True
        except Exception as exc:
            if isinstance(exc, RetryablePublishError):
                err = exc
            else:
                err = RetryablePublishError(f"publisher failed: {type(exc).__name__}: {exc}")
            return [err] * len(envelopes), True
        if len(results) != len(envelopes):
            err = RetryablePublishError("publisher returned the wrong number of results")
            return [err] * len(envelopes), True
        return list(results), False

    async def _mark(
        self,
        pool: AsyncConnectionPool[Any],
        claim: Claim,
        outcomes: list[Outcome],
        *,
        durable: bool = False,
    ) -> set[Any]:
        """Mark under the fencing token; retry through a lost connection while the lease holds."""
        delay = _DB_BACKOFF[0]
        while True:
            try:
                async with pool.connection(timeout=5) as conn:
                    marked = await mark_batch(
                        conn, self._stmts, claim.token, outcomes, durable=durable
                    )
                break
            except psycopg.Error as exc:
                if time.monotonic() + delay > claim.deadline + self.config.lease_seconds * 0.1:
                    log.error(
                        "relay: cannot mark %d rows (%s); their lease will lapse and "
                        "they will be published again",
                        len(outcomes),
                        exc,
                    )
                    return set()
                log.warning("relay: mark failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _DB_BACKOFF[1])
        self.last_db_ok = time.monotonic()
        fenced = len(outcomes) - len(marked)
        if fenced:
            self.metrics.fenced.inc(fenced)
            log.warning("relay: %d rows were no longer ours (lease taken over); not marked", fenced)
        return marked

    def _count(self, claim: Claim, outcomes: list[Outcome]) -> None:
        topics = {e.id: e.topic for e in claim.envelopes}
        for o in outcomes:
            if o.action == "published":
                self.metrics.published.labels(topics[o.id]).inc()
            elif o.action == "retry":
                self.metrics.failed.labels(topics[o.id]).inc()
            elif o.action == "dead":
                self.metrics.failed.labels(topics[o.id]).inc()
                self.metrics.dead.labels(topics[o.id]).inc()
                log.error("relay: message %s dead-lettered: %s", o.id, o.error)

    # -- background: wake-ups, heartbeat, retention -------------------------------------------

    async def _listen(self) -> None:
        """LISTEN on a dedicated connection; every (re)connect wakes the loop.

        Every call on it is bounded: on a half-open TCP connection (a peer or middlebox gone
        without a FIN) a plain ``SELECT 1`` waited forever, and the relay was left on its
        fallback poll without a word in the log.
        """
        delay = _DB_BACKOFF[0]
        bound = max(self.config.heartbeat_interval, 1.0)
        while not self.stopping:
            try:
                async with asyncio.timeout(bound):
                    conn = await psycopg.AsyncConnection.connect(self._listen_dsn, autocommit=True)
            except (psycopg.Error, TimeoutError) as exc:
                log.warning("relay: listener cannot connect (%s)", exc or "timed out")
                await self._sleep(delay)
                delay = min(delay * 2, _DB_BACKOFF[1])
                continue
            try:
                async with asyncio.timeout(bound):
                    await conn.execute(f"LISTEN {WAKEUP_CHANNEL}")
                delay = _DB_BACKOFF[0]
                self._wake.set()  # notifications sent while we were away are lost: poll now
                while not self.stopping:
                    async for _ in conn.notifies(timeout=self.config.heartbeat_interval):
                        self._wake.set()
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
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(bound):
                        await conn.close()

    def _registration(self) -> dict[str, Any]:
        cfg = self.config
        config = {
            "broker": _redact(cfg.broker_url),
            "batch_size": cfg.batch_size,
            "lease_seconds": cfg.lease_seconds,
            "instance": self._instance,
            # topics whose destination refuses messages: `outbox status` shows them
            "paused_destinations": self._destinations.snapshot(),
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

    async def _register(self, pool: AsyncConnectionPool[Any]) -> None:
        """Register this process under its relay id; refuse an id that a live relay uses."""

        async def attempt() -> tuple[bool, Any]:
            async with pool.connection(timeout=5) as conn:
                if await self._upsert_registration(conn):
                    return True, None
                cur = await conn.execute(
                    self._stmts.relay_holder, {"relay_id": self.config.relay_id}
                )
                return False, await cur.fetchone()

        outcome = await self._until_done("registration", attempt)
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

    async def _upsert_registration(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Write our row (or refresh its heartbeat); False when another live process has it."""
        cur = await conn.execute(self._stmts.register, self._registration())
        return await cur.fetchone() is not None

    async def _heartbeat(self, pool: AsyncConnectionPool[Any]) -> None:
        next_retention = time.monotonic()
        while not self.stopping:
            try:
                async with pool.connection(timeout=5) as conn:
                    if not await self._upsert_registration(conn):
                        log.error(
                            "relay: relay id %r was taken over by another live relay while our "
                            "heartbeat lapsed; give every relay process its own id",
                            self.config.relay_id,
                        )
                    await self.metrics.refresh_backlog(conn, self._stmts)
                    if self.config.retention_seconds and time.monotonic() >= next_retention:
                        await self._retention(conn)
                        next_retention = time.monotonic() + self.config.retention_interval
                self.last_db_ok = time.monotonic()
            except Exception as exc:
                log.warning("relay: heartbeat failed (%s)", exc)
            await self._sleep(self.config.heartbeat_interval)

    async def _retention(self, conn: psycopg.AsyncConnection[Any]) -> None:
        total = 0
        while not self.stopping:
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


def _backoff(failures: int, bounds: tuple[float, float]) -> float:
    """``bounds[0] * 2**failures``, at most ``bounds[1]``.

    The exponent is capped: an outage of hours counts thousands of failures, and from 2**1024
    on the product no longer fits a float (OverflowError).
    """
    return min(bounds[0] * 2.0 ** min(failures, 32), bounds[1])


def _redact(url: str | None) -> str | None:
    if not url or "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
