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
    ) -> None:
        if not isinstance(runner, AsyncHandlerRunner):
            raise ConfigurationError(
                f"runner must be an inbox.AsyncHandlerRunner, not {type(runner).__name__}"
            )
        if redeliver_delay < 0:
            raise ConfigurationError(f"redeliver_delay must be >= 0, not {redeliver_delay!r}")
        self.runner = runner
        self.redeliver_delay = redeliver_delay
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

    async def run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _dispatch(
        self, decode: Callable[[], Envelope], also: AsyncAlso | None = None
    ) -> Result | None:
        """Decode and handle one broker message; None when it cannot be decoded."""
        try:
            envelope = decode()
        except (InvalidMessageError, UnicodeDecodeError) as exc:
            log.error("inbox: dropping a broker message that is not an outbox envelope: %s", exc)
            return None
        result = await self.runner.handle(envelope, also=also)
        if self._on_result is not None:
            self._on_result(envelope, result)
        return result

    async def _wait_stopping(self, seconds: float) -> None:
        """Wait up to ``seconds``, returning early when stop() is called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)


def settle_later(delay: float, callback: Callable[..., Any], *args: Any) -> None:
    """Schedule ``callback(*args)`` after ``delay`` seconds on the running loop."""
    asyncio.get_running_loop().call_later(delay, callback, *args)
