"""One claim's journey after it is leased: send, decide, mark, count.

The :class:`Dispatcher` owns what the relay knows about the broker while it runs: whether it
is in an outage (then claims pause with backoff and nothing counts as an attempt), which
destinations refuse messages (only their topics pause), and the per-message outcome rules of
:func:`relay._claim.decide`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from outbox.envelope import Envelope
from outbox.kit import redact
from relay._claim import Claim, Outcome, decide, mark_batch
from relay._config import RelayConfig
from relay._destinations import PausedDestinations
from relay._metrics import RelayMetrics
from relay._origin import stamped
from relay._retry import BROKER_BACKOFF, DB_BACKOFF, Backoff, retry
from relay._state import RunState
from relay._statements import RelayStatements
from relay._tracing import publish_span
from relay.brokers.base import Publisher
from relay.exceptions import (
    BrokerUnreachableError,
    DestinationUnavailableError,
    RetryablePublishError,
)

__all__ = ["Dispatcher"]

log = logging.getLogger("relay")


class Dispatcher:
    """Publishes claimed batches and records their outcomes under the claim's fencing token."""

    def __init__(
        self,
        config: RelayConfig,
        publisher: Publisher,
        metrics: RelayMetrics,
        stmts: RelayStatements,
        state: RunState,
    ) -> None:
        self.config = config
        #: put on every message (relay/_origin.py); the relay reads the database's at start
        self.origin: str | None = config.origin
        self.publisher = publisher
        self.metrics = metrics
        self._stmts = stmts
        self._state = state
        #: consecutive outage rounds; claims pause until ``paused_until`` (monotonic)
        self.broker_backoff = Backoff.of(BROKER_BACKOFF)
        self.paused_until = 0.0
        #: keys of the claims that failed entirely since the broker last acknowledged anything
        self._failing_keys: set[tuple[str, str]] = set()
        #: topics whose destination refuses messages: skipped by claims until their backoff ends
        self.destinations = PausedDestinations(config, metrics)

    def at_most_once(self, topic: str) -> bool:
        return self.config.policy(topic).semantics == "at-most-once"

    async def process(self, pool: AsyncConnectionPool[Any], claim: Claim) -> None:
        started = time.perf_counter()
        # The policy is looked up per topic of the claim, not per message: most claims hold
        # one or a few topics, and none of them at-most-once.
        topics = {e.topic for e in claim.envelopes}
        amo_topics = {t for t in topics if self.at_most_once(t)}
        if not amo_topics:
            await self._process_at_least_once(pool, claim, topics, started)
            return
        amo_ids = {e.id for e in claim.envelopes if e.topic in amo_topics}
        # At-most-once: marked published *before* sending, never retried.
        marked = await self.mark(
            pool, claim, [Outcome(i, "published") for i in amo_ids], durable=True
        )
        amo_ids &= marked
        to_send = [e for e in claim.envelopes if e.id in amo_ids or e.topic not in amo_topics]
        results, unreachable = await self.publish(to_send, claim.deadline)
        by_id = dict(zip((e.id for e in to_send), results, strict=True))
        self._count_at_most_once(to_send, amo_ids, by_id)
        keep = [i for i, e in enumerate(claim.envelopes) if e.topic not in amo_topics]
        alo = Claim(
            claim.token,
            [claim.envelopes[i] for i in keep],
            [claim.attempts[i] for i in keep],
            claim.deadline,
        )
        alo_results = [by_id[e.id] for e in alo.envelopes]
        await self._settle(pool, claim, alo, alo_results, to_send, results, unreachable, started)

    async def _process_at_least_once(
        self, pool: AsyncConnectionPool[Any], claim: Claim, topics: set[str], started: float
    ) -> None:
        """The common claim: every row at-least-once. When the broker took every message (a
        drain's every batch) the outcomes need no per-row decision."""
        results, unreachable = await self.publish(claim.envelopes, claim.deadline)
        if unreachable or not all(r is None for r in results):
            await self._settle(
                pool, claim, claim, results, claim.envelopes, results, unreachable, started
            )
            return
        self._failing_keys.clear()  # the broker acknowledged something: it is up
        for topic in topics:
            self.destinations.accepted(topic)
        await self.mark(pool, claim, [Outcome(e.id, "published") for e in claim.envelopes])
        published = collections.Counter(e.topic for e in claim.envelopes)
        for topic, n in published.items():
            self.metrics.published.labels(topic).inc(n)
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        self.broker_backoff.succeeded()

    async def _settle(
        self,
        pool: AsyncConnectionPool[Any],
        claim: Claim,
        alo: Claim,
        alo_results: list[BaseException | None],
        to_send: list[Envelope],
        results: list[BaseException | None],
        unreachable: bool,
        started: float,
    ) -> None:
        """Decide and mark the at-least-once rows ``alo`` of ``claim`` from the broker's
        results (``results`` of ``to_send``: every row sent, at-most-once ones included)."""
        if any(r is None for r in results):
            self._failing_keys.clear()  # the broker acknowledged something: it is up
        self.note_destinations(to_send, results)
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
            await self.mark(pool, claim, [Outcome(e.id, "release") for e in alo.envelopes])
            self.pause(alo_results[0])
            return
        outcomes = decide(alo, alo_results, self.config)
        await self.mark(pool, claim, outcomes)
        self.count(alo, outcomes)
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        lost = [r for r in results if isinstance(r, BrokerUnreachableError)]
        if lost:  # the connection dropped during the batch: those rows were released
            self.pause(lost[0])
        else:
            self.broker_backoff.succeeded()

    def pause(self, reason: BaseException | None) -> None:
        """Stop claiming for a while (exponential backoff): the broker is unreachable."""
        delay = self.broker_backoff.failed()
        self.metrics.broker_unreachable.set(1)
        if self._state.broker_seen(False, redact(str(reason))):
            self.metrics.broker_changed.set(self._state.broker_since)
        log.warning("relay: broker unavailable (%s); pausing %.1fs", reason, delay)
        self.paused_until = time.monotonic() + delay

    async def publish(
        self, envelopes: list[Envelope], deadline: float
    ) -> tuple[list[BaseException | None], bool]:
        """The broker's result per envelope, and whether the broker was unreachable.
        ``deadline``: the monotonic time after which nothing may be sent (a claim's lease)."""
        if not envelopes:
            return [], False
        envelopes = stamped(envelopes, self.origin)
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
        if any(r is None for r in results):
            self.metrics.broker_unreachable.set(0)  # the broker acknowledged a message: it is up
            if self._state.broker_seen(True):
                self.metrics.broker_changed.set(self._state.broker_since)
        return list(results), False

    async def mark(
        self,
        pool: AsyncConnectionPool[Any],
        claim: Claim,
        outcomes: list[Outcome],
        *,
        durable: bool = False,
    ) -> set[uuid.UUID]:
        """Mark under the fencing token; retry through a lost connection while the lease holds.

        Marks go on while the relay stops: a batch in flight finishes.
        """

        async def attempt() -> set[uuid.UUID]:
            async with pool.connection(timeout=5) as conn:
                return await mark_batch(conn, self._stmts, claim.token, outcomes, durable=durable)

        limit = claim.deadline + self.config.lease_seconds * 0.1
        marked = await retry(
            f"marking {len(outcomes)} rows (when it gives up, their lease lapses and they are "
            "published again)",
            attempt,
            Backoff.of(DB_BACKOFF),
            state=None,
            retry_on=(psycopg.Error,),
            give_up=lambda delay: time.monotonic() + delay > limit,
        )
        if marked is None:
            return set()
        self._state.db_ok()
        fenced = len(outcomes) - len(marked)
        if fenced:
            self.metrics.fenced.inc(fenced)
            log.warning("relay: %d rows were no longer ours (lease taken over); not marked", fenced)
        return marked

    def note_destinations(
        self, sent: Sequence[Envelope], results: Sequence[BaseException | None]
    ) -> None:
        """Pause the topics whose destination refused messages; resume those that took one (a
        claim's sends, or a captured batch's)."""
        refused: dict[str, BaseException] = {}
        for env, result in zip(sent, results, strict=True):
            if result is None:
                self.destinations.accepted(env.topic)
            elif isinstance(result, DestinationUnavailableError):
                refused.setdefault(env.topic, result)
        for topic, error in refused.items():
            self.destinations.refused(topic, error)

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

    def _count_at_most_once(
        self,
        sent: list[Envelope],
        amo_ids: set[uuid.UUID],
        by_id: dict[uuid.UUID, BaseException | None],
    ) -> None:
        for env in sent:
            if env.id not in amo_ids:
                continue
            if by_id[env.id] is None:
                self.metrics.published.labels(env.topic).inc()
            else:
                self.metrics.failed.labels(env.topic).inc()
                log.warning("relay: at-most-once message %s lost: %s", env.id, by_id[env.id])

    def count(self, claim: Claim, outcomes: list[Outcome]) -> None:
        """Count a settled claim's (or a captured batch's sends') outcomes, and log the dead."""
        topics = {e.id: e.topic for e in claim.envelopes}
        published = collections.Counter(topics[o.id] for o in outcomes if o.action == "published")
        for topic, n in published.items():
            self.metrics.published.labels(topic).inc(n)
        for o in outcomes:
            if o.action == "retry":
                self.metrics.failed.labels(topics[o.id]).inc()
            elif o.action == "dead":
                self.metrics.failed.labels(topics[o.id]).inc()
                self.metrics.dead.labels(topics[o.id]).inc()
                log.error("relay: message %s dead-lettered: %s", o.id, o.error)
