"""What the slot's health says to an operator
in each state (relay/_slot.py): pure logic, no server."""

from __future__ import annotations

from typing import Any

import pytest

from relay._slot import SLOT_STATES, SlotHealth


def _health(state: str, **kw: Any) -> SlotHealth:
    fields: dict[str, Any] = {
        "slot": "outbox_app",
        "active": False,
        "lag_bytes": 0,
        "retained_bytes": 0,
        "wal_status": "reserved",
        "database": "app",
        "plugin": "pgoutput",
        "confirmed_lsn": "0/1",
        "state": state,
        "this_database": "app",
    }
    fields.update(kw)
    return SlotHealth(**fields)


@pytest.mark.parametrize("state", SLOT_STATES)
def test_every_unusable_state_in_wal_mode_is_a_problem_with_its_recovery(state: str) -> None:
    health = _health(state, database="other" if state == "foreign" else "app")
    problem = health.problem("wal")
    if state == "ok":
        assert problem is None
        return
    assert problem is not None
    assert "'outbox_app'" in problem
    assert "docs/how-to/wal-capture.md" in problem
    assert "outbox capture" in problem  # says what to run
    if state == "foreign":
        assert "belongs to database 'other', not to 'app'" in problem
    assert "no message is lost" in problem
    if state in ("missing", "invalidated"):
        assert "creates a fresh" in problem  # the relay repairs it itself


def test_in_polling_mode_only_an_invalidated_slot_is_a_problem() -> None:
    assert _health("missing", database=None).problem("polling") is None  # dropped once drained
    assert _health("foreign", database="other").problem("polling") is None
    assert _health("invalidated", wal_status="lost").problem("polling") is not None


def test_a_foreign_slots_lag_is_not_shown_as_this_databases() -> None:
    foreign = _health("foreign", database="other", lag_bytes=142166768).as_status("wal")
    assert "lag_bytes" not in foreign
    assert foreign["slot_database"] == "other"
    own = _health("ok", lag_bytes=10).as_status("wal")
    assert own["lag_bytes"] == 10
    assert own["problem"] is None
