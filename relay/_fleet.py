"""One relay process for many databases: a supervisor over one :class:`~relay.Relay` each.

Each database keeps everything a relay of its own has: its leases (so several processes with
the same list share each database's work, as several relays of one database do), its capture
mode and slot, its registration row, its claim loop, its pool. What they share: the broker
connection (one publisher per process), the metrics server, and a cap on how many databases
claim and publish at once (``[fleet] max_concurrent``).

A database that cannot be served (unreachable, its login refused, not migrated, dropped, an
origin another database of the list has) pauses alone: one log line naming it and why, a
retry with backoff, the others go on. SIGHUP re-reads the file: a database added starts, one
removed stops (its claims finish or are released), one whose settings changed restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox.envelope import Envelope
from outbox.exceptions import OutboxError
from outbox.kit import redact, remember_secrets
from relay._config import RelayConfig
from relay._fleet_config import FleetConfig, FleetSettings, database_error_line
from relay._logs import DATABASE, name_the_database
from relay._metrics import RelayMetrics
from relay._origin import read_origin
from relay._relay import Relay
from relay._retry import Backoff
from relay._statements import relay_statements
from relay.brokers.base import BrokerFeatures, Publisher

__all__ = ["Fleet", "FleetMetrics", "SharedPublisher"]

log = logging.getLogger("relay")

#: the pooled connections a database in 'wal' mode needs at least
_WAL_POOL = 3
#: a database that ran this long before it failed starts its backoff over
_HEALTHY_RUN = 60.0


class SharedPublisher:
    """One broker connection for every database's relay: ``start`` connects once (the first
    caller; the others wait for it), ``close`` is the fleet's (:meth:`shutdown`), not a
    relay's."""

    def __init__(self, inner: Publisher) -> None:
        self.inner = inner
        self._lock = asyncio.Lock()
        self._started = False
        self.features: BrokerFeatures = inner.features

    async def start(self) -> None:
        async with self._lock:
            if not self._started:
                await self.inner.start()
                self._started = True
            self.features = self.inner.features  # an adapter learns its limits on connecting

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[BaseException | None]:
        return await self.inner.publish_batch(envelopes)

    async def close(self) -> None:
        """A relay stopping: the connection stays for the others."""

    async def shutdown(self) -> None:
        self._started = False
        await self.inner.close()


class FleetMetrics:
    """The metrics of every database, each series labelled ``database`` (its configured name),
    plus the fleet's own: which databases run and how often each paused.

    Each database's relay keeps its own registry; this one's collector gathers them at each
    scrape, so a database removed takes its series with it. A series that already has a
    ``database`` label (the slot's database, ``outbox_capture_slot_state``) keeps it as
    ``slot_database``.
    """

    def __init__(self, registry: Any | None) -> None:
        self.registry = registry
        self._members: dict[str, RelayMetrics] = {}
        if registry is None:
            return
        from prometheus_client import Counter, Gauge

        self.up = Gauge(
            "outbox_relay_database_up",
            "1 while the relay publishes for the database, 0 while it is paused (unreachable, "
            "refused, not migrated, a duplicate origin) or starting",
            ["database"],
            registry=registry,
        )
        self.pauses = Counter(
            "outbox_relay_database_pauses",
            "Times the database paused (the log line names it and says why)",
            ["database"],
            registry=registry,
        )
        registry.register(_Merged(self._members))

    @classmethod
    def prometheus(cls) -> FleetMetrics:
        return cls(RelayMetrics.prometheus().registry)

    def member(self, name: str) -> RelayMetrics:
        """The metrics of the database ``name`` (a registry of its own)."""
        if self.registry is None:
            return RelayMetrics.disabled()
        self._members[name] = metrics = RelayMetrics.prometheus()
        self.up.labels(name).set(0)
        self.pauses.labels(name)
        return metrics

    def set_up(self, name: str, up: bool) -> None:
        if self.registry is not None:
            self.up.labels(name).set(1 if up else 0)

    def paused(self, name: str) -> None:
        if self.registry is not None:
            self.up.labels(name).set(0)
            self.pauses.labels(name).inc()

    def forget(self, name: str) -> None:
        self._members.pop(name, None)
        if self.registry is not None:
            for metric in (self.up, self.pauses):
                with contextlib.suppress(KeyError):
                    metric.remove(name)


