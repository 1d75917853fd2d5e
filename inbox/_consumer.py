"""What every broker consumer runner shares: stop flag, decoding, outcome callback.

A runner acknowledges a broker message only after the database transaction that recorded it
(and applied its effect, or found it a duplicate) has committed; a crash before the ack means a
redelivery, which the inbox turns into a DUPLICATE with no second effect. A message the runner
cannot decode (not published by the relay, or hostile) is refused: counted
(``inbox_refused{reason}``), logged with its broker position, recorded dead when its id can be
read, and settled without an effect (terminated, dead-lettered where the broker has it, or
acknowledged), since no redelivery can fix it.

The loop is total: no exception raised while decoding a message or handling it ends ``run()``.
One that is not a refusal (a bug) is logged with its traceback and its message recorded dead
like a poison message; a lost database connection is not a message's fault, so its message is
redelivered instead (the runner's rule). What still ends ``run()``: cancellation, a lost broker
connection (the broker's own settle call fails), and a ``BaseException`` such as
``KeyboardInterrupt``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import logging
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypedDict

from inbox._claimcheck import ClaimCheckResolver
from inbox._receive import MessageRef, invalid_ref
from inbox._runner import AsyncAlso, AsyncHandlerRunner, Outcome, Result, _is_transient
from inbox.exceptions import ClaimCheckStoreError
from outbox.claimcheck import CONTENT_TYPE as CLAIM_CHECK_TYPE
from outbox.envelope import REFUSAL_REASONS, Envelope, shown
from outbox.exceptions import ConfigurationError, InvalidMessageError, OutboxError
from outbox.kit import DEFAULT_MAX_RECEIVE_BYTES, redact_library_logs

__all__ = ["Batching", "BrokerConsumer", "Delivery", "ResultCallback"]

log = logging.getLogger("inbox.consumer")

#: ``on_result(envelope, result)``, called after each delivery is settled in the database.
ResultCallback = Callable[[Envelope, Result], object]


@dataclass(frozen=True)
class Batching:
    """How a broker consumer groups deliveries into transactions and spreads them over workers.

    ``size``: at most this many messages per transaction (``runner.handle_batch``); a worker
    takes what has arrived, waiting up to ``wait`` seconds for more once it has one.
    ``workers``: tasks applying batches side by side; a key's messages go to one worker while
    any of them is in flight (taken, not yet settled), so they stay in order while other keys
    proceed; a key with none in flight goes to the worker with the fewest messages in flight
    (the workers' batches stay full, instead of a hash's uneven split leaving small ones). The
    consumers that fetch (NATS, Redis) fetch ``size * workers`` messages at a time and the push
    brokers' prefetch or credit scales alike, so each worker still fills its batches. Each
    worker buffers at most two fetches' worth of its keys' messages (push brokers: two
    messages) beside the batch in hand: when a key is slow, its worker's buffer fills and the
    consumer stops taking messages from the broker (bounded memory).
    """

    size: int = 100
    wait: float = 0.005
    workers: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or not 1 <= self.size <= 10_000:
            raise ConfigurationError(f"Batching.size must be 1..10000, not {self.size!r}")
        if not isinstance(self.workers, int) or not 1 <= self.workers <= 256:
            raise ConfigurationError(f"Batching.workers must be 1..256, not {self.workers!r}")
        if not 0 <= self.wait <= 10:
            raise ConfigurationError(f"Batching.wait must be 0..10 seconds, not {self.wait!r}")


#: one message at a time, one transaction each, in arrival order
SINGLE = Batching(size=1, wait=0.0, workers=1)


def _unknown_position() -> str:
    return "an unknown position"


class Delivery:
    """One broker message on its way to the inbox: how to decode it, and how to settle it at
    the broker once its outcome is committed (``None``: not a valid outbox envelope).

    ``where`` says where the message is at the broker (stream seq, delivery tag, partition and
    offset, entry id), for the log line of a refused message; it is called only then. A
    consumer may subclass it to keep its broker message in one object (no callables made per
    message: a fetch of hundreds of deliveries stays a few objects each). ``lend``: a consumer
    that sets aside early messages (``BrokerConsumer.set_aside``) calls it when it sets this one
    aside, so that the broker may send one more message in its place.
    """

    __slots__ = ("_decode", "_settle", "_where", "lend")

    def __init__(
        self,
        decode: Callable[[], Envelope],
        settle: Callable[[Result | None], Awaitable[object]],
        where: Callable[[], str] = _unknown_position,
        lend: Callable[[], object] | None = None,
    ) -> None:
        self._decode, self._settle, self._where = decode, settle, where
        self.lend = lend

    def decode(self) -> Envelope:
        return self._decode()

    def settle(self, result: Result | None) -> Awaitable[object]:
        return self._settle(result)

    def where(self) -> str:
        return self._where()


#: decoded deliveries on their way to one worker
@dataclass(frozen=True)
class Invalid:
    """A broker message that is not a valid outbox envelope, on its way to be recorded dead."""

    envelope: Envelope | None  # decoded, when only its fields are invalid
    error: Exception


#: What a worker takes: envelopes to apply (with what the runner's check returned of each), and
#: invalid messages to record dead (no ref), each with the broker delivery to settle, in the
#: order they arrived.
Chunk = list[tuple[Envelope | Invalid, Delivery, MessageRef | None]]


#: seconds an early message stays set aside (at least ``redeliver_delay``) when its key's
#: previous message is not settled here meanwhile (another consumer of the queue had it)
SET_ASIDE = 5.0


@dataclass(eq=False)
class _Aside:
    """An early message kept unsettled until its key's previous message is settled here (then
    it is applied), or for ``SET_ASIDE`` seconds at most (then it is released to the broker)."""

    envelope: Envelope
    delivery: Delivery
    result: Result
    taken: bool = False


class ConsumerOptions(TypedDict, total=False):
    """The settings every broker's consumer takes besides its own, passed on to
    :class:`BrokerConsumer` (see its parameters): ``redeliver_delay``, ``on_result``,
    ``hold_interval``, ``batching``, ``max_payload_bytes``, ``claim_check``."""

    redeliver_delay: float
    on_result: ResultCallback | None
    hold_interval: float
    batching: Batching | None
    max_payload_bytes: int
    claim_check: ClaimCheckResolver | None


class BrokerConsumer(abc.ABC):
    """Base of the broker runners: ``await run()`` until ``stop()``; then it shuts down cleanly,
    finishing the message in hand (commit, then ack) and closing its broker connection.

    The one consumer interface: every broker's consumer (a plug-in's too, see
    :mod:`outbox.brokers`) subclasses it and implements :meth:`_consume`."""

    #: True: a message not applied is dealt with by a task of its own (:meth:`_defer`: applied
    #: again, set aside, or released later), and ``Delivery.settle`` settles it at once;
    #: False: ``Delivery.settle`` waits ``redeliver_delay`` itself
    defers_release = False

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        redeliver_delay: float = 1.0,
        on_result: ResultCallback | None = None,
        hold_interval: float = 1.0,
        batching: Batching | None = None,
        max_payload_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
        claim_check: ClaimCheckResolver | None = None,
    ) -> None:
        if not isinstance(runner, AsyncHandlerRunner):
            raise ConfigurationError(
                f"runner must be an inbox.AsyncHandlerRunner, not {type(runner).__name__}"
            )
        redact_library_logs()  # the consumer's log lines mask secrets whatever the handlers
        if redeliver_delay < 0:
            raise ConfigurationError(f"redeliver_delay must be >= 0, not {redeliver_delay!r}")
        if not hold_interval > 0:
            raise ConfigurationError(f"hold_interval must be > 0 seconds, not {hold_interval!r}")
        if batching is not None and not isinstance(batching, Batching):
            raise ConfigurationError(
                f"batching must be an inbox.Batching, not {type(batching).__name__}"
            )
        if (
            isinstance(max_payload_bytes, bool)
            or not isinstance(max_payload_bytes, int)
            or max_payload_bytes < 1
        ):
            raise ConfigurationError(
                f"max_payload_bytes must be a positive int, not {max_payload_bytes!r}"
            )
        if claim_check is not None and not isinstance(claim_check, ClaimCheckResolver):
            raise ConfigurationError(
                f"claim_check must be an inbox.ClaimCheckResolver, not {type(claim_check).__name__}"
            )
        #: resolves claim check references (outbox.claimcheck) before the handler sees them
        self.claim_check = claim_check
        self.runner = runner
        #: a received body larger than this is refused (reason ``payload_too_large``)
        self.max_payload_bytes = max_payload_bytes
        self.redeliver_delay = redeliver_delay
        self.batching = batching or SINGLE
        self._queues: list[asyncio.Queue[Chunk]] = []
        #: per worker: failed messages whose redelivery delay is over, to apply again
        self._ready: list[Chunk] = []
        self._workers: list[asyncio.Task[None]] = []
        self._busy: list[asyncio.Lock] = []
        #: (topic, key) with messages in flight -> [its worker, how many]; and each worker's count
        self._owners: dict[str, list[int]] = {}
        self._loads: list[int] = []
        self._crash: BaseException | None = None
        #: set by :meth:`_finish_workers`: the workers stop taking batches
        self._closing = False
        #: seconds between looks for decided held messages and parked ones whose turn came
        self.hold_interval = hold_interval
        #: seconds between refreshes of the blocked and held keys gauges (with metrics)
        self.gauge_interval = 15.0
        self._on_result = on_result
        #: early messages set aside at most, by a consumer that defers its releases
        #: (:meth:`_defer`)
        self.set_aside = 0
        self._aside: dict[tuple[str, str, int], _Aside] = {}
        self._releases: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        #: set once the runner is subscribed and receiving (tests and health checks wait on it)
        self.ready = asyncio.Event()

    def stop(self) -> None:
        """Ask ``run`` to return after the message in hand; safe to call from a signal handler
        registered with ``loop.add_signal_handler``."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        """Consume until ``stop()``. Beside it, a task applies operators' decisions and parked
        messages every ``hold_interval`` (a runner with ``on_dead="hold"``), and refreshes the
        blocked and held keys gauges every ``gauge_interval`` (a runner with metrics)."""
        needed = self.runner.holds or self.runner.metrics.enabled
        keeper = asyncio.create_task(self._upkeep()) if needed else None
        self._start_workers()
        try:
            await self._consume()
        finally:
            await self._finish_workers()  # a no-op when the subclass finished them already
            if keeper is not None:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
        if self._crash is not None:
            raise self._crash

    # ---- workers: batches, parallel by key ------------------------------------------------

    def _start_workers(self) -> None:
        n = self.batching.workers
        # a worker's buffer holds at most two chunks (each one fetch's messages of its keys)
        self._queues = [asyncio.Queue(maxsize=2) for _ in range(n)]
        self._ready = [[] for _ in range(n)]
        self._busy = [asyncio.Lock() for _ in range(n)]
        self._owners, self._loads = {}, [0] * n
        self._closing = False
        self._workers = [asyncio.create_task(self._work(i)) for i in range(n)]

    async def _submit(self, *deliveries: Delivery) -> None:
        """Hand broker messages (one fetch's worth, or one) to the workers of their keys; waits
        while a worker's buffer is full. A message that is not a valid envelope is settled
        here at once."""
        chunks: list[Chunk] = [[] for _ in self._queues]
        decodes: list[Callable[[], Envelope] | None] = [d.decode for d in deliveries]
        if self.claim_check is not None:  # a fetch's references are fetched side by side
            decodes = list(await asyncio.gather(*(self._resolving(d.decode) for d in deliveries)))
        for delivery, decode in zip(deliveries, decodes, strict=True):
            if decode is None:
                continue  # stopping while its store is away: the broker delivers it again
            checked = self._checked(decode, delivery.where)
            item: Envelope | Invalid
            ref: MessageRef | None = None
            if isinstance(checked, Invalid):
                item = checked
                data = _data(checked.error)
                topic = getattr(checked.envelope, "topic", data.get("topic"))
                key = getattr(checked.envelope, "key", data.get("key"))
                if not isinstance(topic, str) or not isinstance(key, str):
                    # no key to keep in order with: recorded (if it has an id) and settled now
                    await self._settle_invalid(checked.envelope, checked.error, None)
                    await delivery.settle(None)
                    continue
                # Its key's worker records it dead in turn, after the messages of the key
                # before it: recorded earlier, while a predecessor was still being applied,
                # it could not move the key on, and the key's later messages waited forever.
            else:
                item, ref = checked
            route = self._route(topic_key(item)) if len(chunks) > 1 else 0
            chunks[route].append((item, delivery, ref))
        for queue, chunk in zip(self._queues, chunks, strict=True):
            if chunk:
                await queue.put(chunk)

    def _route(self, key: str) -> int:
        """The worker of a message of ``key``: the one that holds its key's messages in flight,
        or else the one with the fewest messages in flight. A key moves only once all its
        messages before are settled (committed, then acknowledged), so its order holds."""
        owner = self._owners.get(key)
        if owner is None:
            loads = self._loads
            owner = self._owners[key] = [loads.index(min(loads)), 0]
        owner[1] += 1
        self._loads[owner[0]] += 1
        return owner[0]

    def _settled_keys(self, batch: Chunk, index: int) -> None:
        """The batch's messages are settled: their keys may move to another worker."""
        owners = self._owners
        self._loads[index] -= len(batch)
        for item, _, _ in batch:
            key = topic_key(item)
            owner = owners[key]
            owner[1] -= 1
            if not owner[1]:
                del owners[key]

    async def _work(self, index: int) -> None:
        queue, loop = self._queues[index], asyncio.get_running_loop()
        size = self.batching.size
        #: what the last batch could not take (over ``size``): it starts the next batch, which
        #: fills up from the buffer, instead of going out as a small batch of its own
        carry: Chunk = []
        while not self._closing:
            batch = carry or await queue.get()  # an empty chunk: only a wake-up (_retry_later)
            batch, self._ready[index], carry = self._ready[index] + batch, [], []
            deadline = loop.time() + self.batching.wait
            while len(batch) < size:
                try:
                    batch = batch + queue.get_nowait()
                    continue
                except asyncio.QueueEmpty:
                    pass
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    # asyncio.timeout, not asyncio.wait_for: on Python 3.11, wait_for returns
                    # the item instead of raising when the worker is cancelled in the instant a
                    # chunk arrives, and the worker went on to wait at queue.get() forever
                    async with asyncio.timeout(remaining):
                        batch = batch + await queue.get()
                except TimeoutError:
                    break
            batch, carry = batch[:size], batch[size:]
            async with self._busy[index]:
                try:
                    await self._settle_batch(batch)
                    if len(self._queues) > 1:
                        self._settled_keys(batch, index)
                except Exception as exc:  # not a handler failure (a broker ack): stop, surface
                    log.error("inbox: consumer worker failed: %s", exc)
                    self._crash = self._crash or exc
                    self.stop()
                    return

    async def _settle_batch(self, batch: Chunk) -> None:
        """Apply the envelopes and record the invalid messages dead, in arrival order."""
        run: list[tuple[Envelope, Delivery, MessageRef]] = []
        for entry in batch:
            item, delivery, ref = entry
            if isinstance(item, Invalid):
                await self._settle_envelopes(run)
                run = []
                await self._settle_invalid(item.envelope, item.error, None)
                await delivery.settle(None)
            elif ref is not None:  # a valid envelope comes with its ref: the entry as it is
                run.append(entry)  # type: ignore[arg-type]
            else:
                run.append((item, delivery, self.runner.check(item)))
        await self._settle_envelopes(run)

    async def _settle_envelopes(self, batch: list[tuple[Envelope, Delivery, MessageRef]]) -> None:
        """Apply a run of envelopes; then, one key's step at a time, the early messages set
        aside whose turn has come."""
        while batch:
            results = await self._apply_run(batch)
            batch = self._next_aside(batch, results) if self.defers_release else []

    async def _apply_run(self, batch: list[tuple[Envelope, Delivery, MessageRef]]) -> list[Result]:
        envelopes = [envelope for envelope, _, _ in batch]
        results: list[Result] | None = None
        if len(batch) > 1:
            try:
                results = await self.runner._handle_checked(envelopes, [r for _, _, r in batch])
            except Exception as exc:  # a bug: each message on its own finds the one at fault
                log.error("inbox: a batch of %d failed, one by one now: %s", len(batch),
                          described(exc))  # fmt: skip
        if results is None:
            results = [await self._handle(e, None, d.where) for e, d, _ in batch]
        for envelope, result in zip(envelopes, results, strict=True):
            self._report(envelope, result)
        later = []
        for (envelope, delivery, _), result in zip(batch, results, strict=True):
            if result.outcome.ack:
                await delivery.settle(result)
            elif self.defers_release:
                self._defer(envelope, delivery, result)
            else:
                later.append(delivery.settle(result))
        await asyncio.gather(*later)  # redelivery delays overlap instead of adding up
        return results

    # ---- early messages set aside (brokers that requeue at the head of the queue) ----------

    def _defer(self, envelope: Envelope, delivery: Delivery, result: Result) -> None:
        """Deal with a message not applied without holding up its worker meanwhile; it stays
        unsettled (a crash or a lost connection gives it back to the broker). A failed one is
        applied again ``redeliver_delay`` later (:meth:`_retry_later`). An early one
        (OUT_OF_ORDER) is set aside, up to ``set_aside`` of them: applied from memory as soon
        as its key's previous message is settled here, released after ``SET_ASIDE`` seconds
        otherwise (at least ``redeliver_delay``); the broker is asked for another message in
        its place (``Delivery.lend``). Past ``set_aside``, it is released after
        ``redeliver_delay``.

        Why: a broker that puts a released message back at the head of its queue (RabbitMQ's
        classic queues) hands it back at once when the consumer's window is small (the key's
        waiting messages fill it), or only after all it had sent meanwhile: either way,
        releasing a failing message and the messages of its key waiting on it, each after a
        delay that held up the worker, made a backlog (a broker restart) take minutes."""
        entry: _Aside | None = None
        if result.outcome is Outcome.OUT_OF_ORDER and envelope.seq is not None:
            where = (envelope.topic, envelope.key, envelope.seq)
            if where in self._aside or len(self._aside) < self.set_aside:
                entry = _Aside(envelope, delivery, result)
                self._aside[where] = entry  # a copy set aside before is released by its task
                if delivery.lend is not None:
                    delivery.lend()
        again = entry is None and result.outcome is Outcome.FAILED
        task = asyncio.create_task(
            self._retry_later(envelope, delivery, result)
            if again
            else self._release_later(delivery, result, entry)
        )
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _retry_later(self, envelope: Envelope, delivery: Delivery, result: Result) -> None:
        """A failed message is applied again from memory after ``redeliver_delay`` (its worker
        takes it with its next batch), not released: the broker would hand it back only
        after every message it had sent meanwhile, and the later messages of its key wait
        for it (a poison message goes dead after ``max_attempts`` in about as many delays).
        The broker's attempt counter is not moved; the inbox counts the attempts."""
        await self._wait_stopping(self.redeliver_delay)
        if self.stopping or not self._queues:
            await self._release_later(delivery, result, None, wait=False)
            return
        # its key's worker, as _submit routes it (counted in flight until its batch is settled)
        index = self._route(topic_key(envelope)) if len(self._queues) > 1 else 0
        self._ready[index].append((envelope, delivery, self.runner.check(envelope)))
        if self._queues[index].empty():
            self._queues[index].put_nowait([])  # wakes its worker up

    async def _release_later(
        self, delivery: Delivery, result: Result, entry: _Aside | None, wait: bool = True
    ) -> None:
        hold = self.redeliver_delay if entry is None else max(self.redeliver_delay, SET_ASIDE)
        if wait:
            await self._wait_stopping(hold)
        if entry is not None:
            if entry.taken:
                return  # applied from memory meanwhile
            entry.taken = True
            where = (entry.envelope.topic, entry.envelope.key, entry.envelope.seq or 0)
            if self._aside.get(where) is entry:
                del self._aside[where]
        try:
            await delivery.settle(result)
        except Exception as exc:  # its connection is gone: the broker delivers it again
            log.debug("inbox: releasing a message failed: %s", shown(str(exc), 200))

    def _next_aside(
        self, batch: list[tuple[Envelope, Delivery, MessageRef]], results: list[Result]
    ) -> list[tuple[Envelope, Delivery, MessageRef]]:
        """The early messages set aside whose key's previous message was just settled."""
        ready = []
        for (envelope, _, _), result in zip(batch, results, strict=True):
            if not result.outcome.ack or envelope.seq is None:
                continue
            entry = self._aside.pop((envelope.topic, envelope.key, envelope.seq + 1), None)
            if entry is not None and not entry.taken:
                entry.taken = True
                ready.append((entry.envelope, entry.delivery, self.runner.check(entry.envelope)))
        return ready

    async def _finish_workers(self) -> None:
        """Let every worker finish the batch in hand (committed, then settled at the broker),
        then stop them; messages still buffered are not settled, so the broker redelivers
        them. Subclasses call it before they close the broker connection."""
        workers, self._workers = self._workers, []
        self._closing = True  # a worker whose cancellation was lost ends at its next batch
        for index, task in enumerate(workers):
            async with self._busy[index]:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        releases, self._releases = self._releases, set()
        for release in releases:  # their messages are left unsettled: the broker redelivers them
            release.cancel()
        await asyncio.gather(*releases, return_exceptions=True)
        self._aside.clear()
        self._ready = [[] for _ in self._ready]
        for _ in range(3):  # release producers blocked on a full buffer; what they put is dropped
            for queue in self._queues:
                while not queue.empty():
                    queue.get_nowait()
            await asyncio.sleep(0)

    @abc.abstractmethod
    async def _consume(self) -> None:
        """Receive until :attr:`stopping`: connect, subscribe, set :attr:`ready`, and hand each
        message to the workers (``_dispatch``/``_submit`` with a :class:`Delivery`); close the
        connection before returning."""

    async def _upkeep(self) -> None:
        next_gauges = 0.0
        loop = asyncio.get_running_loop()
        while not self.stopping:
            try:
                if self.runner.holds:
                    for result in await self.runner.resolve_held():
                        log.info("inbox: held message %s released: %s", result.message_id, result)
                if self.runner.metrics.enabled and loop.time() >= next_gauges:
                    await self.runner.refresh_key_gauges()
                    next_gauges = loop.time() + self.gauge_interval
            except Exception as exc:  # the database may be away: try again next time
                log.warning("inbox: upkeep failed (held keys, gauges): %s", exc)
            await self._wait_stopping(self.hold_interval)

    async def _dispatch(
        self,
        decode: Callable[[], Envelope],
        also: AsyncAlso | None = None,
        where: Callable[[], str] = lambda: "an unknown position",
    ) -> Result | None:
        """Decode and handle one broker message; None when it is not a valid outbox envelope.

        Such a message is never redelivered in a loop, and never crashes the consumer: when
        its id can be read it is recorded dead for this consumer with the reason (where the
        reconciliation and the operator see it), then the caller settles it at the broker
        (terminated, dead-lettered where the broker has it, or acknowledged).
        """
        if self.claim_check is not None:
            resolved = await self._resolving(decode)
            if resolved is None:
                return None  # stopping while its store is away: the broker delivers it again
            decode = resolved
        item = self._decode(decode, where)
        if isinstance(item, Invalid):
            await self._settle_invalid(item.envelope, item.error, also)
            return None
        result = await self._handle(item, also, where)
        self._report(item, result)
        return result

    def _decode(
        self, decode: Callable[[], Envelope], where: Callable[[], str]
    ) -> Envelope | Invalid:
        """The envelope of a broker message, checked as the runner will record it; or, when
        it is refused (whatever was raised), what could be read of it, counted and logged."""
        checked = self._checked(decode, where)
        return checked if isinstance(checked, Invalid) else checked[0]

    def _checked(
        self, decode: Callable[[], Envelope], where: Callable[[], str]
    ) -> tuple[Envelope, MessageRef] | Invalid:
        """:meth:`_decode`, with what the runner's check returned of a valid envelope."""
        envelope: Envelope | None = None
        try:
            envelope = decode()
            if envelope.content_type == CLAIM_CHECK_TYPE:  # not resolved: no claim_check
                raise unresolved(envelope)
            ref = self.runner.check(envelope)
        except Exception as exc:
            self._refused(exc, where)
            return Invalid(envelope, exc)
        return envelope, ref

    def _refused(self, exc: Exception, where: Callable[[], str]) -> None:
        """Count a refused message by reason and log it with its broker position; what is
        shown of the message is escaped and cut short (it may be hostile)."""
        reason = _reason(exc)
        self.runner.metrics.refused.labels(self.runner.consumer, reason).inc()
        position = _position(where)
        if reason == "error":  # not a refusal but a bug
            log.error("inbox: %s failed decoding the broker message at %s: %s",
                      self.runner.consumer, position, described(exc))  # fmt: skip
        else:
            log.error("inbox: %s refused the broker message at %s (%s): %s",
                      self.runner.consumer, position, reason, shown(str(exc), 300))  # fmt: skip

    async def _handle(
        self, envelope: Envelope, also: AsyncAlso | None, where: Callable[[], str]
    ) -> Result:
        """``runner.handle``, total: it turns every handler failure into a Result, so what
        escapes it is a bug (or an ``also`` that failed): the message is recorded dead like a
        poison message, unless the database is away (then it is redelivered, as any message
        is while the database is away)."""
        try:
            return await self.runner.handle(envelope, also=also)
        except Exception as exc:
            if _is_transient(exc):
                return Result(Outcome.FAILED, envelope.id, error=exc)
            self.runner.metrics.refused.labels(self.runner.consumer, "error").inc()
            log.error("inbox: %s failed handling message %s at %s: %s", self.runner.consumer,
                      envelope.id, _position(where), described(exc))  # fmt: skip
            ref = invalid_ref(
                self.runner.consumer, envelope.id, envelope.topic, envelope.key, envelope.seq
            )
            if ref is None:  # cannot be: a decoded envelope's id is a UUID
                return Result(Outcome.FAILED, envelope.id, error=exc)
            try:
                return await self.runner.settle_invalid(ref, envelope, exc, also=also)
            except Exception as record_exc:  # not recorded: redelivered, never dropped
                log.warning("inbox: could not record message %s dead: %s", envelope.id,
                            shown(str(record_exc), 200))  # fmt: skip
                return Result(Outcome.FAILED, envelope.id, error=exc)

    def _report(self, envelope: Envelope, result: Result) -> None:
        """``on_result``: the caller's code, after the commit and before the broker's ack.
        Its exception is not caught: ``run()`` ends without the ack, and the redelivery is a
        duplicate (what a crash there would do; tests inject crashes this way)."""
        if self._on_result is not None:
            self._on_result(envelope, result)

    async def _settle_invalid(
        self, envelope: Envelope | None, exc: Exception, also: AsyncAlso | None
    ) -> None:
        data = _data(exc) if envelope is None else {}
        ref = invalid_ref(
            self.runner.consumer,
            getattr(envelope, "id", data.get("message_id")),
            getattr(envelope, "topic", data.get("topic")),
            getattr(envelope, "key", data.get("key")),
            getattr(envelope, "seq", data.get("seq")),
        )
        if ref is None:
            return  # no id to record it under: the broker's settlement is all there is
        try:
            await self.runner.settle_invalid(ref, envelope, exc, also=also)
        except Exception as record_exc:  # the database may be away: the broker still settles
            log.warning("inbox: could not record invalid message %s: %s", ref.id,
                        shown(str(record_exc), 200))  # fmt: skip

    async def _resolving(
        self, decode: Callable[[], Envelope]
    ) -> Callable[[], Envelope] | None:
        """``decode``, with a claim check reference resolved to its payload first (the
        resolver's refusal is raised when it is called, so it is counted and recorded as any
        refusal). While the store cannot be reached the message waits (as it does while the
        database is away); None when the consumer stops meanwhile."""
        resolver = self.claim_check
        assert resolver is not None
        try:
            envelope = decode()
        except Exception:
            return decode  # refused by _checked, as any message that does not decode
        if not resolver.is_reference(envelope):
            return lambda: envelope
        delay = 0.5
        while True:
            try:
                done = await resolver.resolve(envelope)
                return lambda: done
            except ClaimCheckStoreError as exc:
                log.warning("inbox: %s: %s (trying again in %.1f s)", self.runner.consumer,
                            exc, delay)  # fmt: skip
            except Exception as exc:
                return functools.partial(_raise, exc)
            if self.stopping:
                return None
            await self._wait_stopping(delay)
            delay = min(delay * 2, 30.0)

    async def _wait_stopping(self, seconds: float) -> None:
        """Wait up to ``seconds``, returning early when stop() is called."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):  # not wait_for: it may swallow a cancel (3.11)
                await self._stopping.wait()


def _raise(exc: Exception) -> Envelope:
    raise exc


def unresolved(envelope: Envelope) -> InvalidMessageError:
    """A claim check reference reached a consumer without ``claim_check`` stores."""
    return InvalidMessageError(
        f"message {envelope.id} is claim-checked (its payload is in object storage) and this "
        "consumer has no claim_check: pass claim_check=inbox.ClaimCheckResolver(stores)",
        reason="claim_check_unresolvable",
        message_id=envelope.id,
        topic=envelope.topic,
        key=envelope.key,
        seq=envelope.seq,
    )


def _data(exc: BaseException) -> dict[str, object]:
    """What a decoder could read of a refused message (id, topic, key, seq)."""
    return exc.data if isinstance(exc, OutboxError) else {}


def _reason(exc: BaseException) -> str:
    """The ``reason`` label of a refusal: one of REFUSAL_REASONS, whatever ``exc`` carries."""
    if not isinstance(exc, InvalidMessageError):
        return "error"
    reason = exc.data.get("reason", "invalid")
    return reason if isinstance(reason, str) and reason in REFUSAL_REASONS else "invalid"


def described(exc: BaseException) -> str:
    """An unexpected exception for the log: its type, its text escaped and cut short (it may
    quote a hostile message), and its traceback's frames (code locations only)."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    text = shown(str(exc), 200)
    return f"{type(exc).__name__}: {text}\nTraceback (most recent call last):\n{frames}"


def _position(where: Callable[[], str]) -> str:
    try:
        return where()
    except Exception:  # the broker client's metadata of a hostile message: not worth a crash
        return "an unknown position"


def topic_key(item: Envelope | Invalid) -> str:
    """What routes a message to its key's worker: its topic and key."""
    if isinstance(item, Invalid):
        data = _data(item.error)
        topic = getattr(item.envelope, "topic", data.get("topic"))
        key = getattr(item.envelope, "key", data.get("key"))
        return f"{topic}\x00{key}"
    return f"{item.topic}\x00{item.key}"
