"""The tests' one poll-until helper, sync and async: for a condition nothing signals (a row in
another process's database, a broker's count). Where something does signal (a log line, a
process's output), wait on that instead."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

#: how often a condition is asked again
EVERY = 0.02


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Ask ``predicate()`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(EVERY)


async def await_for(
    predicate: Callable[[], bool | Awaitable[bool]], within: float = 20.0, what: str = "condition"
) -> None:
    """Ask ``predicate()`` (a plain or an async function) until it is true, sleeping in the
    event loop between asks; fail naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        ok = predicate()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(EVERY)
