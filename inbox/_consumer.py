"""What every broker consumer runner shares: stop flag, decoding, outcome callback.

A runner acknowledges a broker message only after the database transaction that recorded it
(and applied its effect, or found it a duplicate) has committed; a crash before the ack means a
redelivery, which the inbox turns into a DUPLICATE with no second effect. A message the runner
cannot decode (not published by the relay) is logged and settled without an effect (terminated,
dead-lettered where the broker has it, or acknowledged), since no redelivery can fix it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from inbox._receive import invalid_ref
from inbox._runner import AsyncAlso, AsyncHandlerRunner, Result
from outbox.envelope import Envelope
from outbox.exceptions import ConfigurationError, InvalidMessageError

__all__ = ["BrokerConsumer", "ResultCallback"]

log = logging.getLogger("inbox.consumer")

#: ``on_result(envelope, result)``, called after each delivery is settled in the database.
ResultCallback = Callable[[Envelope, Result], object]


class BrokerConsumer:
    """Base of the broker runners: ``await run()`` until ``stop()``; then it shuts down cleanly,
    finishing the message in hand (commit, then ack) and closing its broker connection."""

    def __init__(
        self,
        runner: AsyncHandlerRunner,
        *,
        redeliver_delay: float = 1.0,
        on_result: ResultCallback | None = None,
        hold_interval: float = 1.0,
    ) -> None:
        if not isinstance(runner, AsyncHandlerRunner):
            raise ConfigurationError(
                f"runner must be an inbox.AsyncHandlerRunner, not {type(runner).__name__}"
            )
        if redeliver_delay < 0:
            raise ConfigurationError(f"redeliver_delay must be >= 0, not {redeliver_delay!r}")
        if not hold_interval > 0:
            raise ConfigurationError(f"hold_interval must be > 0 seconds, not {hold_interval!r}")
        self.runner = runner
        self.redeliver_delay = redeliver_delay
        #: seconds between looks for decided held messages and parked ones whose turn came
        self.hold_interval = hold_interval
        #: seconds between refreshes of the blocked and held keys gauges (with metrics)
        self.gauge_interval = 15.0
        self._on_result = on_result
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
        try:
            await self._consume()
        finally:
            if keeper is not None:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper

    async def _consume(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

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
        self, decode: Callable[[], Envelope], also: AsyncAlso | None = None
    ) -> Result | None:
        """Decode and handle one broker message; None when it is not a valid outbox envelope.

        Such a message is never redelivered in a loop, and never crashes the consumer: when
        its id can be read it is recorded dead for this consumer with the reason (where the
        reconciliation and the operator see it), then the caller settles it at the broker
        (terminated, dead-lettered where the broker has it, or acknowledged).
        """
        envelope: Envelope | None = None
        try:
            envelope = decode()
            # handle() validates the envelope (seq range, topic and key text) before it opens a
            # transaction, and turns every handler failure into a Result: only bad input raises
            result = await self.runner.handle(envelope, also=also)
        except (InvalidMessageError, UnicodeDecodeError) as exc:
            log.error("inbox: a broker message is not a valid outbox envelope: %s", exc)
            await self._settle_invalid(envelope, exc, also)
            return None
        if self._on_result is not None:
            self._on_result(envelope, result)
        return result

    async def _settle_invalid(
        self, envelope: Envelope | None, exc: Exception, also: AsyncAlso | None
    ) -> None:
        data = getattr(exc, "data", {}) if envelope is None else {}
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
            log.warning("inbox: could not record invalid message %s: %s", ref.id, record_exc)

    async def _wait_stopping(self, seconds: float) -> None:
        """Wait up to ``seconds``, returning early when stop() is called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)


def settle_later(delay: float, callback: Callable[..., Any], *args: Any) -> None:
    """Schedule ``callback(*args)`` after ``delay`` seconds on the running loop."""
    asyncio.get_running_loop().call_later(delay, callback, *args)