class _Merged:
    """A prometheus_client collector: every database's families as one, labelled."""

    def __init__(self, members: dict[str, RelayMetrics]) -> None:
        self.members = members

    def describe(self) -> list[Any]:
        return []  # the families appear with the databases

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import Metric

        merged: dict[str, Any] = {}
        for name, metrics in list(self.members.items()):
            registry = metrics.registry
            for family in registry.collect() if registry is not None else ():
                out = merged.get(family.name)
                if out is None:
                    out = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = out
                for sample in family.samples:
                    labels = dict(sample.labels)
                    if "database" in labels:
                        labels["slot_database"] = labels.pop("database")
                    labels["database"] = name
                    out.add_sample(sample.name, labels, sample.value, sample.timestamp)
        yield from merged.values()


@dataclass
class _Member:
    """One database of the list and its supervising task."""

    name: str
    config: RelayConfig
    metrics: RelayMetrics
    task: asyncio.Task[None] | None = None
    relay: Relay | None = None
    stopping: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: why it is paused (None: starting or running), and since when (time.time())
    reason: str | None = None
    since: float = field(default_factory=time.time)
    #: the origin it holds in the fleet's registry ("" for none), while it runs
    origin: str | None = None

    @property
    def state(self) -> str:
        """``paused`` (see reason), ``running``, ``waiting`` (running, but its database has not
        answered for three heartbeats: the relay retries it) or ``starting``."""
        relay = self.relay
        if self.reason is not None:
            return "paused"
        if relay is None or not relay.ready.is_set() or relay.stopping:
            return "starting"
        window = max(relay.config.poll_interval, relay.config.heartbeat_interval) * 3 + 5
        return "running" if time.monotonic() - relay.last_db_ok < window else "waiting"


class _Paused(OutboxError):
    """The database cannot be served now; the message says why (no secret in it)."""


