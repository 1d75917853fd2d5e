"""Several processes under one consumer name, each key applied by one process at a time.

The relay writes a topic's messages to ``partitions`` destinations (``[broker.partitions]``;
a message's partition is :func:`outbox.partition_for` of its key). A
:class:`PartitionedConsumer` is one process of the consumer: it joins the consumer's members
(a row in ``inbox_partition_members``, kept alive by its heartbeat), takes its share of the
partitions (leases in ``inbox_partition_leases``, in the consumer's own database) and runs one
broker consumer per partition it holds, built by ``factory(partition, runner)``.

The lease, per partition:

* **Balance.** Each live member holds floor or ceil of ``partitions / members`` partitions
  (the members that joined first hold the extra ones). A member above its share stops the
  broker consumer of its highest partitions, then releases them; a member below its share
  takes partitions nobody holds (released, or whose lease lapsed). A partition moves only
  after its previous owner released it or its lease expired.
* **Renewal.** Every ``heartbeat`` seconds the member renews its own row and the leases of the
  partitions whose broker consumer is making progress (running, and with messages in hand
  only if one of its transactions ended within ``lease.stall`` seconds). A lease that is not
  renewed lapses ``lease.duration`` seconds after its last renewal; before that moment (by
  the member's own clock, counted from before the renewal was sent) the member stops the
  partition's broker consumer, which settles what it has in hand.
* **Fence.** Every transaction a partition's broker consumer opens ends with a check, in that
  transaction, that this member still holds the partition's lease with the epoch it acquired
  (``SELECT ... FOR KEY SHARE`` of the lease row, the last statement before the commit). When
  it does not (taken over, or lapsed while the process was frozen), the transaction is rolled
  back: nothing is applied, the message is left to the broker (:class:`PartitionLostError`),
  and the partition's consumer stops. A takeover locks the row ``FOR UPDATE`` (skipping it
  while a commit is in progress), so no two members ever commit messages of one partition at
  overlapping times; the owner's renewals do not conflict with its own fences.
* **Leaving.** :meth:`PartitionedConsumer.stop` stops every broker consumer, releases the
  leases and deletes the member's row: the others take the partitions at their next heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inbox._consumer import BrokerConsumer
from inbox._runner import AsyncHandlerRunner
from inbox._transactions import AsyncTransactionSource, async_transactions
from inbox.exceptions import PartitionLostError
from outbox.exceptions import ConfigurationError
from outbox.kit import check_partitions, resolve_async, rows_by_name

__all__ = [
    "PARTITION",
    "Lease",
    "PartitionFactory",
    "PartitionedConsumer",
    "balanced_share",
    "per_partition",
]

log = logging.getLogger("inbox.partitions")

class _Partition:
    """The type of :data:`PARTITION`."""

    def __repr__(self) -> str:
        return "inbox.PARTITION"


#: in :func:`per_partition`'s settings, the partition's number where a setting takes a number
#: (``KafkaConsumer(partitions=[PARTITION])``); ``{partition}`` is its place in a text
PARTITION: Any = _Partition()

#: ``factory(partition, runner)``: the broker consumer of one partition, consuming with
#: ``runner`` (a copy of the consumer's runner whose transactions carry the partition's fence)
PartitionFactory = Callable[[int, AsyncHandlerRunner], BrokerConsumer]


@dataclass(frozen=True)
class Lease:
    """The timing of a partitioned consumer's leases, in seconds.

    ``duration``: how long a lease (and a member's heartbeat) holds without renewal: a process
    that dies loses its partitions that long after its last renewal at most. ``heartbeat``:
    how often each member renews and rebalances (a partition freed by a member that left is
    taken within one heartbeat). ``stop_timeout``: how long a partition's broker consumer may
    take to settle what it has in hand when it stops; it is stopped that long before its lease
    would lapse. ``stall``: a broker consumer with messages in hand and no transaction ended
    for that long is not making progress: its lease is not renewed. The longest transaction of
    the handler must stay well under ``duration``.
    """

    duration: float = 10.0
    heartbeat: float = 1.0
    stop_timeout: float = 3.0
    stall: float = 5.0

    def __post_init__(self) -> None:
        for name in ("duration", "heartbeat", "stop_timeout", "stall"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(f"Lease.{name} must be a positive number of seconds")
        if self.heartbeat * 3 > self.duration:
            raise ConfigurationError(
                f"Lease.heartbeat ({self.heartbeat:g} s) must be at most a third of "
                f"Lease.duration ({self.duration:g} s): a lease is renewed several times "
                "before it lapses"
            )
        if self.stop_timeout + 2 * self.heartbeat > self.duration:
            raise ConfigurationError(
                f"Lease.stop_timeout ({self.stop_timeout:g} s) plus two heartbeats must fit in "
                f"Lease.duration ({self.duration:g} s)"
            )
        if self.stall >= self.duration:
            raise ConfigurationError("Lease.stall must be shorter than Lease.duration")


def balanced_share(partitions: int, members: Sequence[str], member: str) -> int:
    """How many of ``partitions`` ``member`` should hold among the live ``members`` (in their
    join order): floor or ceil of partitions / members, the first ones taking the remainder.
    A member not (yet) in the list holds none."""
    if member not in members:
        return 0
    base, extra = divmod(partitions, len(members))
    return base + (1 if members.index(member) < extra else 0)


def per_partition(consumer_class: type[BrokerConsumer], /, **settings: Any) -> PartitionFactory:
    """A factory of ``consumer_class`` consumers, one per partition: every text setting (and
    every text in a list setting) has ``{partition}`` replaced by the partition's number, and
    every :data:`PARTITION` (a setting, or an item of a list setting) becomes the number
    itself. At least one setting must name the partition (its destination: subject, queue,
    stream, topic, address or Kafka partition; and the durable, group member or client id
    where the broker has one)::

        factory = per_partition(
            NatsConsumer, stream="EVENTS", subject="events.orders.p{partition}",
            durable="billing-p{partition}", batching=Batching(size=100),
        )
        factory = per_partition(
            KafkaConsumer, config=config, topics=["orders"], partitions=[PARTITION],
            offsets_in_db=True,
        )
    """
    if not isinstance(consumer_class, type) or not issubclass(consumer_class, BrokerConsumer):
        raise ConfigurationError(
            f"per_partition takes an inbox broker consumer class, not {consumer_class!r}"
        )
    if not any(_names_partition(value) for value in settings.values()):
        raise ConfigurationError(
            "per_partition: no setting names {partition}: every partition would read the same "
            "destination (e.g. subject='events.orders.p{partition}')"
        )

    def factory(partition: int, runner: AsyncHandlerRunner) -> BrokerConsumer:
        filled = {name: _fill(value, partition) for name, value in settings.items()}
        return consumer_class(runner, **filled)

    return factory


def _names_partition(value: Any) -> bool:
    if value is PARTITION:
        return True
    if isinstance(value, str):
        return "{partition}" in value
    return isinstance(value, list | tuple) and any(_names_partition(v) for v in value)


def _fill(value: Any, partition: int) -> Any:
    if value is PARTITION:
        return partition
    if isinstance(value, str):
        return value.replace("{partition}", str(partition))
    if isinstance(value, list | tuple):
        return type(value)(_fill(v, partition) for v in value)
    return value


@dataclass(eq=False)
class _Held:
    """A partition this member holds, and its broker consumer."""

    partition: int
    epoch: int
    #: by this member's clock: the lease holds at least until then
    until: float
    consumer: BrokerConsumer | None = None
    task: asyncio.Task[None] | None = None
    #: the last time one of its transactions ended (committed or not), or it started
    progress: float = field(default_factory=time.monotonic)
    #: set when its fence found the lease gone: stop now, do not renew
    lost: bool = False


class PartitionedConsumer:
    """One process of a consumer that shares ``partitions`` partitions with the consumer's
    other processes (any number, on any machines, with the same ``runner`` consumer name and
    the same ``partitions``); each partition is consumed by one process at a time.

    ``factory(partition, runner)`` builds the broker consumer of one partition
    (:func:`per_partition` makes one from a consumer class and templates). ``lease``: the
    timing (:class:`Lease`). ``group``: the name the members share (default: the runner's
    consumer name). ``member``: this process's name among them (default: host, pid and a
    random suffix; unique per instance). ``leases``: where the heartbeats and renewals run (a
    psycopg_pool.AsyncConnectionPool or any source the runner takes), default the runner's:
    give them a small pool of their own (one connection) when the handlers' transactions may
    take every connection of the runner's pool, so that a renewal never waits behind them.

    ``await run()`` until :meth:`stop`; ``ready`` is set after its first round (joined, its
    share taken when partitions were free). :attr:`owned` says which partitions it consumes.
    The database must have migration ``outbox_0023`` (``outbox migrate upgrade``).
    """

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        partitions: int,
        factory: PartitionFactory,
        lease: Lease | None = None,
        group: str | None = None,
        member: str | None = None,
        leases: AsyncTransactionSource | None = None,
    ) -> None:
        if not isinstance(runner, AsyncHandlerRunner):
            raise ConfigurationError(
                f"runner must be an inbox.AsyncHandlerRunner, not {type(runner).__name__}"
            )
        if not callable(factory):
            raise ConfigurationError("factory must be callable: factory(partition, runner)")
        if lease is not None and not isinstance(lease, Lease):
            raise ConfigurationError(f"lease must be an inbox.Lease, not {type(lease).__name__}")
        self.runner, self.factory = runner, factory
        self.partitions = check_partitions(partitions)
        self.lease = lease or Lease()
        self.group = group or runner.consumer
        default = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.member = member or default
        #: the transactions of the lease bookkeeping (heartbeat, renewal, rebalance)
        self._leases = self._guarded(
            self.runner.transactions if leases is None else async_transactions(leases),
            self.lease.stop_timeout,
        )
        self._held: dict[int, _Held] = {}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._cooldown_until = 0.0
        self._warned_counts = False
        #: set after the first round: joined, its share taken when partitions were free
        self.ready = asyncio.Event()

    @property
    def owned(self) -> frozenset[int]:
        """The partitions this process holds and consumes now."""
        return frozenset(p for p, h in self._held.items() if h.task is not None and not h.lost)

    def stop(self) -> None:
        """Ask :meth:`run` to stop every partition's consumer, release the leases and leave."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Join, then balance, renew and consume until :meth:`stop`; then leave."""
        try:
            async with self._leases() as target:
                raw = await resolve_async(target)
                await raw.execute(self._stmts.partition_slots, self._params())
        except Exception as exc:
            if type(exc).__name__ == "UndefinedTable" or "inbox_partition" in str(exc):
                raise ConfigurationError(
                    "the partition leases are not in the database: run `outbox migrate "
                    "upgrade` (migration outbox_0023)"
                ) from exc
            raise
        metrics = self.runner.metrics
        metrics.partitions.labels(self.group).set(self.partitions)
        try:
            while not self._stopping.is_set():
                await self._round(time.monotonic())
                await self._reap(time.monotonic())
                metrics.partitions_owned.labels(self.group).set(len(self.owned))
                self.ready.set()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.lease.heartbeat):
                        await self._wake.wait()
        finally:
            await self._leave()
            metrics.partitions_owned.labels(self.group).set(0)

    # ---- one round: heartbeat, renew, rebalance -----------------------------------------

    @property
    def _stmts(self) -> Any:
        return self.runner._cfg.stmts

    def _params(self, **more: Any) -> dict[str, Any]:
        return {
            "consumer": self.group,
            "member": self.member,
            "partitions": self.partitions,
            "lease": float(self.lease.duration),
            **more,
        }

    def _budget(self, now: float) -> float:
        """How long a round may take: until the first held lease must be given up (its
        consumer stopped before it lapses), at least one heartbeat."""
        first = min((h.until for h in self._held.values()), default=now + self.lease.duration)
        return max(self.lease.heartbeat, first - self.lease.stop_timeout - now)

    async def _round(self, started: float) -> None:
        """Heartbeat and renew, then release above the share, then take free partitions up
        to it. The database work is bounded by :meth:`_budget` (a round that waits on the
        database past it is abandoned, and the partitions whose leases cannot be renewed are
        stopped in time); stopping a partition's consumer is bounded by ``stop_timeout``."""
        try:
            async with asyncio.timeout(self._budget(started)):
                members = await self._renew(started)
            self._check_counts(members)
            share = balanced_share(self.partitions, [m["member"] for m in members], self.member)
            keep = sorted(p for p, h in self._held.items() if not h.lost)
            for partition in keep[share:]:  # above the share: the highest partitions go
                await self._give_up(partition)
            wanted = share - min(len(keep), share)
            if wanted > 0 and time.monotonic() >= self._cooldown_until:
                async with asyncio.timeout(self._budget(started)):
                    await self._acquire(wanted, started)
        except Exception as exc:  # the database may be away: try again next round
            log.warning("inbox: %s member %s: lease round failed: %s",
                        self.group, self.member, exc or type(exc).__name__)  # fmt: skip

    async def _renew(self, started: float) -> list[dict[str, Any]]:
        """The heartbeat and the renewals, in one transaction; the live members."""
        stmts = self._stmts
        healthy = [h.partition for h in self._held.values() if self._making_progress(h)]
        async with self._leases() as target:
            raw = await resolve_async(target)
            await raw.execute(stmts.partition_join, self._params())
            cur = await raw.execute(stmts.partition_renew, self._params(held=healthy))
            rows = rows_by_name(cur, await cur.fetchall())
            renewed = {row["partition"]: row["epoch"] for row in rows}
            cur = await raw.execute(stmts.partition_members, self._params())
            members = rows_by_name(cur, await cur.fetchall())
        for partition in healthy:
            held = self._held.get(partition)
            if held is None:
                continue
            if renewed.get(partition) == held.epoch:
                held.until = started + self.lease.duration
            else:
                held.lost = True  # lapsed or taken: it must not be consumed any more
        return members

    async def _acquire(self, wanted: int, started: float) -> None:
        async with self._leases() as target:
            raw = await resolve_async(target)
            cur = await raw.execute(self._stmts.partition_acquire, self._params(wanted=wanted))
            rows = rows_by_name(cur, await cur.fetchall())
        for row in rows:
            held = _Held(row["partition"], row["epoch"], started + self.lease.duration)
            self._held[held.partition] = held
            try:
                self._start(held)
            except Exception as exc:
                log.error("inbox: %s: the consumer of partition %d could not start: %s",
                          self.group, held.partition, exc)  # fmt: skip
                await self._give_up(held.partition)
                self._cooldown_until = time.monotonic() + 5 * self.lease.heartbeat
                continue
            log.info("inbox: %s member %s took partition %d (epoch %d)",
                     self.group, self.member, held.partition, held.epoch)  # fmt: skip

    def _check_counts(self, members: list[dict[str, Any]]) -> None:
        counts = {m["partitions"] for m in members}
        if counts != {self.partitions} and not self._warned_counts:
            self._warned_counts = True
            log.error("inbox: %s: the members do not agree on the number of partitions (%s); "
                      "every process of a consumer must use the relay's partition count",
                      self.group, ", ".join(str(c) for c in sorted(counts)))  # fmt: skip

    def _making_progress(self, held: _Held) -> bool:
        """Running, and with messages in hand only if one of its transactions ended within
        ``lease.stall`` seconds (an idle consumer is making progress: nothing to do)."""
        if held.lost or held.task is None or held.task.done() or held.consumer is None:
            return False
        now = time.monotonic()
        if sum(held.consumer._loads) == 0:
            held.progress = now
        return now - held.progress < self.lease.stall

    async def _reap(self, now: float) -> None:
        """Stop the consumers whose lease was lost, is about to lapse, or that ended."""
        for partition, held in list(self._held.items()):
            ended = held.task is not None and held.task.done()
            if held.lost or ended or now + self.lease.stop_timeout >= held.until:
                if ended and held.task is not None and not held.task.cancelled():
                    exc = held.task.exception()
                    if exc is not None:
                        log.error("inbox: %s: the consumer of partition %d failed: %s",
                                  self.group, partition, exc)  # fmt: skip
                        self._cooldown_until = now + 5 * self.lease.heartbeat
                await self._give_up(partition)

    # ---- one partition's broker consumer ------------------------------------------------

    def _start(self, held: _Held) -> None:
        runner = copy.copy(self.runner)
        runner._transactions = self._fenced(held)
        consumer = self.factory(held.partition, runner)
        if not isinstance(consumer, BrokerConsumer):
            raise ConfigurationError(
                f"factory returned a {type(consumer).__name__}, not an inbox broker consumer"
            )
        held.consumer = consumer
        held.task = asyncio.create_task(consumer.run(), name=f"partition-{held.partition}")

    def _guarded(
        self, transactions: Callable[[], contextlib.AbstractAsyncContextManager[Any]], idle: float
    ) -> Callable[[], contextlib.AbstractAsyncContextManager[Any]]:
        """``transactions`` whose transactions the server ends when idle ``idle`` seconds (a
        frozen process's locks never hold a takeover up for longer)."""
        guard, params = self._stmts.partition_guard, {"idle_ms": str(int(idle * 1000))}

        @contextlib.asynccontextmanager
        async def guarded() -> AsyncIterator[Any]:
            async with transactions() as target:
                raw = await resolve_async(target)
                await raw.execute(guard, params)
                yield target

        return guarded

    def _fenced(self, held: _Held) -> Callable[[], contextlib.AbstractAsyncContextManager[Any]]:
        """The runner's transactions, each ending with the partition's fence (and ended by the
        server when idle half a lease: a frozen process's locks never hold a key up longer)."""
        transactions = self._guarded(self.runner.transactions, self.lease.duration / 2)
        fence = self._stmts.partition_fence
        params = self._params(partition=held.partition, epoch=held.epoch)

        @contextlib.asynccontextmanager
        async def fenced() -> AsyncIterator[Any]:
            if held.lost:
                raise self._lost(held)
            try:
                async with transactions() as target:
                    yield target
                    raw = await resolve_async(target)
                    cur = await raw.execute(fence, params)
                    if await cur.fetchone() is None:
                        raise self._lost(held)
            finally:
                held.progress = time.monotonic()

        return fenced

    def _lost(self, held: _Held) -> PartitionLostError:
        if not held.lost:
            held.lost = True
            log.warning("inbox: %s member %s lost partition %d (epoch %d): nothing applied, "
                        "its consumer stops", self.group, self.member, held.partition,
                        held.epoch)  # fmt: skip
            if held.consumer is not None:
                held.consumer.stop()
            self._wake.set()
        return PartitionLostError(
            f"partition {held.partition} of {self.group} is no longer held by {self.member}",
            partition=held.partition,
        )

    async def _give_up(self, partition: int) -> None:
        """Stop the partition's consumer (it settles what it has in hand, within
        ``stop_timeout``; then it is cancelled), then release its lease unless it was lost."""
        held = self._held.pop(partition, None)
        if held is None:
            return
        if held.consumer is not None and held.task is not None:
            held.consumer.stop()
            done, _ = await asyncio.wait([held.task], timeout=self.lease.stop_timeout)
            if not done:
                held.task.cancel()
                await asyncio.gather(held.task, return_exceptions=True)
        if not held.lost:
            try:
                async with asyncio.timeout(self.lease.stop_timeout), self._leases() as target:
                    raw = await resolve_async(target)
                    await raw.execute(
                        self._stmts.partition_release,
                        self._params(partition=partition, epoch=held.epoch),
                    )
            except Exception as exc:  # it lapses by itself
                log.warning("inbox: %s: releasing partition %d failed: %s",
                            self.group, partition, exc or type(exc).__name__)  # fmt: skip
        log.info("inbox: %s member %s gave up partition %d",
                 self.group, self.member, partition)  # fmt: skip

    async def _leave(self) -> None:
        await asyncio.gather(*(self._give_up(p) for p in list(self._held)), return_exceptions=True)
        try:
            async with asyncio.timeout(self.lease.stop_timeout), self._leases() as target:
                raw = await resolve_async(target)
                await raw.execute(self._stmts.partition_leave, self._params())
        except Exception as exc:  # its row lapses by itself
            log.warning("inbox: %s: leaving failed: %s", self.group, exc)
