"""The relay's one backoff and retry loop (pure logic: no database, no broker)."""

from __future__ import annotations

import asyncio

import pytest

from relay._retry import Backoff, retry
from relay._state import RunState


def test_backoff_doubles_up_to_its_longest_and_starts_over_after_a_success() -> None:
    backoff = Backoff(0.1, 1.0)
    assert [backoff.failed() for _ in range(5)] == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0])
    backoff.succeeded()
    assert backoff.failed() == pytest.approx(0.2)


def test_backoff_survives_an_outage_of_thousands_of_failures() -> None:
    backoff = Backoff(0.1, 5.0, failures=100_000)  # 0.1 * 2**100000 would overflow a float
    assert backoff.failed() == 5.0


def test_retry_returns_the_first_success_and_resets_the_backoff() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return "ok"

    backoff = Backoff(0.001, 0.002)
    assert asyncio.run(retry("flaky", flaky, backoff, state=RunState())) == "ok"
    assert len(calls) == 3
    assert backoff.failures == 0


def test_retry_lets_other_errors_through() -> None:
    async def broken() -> None:
        raise KeyError("a bug, not an outage")

    with pytest.raises(KeyError):
        asyncio.run(
            retry("broken", broken, Backoff(0.001, 0.002), state=None, retry_on=(OSError,))
        )


def test_retry_gives_up_when_told_the_next_attempt_is_too_late() -> None:
    delays: list[float] = []

    async def down() -> None:
        raise OSError("down")

    def too_late(delay: float) -> bool:
        delays.append(delay)
        return len(delays) == 3

    result = asyncio.run(retry("down", down, Backoff(0.001, 0.004), state=None, give_up=too_late))
    assert result is None
    assert delays == pytest.approx([0.002, 0.004, 0.004])


def test_retry_stops_waiting_when_the_relay_stops() -> None:
    async def go() -> object:
        state = RunState()

        async def down() -> None:
            state.stop()  # stopped while the first attempt fails: no 60 s wait follows
            raise OSError("down")

        async with asyncio.timeout(5):
            return await retry("down", down, Backoff(60.0, 60.0), state=state)

    assert asyncio.run(go()) is None


def test_retry_logs_once_per_change_of_reason_not_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reasons = ["refused", "refused", "refused", "timed out", "timed out"]

    async def flaky() -> str:
        if reasons:
            raise ConnectionError(reasons.pop(0))
        return "ok"

    with caplog.at_level("INFO", logger="relay"):
        assert asyncio.run(retry("db", flaky, Backoff(0.001, 0.002), state=RunState())) == "ok"
    lines = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "INFO")]
    assert [line.split(" (")[1].split(")")[0] for line in lines[:2]] == ["refused", "timed out"]
    assert len(lines) == 3
    assert "succeeded after 5 failed attempt(s)" in lines[2]