class Fleet:
    """Relays ``config``'s databases through ``publisher`` until :meth:`stop`.

    ``reload`` (SIGHUP with :meth:`install_signal_handlers`, or :meth:`request_reload`) calls
    ``load`` and applies the new list.
    """

    def __init__(
        self,
        config: FleetConfig,
        publisher: Publisher,
        *,
        metrics: FleetMetrics | None = None,
        load: Callable[[], FleetConfig] | None = None,
    ) -> None:
        name_the_database()
        remember_secrets(config.base.broker_url, *(e.url for e in config.databases))
        self.config = config
        self.publisher = SharedPublisher(publisher)
        self.metrics = metrics or FleetMetrics(None)
        self.load = load
        self.gate = asyncio.Semaphore(config.settings.max_concurrent)
        #: databases starting at once (connecting, checking, registering)
        self.starting = asyncio.Semaphore(config.settings.max_concurrent)
        self.members: dict[str, _Member] = {}
        #: origin ("" for a database without one) -> the database holding it
        self.origins: dict[str, str] = {}
        self._stop = asyncio.Event()
        self._reload = asyncio.Event()

    @property
    def settings(self) -> FleetSettings:
        return self.config.settings

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("relay: %s received, stopping every database", sig.name)
        self.stop()

    def states(self) -> dict[str, dict[str, Any]]:
        """Each database's state (``running``, ``starting``, ``paused``), why it is paused,
        since when."""
        return {
            m.name: {"state": m.state, "reason": m.reason, "since": m.since}
            for m in self.members.values()
        }

    async def run(self) -> None:
        """Serve every database until stopped; a failing one never ends this."""
        log.info(
            "relay %s serving %d database(s): %s; at most %d at work at once",
            self.config.base.relay_id,
            len(self.config.databases),
            _names([e.name for e in self.config.databases]),
            self.settings.max_concurrent,
        )
        for entry in self.config.databases:
            self._start(entry.name, self.config.configs[entry.name])
        try:
            while not self.stopping:
                await _first(self._stop.wait(), self._reload.wait())
                if self._reload.is_set() and not self.stopping:
                    self._reload.clear()
                    await self._apply_reload()
        finally:
            await asyncio.gather(*(self._stop_member(m) for m in list(self.members.values())))
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.config.base.shutdown_timeout):
                    await self.publisher.shutdown()
            log.info("relay %s stopped (every database)", self.config.base.relay_id)

    # -- the list ----------------------------------------------------------------------------

    def _start(self, name: str, config: RelayConfig) -> None:
        member = _Member(name, config, self.metrics.member(name))
        self.members[name] = member
        context = contextvars.copy_context()
        context.run(DATABASE.set, name)  # every line its tasks log names it
        member.task = asyncio.get_running_loop().create_task(
            self._supervise(member), name=f"relay-db-{name}", context=context
        )

    async def _stop_member(self, member: _Member) -> None:
        member.stopping = True
        member.wake.set()
        if member.relay is not None:
            member.relay.stop()
        if member.task is not None:
            bound = member.config.shutdown_timeout + 10
            done, _ = await asyncio.wait([member.task], timeout=bound)
            if not done:
                member.task.cancel()
                await asyncio.gather(member.task, return_exceptions=True)
        self.members.pop(member.name, None)
        self.metrics.forget(member.name)

    async def _apply_reload(self) -> None:
        if self.load is None:
            return
        try:
            new = self.load()
        except Exception as exc:
            log.error(
                "relay: reload refused (%s); the %d database(s) go on unchanged",
                redact(str(exc)),
                len(self.members),
            )
            return
        old = self.config
        # the relay id stays this process's (a default one is drawn at each load)
        configs = {n: replace(c, relay_id=old.base.relay_id) for n, c in new.configs.items()}
        gone = [m for n, m in self.members.items() if n not in configs]
        changed = [m for n, m in self.members.items() if n in configs and configs[n] != m.config]
        added = [e.name for e in new.databases if e.name not in self.members]
        remember_secrets(*(e.url for e in new.databases))
        await asyncio.gather(*(self._stop_member(m) for m in [*gone, *changed]))
        self.config = replace(new, settings=old.settings, base=old.base, configs=configs)
        for name in [*added, *(m.name for m in changed)]:
            self._start(name, configs[name])
        if new.settings != old.settings or _broker_of(new.base) != _broker_of(old.base):
            log.warning("relay: reload: [fleet] and broker settings change at a restart only")
        log.info(
            "relay: reloaded: %d database(s); added %s; removed %s; restarted %s",
            len(self.members),
            _names(added),
            _names([m.name for m in gone]),
            _names([m.name for m in changed]),
        )

    # -- one database ------------------------------------------------------------------------

    async def _supervise(self, member: _Member) -> None:
        backoff = Backoff.of((1.0, self.settings.retry_max))
        while not member.stopping:
            started = time.monotonic()
            try:
                await self._serve(member)
                reason = None if member.stopping else "its relay stopped"
            except Exception as exc:
                reason = _reason(exc)
            finally:
                self._release_origin(member)
                self.metrics.set_up(member.name, False)
            if member.stopping or reason is None:
                break
            if time.monotonic() - started > _HEALTHY_RUN:
                backoff.succeeded()
            delay = backoff.failed()
            if reason != member.reason:
                member.since = time.time()
                log.warning(
                    "relay: database %s paused: %s; retrying in %.0fs, then with backoff "
                    "(the other databases go on)",
                    member.name, reason, delay,
                )  # fmt: skip
            member.reason = reason
            member.relay = None
            self.metrics.paused(member.name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(member.wake.wait(), delay)

    async def _serve(self, member: _Member) -> None:
        """Check the database, then run its relay until it stops or fails.

        The start-ups take turns (``max_concurrent`` at once, until each relay is ready or
        three connect timeouts have passed): a thousand databases connecting at the same
        instant would time each other out."""
        run: asyncio.Task[None] | None = None
        try:
            async with self.starting:
                config = await self._identify(member)
                if member.stopping:
                    return
                relay = Relay(config, self.publisher, metrics=member.metrics, gate=self.gate,
                              pool_size=self.settings.database_connections)  # fmt: skip
                member.relay = relay
                run = asyncio.create_task(relay.run())
                # a turn lasts until the relay is ready, at most a few connection attempts: one
                # whose pool cannot connect keeps trying on its own, and must not hold the
                # others' turns
                turn = asyncio.sleep(self.settings.connect_timeout * 3)
                await _first(relay.ready.wait(), asyncio.shield(run), turn)
            watch = asyncio.create_task(self._when_ready(member, relay))
            try:
                await run
            finally:
                watch.cancel()
        finally:
            if run is not None and not run.done():  # cancelled: a stop past its bound
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)

    async def _when_ready(self, member: _Member, relay: Relay) -> None:
        await relay.ready.wait()
        self._ready(member)

    def _ready(self, member: _Member) -> None:
        if member.reason is not None:
            log.info("relay: database %s resumed", member.name)
        member.reason = None
        member.since = time.time()
        self.metrics.set_up(member.name, True)

    async def _identify(self, member: _Member) -> RelayConfig:
        """Connect once: the database answers, has the outbox tables, and an origin no other
        database of the list has. The relay's config, with that origin."""
        config = member.config
        stmts = relay_statements(config.schema)
        bound = self.settings.connect_timeout
        try:
            async with asyncio.timeout(bound):
                conn = await psycopg.AsyncConnection.connect(config.database_url, autocommit=True)
        except TimeoutError:
            raise _Paused(f"no answer within {bound:g}s") from None
        except psycopg.Error as exc:
            said = database_error_line(exc)
            raise _Paused(f"cannot connect: {said}") from None
        try:
            async with conn.cursor() as cur:
                row = await (await cur.execute(stmts.tables_present)).fetchone()
            if row is None or not all(row):
                raise _Paused(
                    f"the outbox tables are missing or too old in schema "
                    f"{config.schema or 'of the search_path'}: run `outbox migrate` on it"
                )
            origin = config.origin or await read_origin(conn, stmts.origin)
            await self._check_pool(conn, stmts.capture_mode)
        finally:
            await conn.close()
        key = origin or ""
        holder = self.origins.get(key)
        if holder is not None and holder != member.name:
            said = f"its origin {origin!r} is" if origin else "it has no origin, as"
            raise _Paused(
                f"{said} database {holder!r}'s too (a copy of it, CREATE DATABASE ... "
                "TEMPLATE or a restored backup?): its messages would look already applied to "
                "the consumers; give it its own (UPDATE outbox_identity SET origin = '...' in "
                "it, or origin in its [[databases]] table), then reload"
            )
        self.origins[key] = member.name
        member.origin = key
        return config if origin is None else replace(config, origin=origin)

    async def _check_pool(self, conn: psycopg.AsyncConnection[Any], statement: bytes) -> None:
        """'wal' mode needs three pooled connections (the capture lease, the stream's work,
        the marks); fewer would stall its capture."""
        pool = self.settings.database_connections
        if pool is None or pool >= _WAL_POOL:
            return
        async with conn.cursor(row_factory=dict_row) as cur:
            row = await (await cur.execute(statement)).fetchone()
        if row is not None and row["mode"] == "wal":
            raise _Paused(
                f"it captures in 'wal' mode, which needs [fleet] database_connections >= "
                f"{_WAL_POOL} (it is {pool}): raise it, or `outbox capture disable` on it"
            )

    def _release_origin(self, member: _Member) -> None:
        if member.origin is not None and self.origins.get(member.origin) == member.name:
            del self.origins[member.origin]
        member.origin = None


def _reason(exc: BaseException) -> str:
    """One line, masked, for a database's failure."""
    if isinstance(exc, OutboxError):
        text = str(exc)
    elif isinstance(exc, psycopg.Error):
        text = database_error_line(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(redact(text).split()) or type(exc).__name__


def _names(names: list[str], shown: int = 10) -> str:
    """The first ``shown`` names, and how many more."""
    if not names:
        return "none"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _broker_of(config: RelayConfig) -> tuple[Any, ...]:
    return (config.broker_url, dict(config.broker_options), dict(config.destinations))


async def _first(*waits: Awaitable[Any]) -> None:
    """Until the first of ``waits`` is done (the others cancelled)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
