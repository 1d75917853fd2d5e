"""What a running relay's parts share: the stop signal, the wake-up, the database's last answer.

Every long wait in the relay is a :meth:`RunState.sleep`, so :meth:`RunState.stop` ends it at
once; the claim loop waits for work on :attr:`RunState.wake`, which the LISTEN connection, a
finished batch and the WAL capture set.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

__all__ = ["RunState"]


class RunState:
    __slots__ = (
        "_stopping",
        "broker_error",
        "broker_since",
        "broker_up",
        "last_db_ok",
        "ledger",
        "listening",
        "wake",
    )

    def __init__(self) -> None:
        self._stopping = asyncio.Event()
        #: set when there may be new work for the claim loop
        self.wake = asyncio.Event()
        #: set by a NOTIFY (and the stop): the 'polling' mode capture reads the ledger at once
        self.ledger = asyncio.Event()
        #: monotonic time of the last statement the database answered (health checks read it)
        self.last_db_ok = 0.0
        #: the LISTEN connection is up: a commit's NOTIFY wakes the loop (else it polls)
        self.listening = False
        #: the broker answered last time (None: not tried yet), since when (wall clock), and
        #: why it did not (``outbox status`` and the metrics show them)
        self.broker_up: bool | None = None
        self.broker_since = time.time()
        self.broker_error: str | None = None

    def broker_seen(self, up: bool, error: str | None = None) -> bool:
        """Record whether the broker answered; True when that changed."""
        changed = up is not self.broker_up
        if changed:
            self.broker_up, self.broker_since = up, time.time()
        self.broker_error = None if up else error
        return changed

    def stop(self) -> None:
        self._stopping.set()
        self.wake.set()
        self.ledger.set()

    def notified(self) -> None:
        """A NOTIFY came (or may have been missed): the claim loop and the ledger's reader look
        now."""
        self.wake.set()
        self.ledger.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def db_ok(self) -> None:
        self.last_db_ok = time.monotonic()

    async def stopped(self) -> None:
        """Return once the relay is stopping."""
        await self._stopping.wait()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the relay is stopped meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def wait_for_ledger(self, at_most: float) -> None:
        """Wait until a NOTIFY (or the stop), at most ``at_most`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most):
                await self.ledger.wait()

    async def wait_for_work(self, at_most: float) -> None:
        """Wait until woken (or stopped), at most ``at_most`` seconds (the fallback poll)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most):
                await self.wake.wait()
