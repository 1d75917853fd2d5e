"""The doorbell's check schedule for a transaction that stays open (pure arithmetic)."""

from __future__ import annotations

import pytest

from outbox._wakeup import _MAX_POLL, _MIN_POLL, _next_due


def _due_ages(until: float, lateness: float = 0.0) -> list[float]:
    """Ages at which a transaction rung at 0 that never ends is due for a check (each check
    starting ``lateness`` after it is due)."""
    ages: list[float] = []
    due = _MIN_POLL
    while due < until:
        ages.append(due)
        due = _next_due(0.0, due, due + lateness)
    return ages


def test_wakeup_schedule_doubles_the_age_then_caps_the_gap() -> None:
    ms = [round(a * 1000, 6) for a in _due_ages(0.25)]
    assert ms == [2, 4, 8, 16, 32, 64, 114, 164, 214]


def test_wakeup_schedule_late_checks_do_not_compound() -> None:
    ms = [round(a * 1000, 6) for a in _due_ages(0.1, lateness=0.0003)]
    assert ms == [2, 4, 8, 16, 32, 64]


def test_wakeup_schedule_after_a_stall_goes_on_from_the_age() -> None:
    # Due at 8 ms, checked at 100 ms: not a burst of catch-up checks at 16, 32, 64 ms.
    assert _next_due(0.0, 0.008, 0.1) == pytest.approx(0.15)


def test_wakeup_schedule_early_check_keeps_the_due_time() -> None:
    # Checked with others 1 ms before its own check: that one still comes, not pushed back.
    assert _next_due(0.0, 0.016, 0.015) == 0.016


@pytest.mark.parametrize("age", [0.0, 0.001, 0.002, 0.005, 0.02, 0.049, 0.05, 0.3, 10.0])
def test_wakeup_schedule_next_check_within_the_bound(age: float) -> None:
    # The bound the module docstring promises: after a check at age ``a`` that finds the
    # transaction open, the next is due within max(MIN, min(a, MAX)) (whether the check was
    # on time, late, or early along with others).
    for due in (age / 2, age, age + 0.001, age + _MIN_POLL):
        gap = _next_due(0.0, due, age) - age
        assert 0 < gap <= max(_MIN_POLL, min(age, _MAX_POLL)) + 1e-12
        if due > age:  # an early check: the due time stands
            assert gap == pytest.approx(due - age)
