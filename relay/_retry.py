"""How the relay waits after a failure: the one backoff and the one retry loop it uses.

The database and the broker each get a :class:`Backoff`; every loop that retries an operation
(the start-up checks, the broker connection, marks, the LISTEN connection, the WAL stream) goes
through :func:`retry`, so each logs the same way and none can spin or overflow.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from relay._state import RunState

__all__ = ["BROKER_BACKOFF", "DB_BACKOFF", "Backoff", "retry"]

_T = TypeVar("_T")

log = logging.getLogger("relay")

#: (first, longest) wait in seconds after a database failure, and after a broker outage
DB_BACKOFF = (0.1, 5.0)
BROKER_BACKOFF = (0.1, 10.0)


@dataclass
class Backoff:
    """Exponential backoff over consecutive failures: ``first * 2**failures``, at most
    ``longest``. :meth:`succeeded` starts over."""

    first: float
    longest: float
    failures: int = 0

    @classmethod
    def of(cls, bounds: tuple[float, float]) -> Backoff:
        return cls(bounds[0], bounds[1])

    def failed(self) -> float:
        """Count a failure; the wait before the next attempt."""
        self.failures += 1
        return self.delay()

    def delay(self) -> float:
        # The exponent is capped: an outage of hours counts thousands of failures, and from
        # 2**1024 on the product no longer fits a float (OverflowError).
        return min(self.first * 2.0 ** min(self.failures, 32), self.longest)

    def succeeded(self) -> None:
        self.failures = 0


async def retry(
    what: str,
    attempt: Callable[[], Awaitable[_T]],
    backoff: Backoff,
    *,
    state: RunState | None,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    give_up: Callable[[float], bool] | None = None,
) -> _T | None:
    """``attempt()``'s result, retried with ``backoff`` while it raises one of ``retry_on``.

    None when the relay stops first (``state``; None: never stops) or when ``give_up(delay)``
    says the next attempt, ``delay`` seconds away, is too late.
    """
    last_reason: str | None = None
    while state is None or not state.stopping:
        try:
            result = await attempt()
        except retry_on as exc:
            delay = backoff.failed()
            reason = str(exc) or type(exc).__name__
            if give_up is not None and give_up(delay):
                log.error("relay: %s failed (%s); giving up", what, reason)
                return None
            # one line per change of state, not per attempt: an outage of an hour at the
            # longest backoff would otherwise repeat the same line every few seconds
            level = logging.WARNING if reason != last_reason else logging.DEBUG
            log.log(level, "relay: %s failed (%s); retrying with backoff (next in %.1fs)",
                    what, reason, delay)  # fmt: skip
            last_reason = reason
            if state is None:
                await asyncio.sleep(delay)
            else:
                await state.sleep(delay)
            continue
        if last_reason is not None:
            log.info("relay: %s succeeded after %d failed attempt(s)", what, backoff.failures)
        backoff.succeeded()
        return result
    return None
