"""What a writer remembers after its WAL emit was refused in 'wal' mode, and what the slot's
health says to an operator in each state (relay/_slot.py): pure logic, no server."""

from __future__ import annotations

import time
from typing import Any

import pytest

from outbox import _capture
from outbox._capture import (
    MODE_POLLING,
    MODE_WAL,
    known_mode,
    remember_mode,
    slot_check_due,
    slot_checked,
)
from relay._slot import SLOT_STATES, SlotHealth


class _Conn:
    """Stands for a driver connection (weakly referenced, like one)."""


def test_a_refused_emit_writes_rows_for_a_while_then_tries_the_wal_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = _Conn()
    assert known_mode(conn) is None  # a new connection tries the WAL first
    remember_mode(conn, MODE_WAL)
    assert known_mode(conn) == MODE_WAL
    now = time.monotonic()
    monkeypatch.setattr(_capture.time, "monotonic", lambda: now)
    remember_mode(conn, None)  # the emit was refused...
    remember_mode(conn, MODE_WAL, refused=True)  # ...and the row's statement says 'wal'
    assert known_mode(conn) == MODE_POLLING
    remember_mode(conn, MODE_WAL)  # the next rows say 'wal' too: still rows, no emit
    assert known_mode(conn) == MODE_POLLING
    monkeypatch.setattr(
        _capture.time, "monotonic", lambda: now + _capture.REFUSED_RETRY_SECONDS
    )
    assert known_mode(conn) == MODE_WAL  # time to try the WAL again
    remember_mode(conn, "polling")
    assert known_mode(conn) == MODE_POLLING


def test_a_connection_checks_the_slot_first_then_at_most_every_slot_check_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = _Conn()
    now = time.monotonic()
    monkeypatch.setattr(_capture.time, "monotonic", lambda: now)
    assert slot_check_due(conn)  # its first emit checks
    slot_checked(conn)
    assert not slot_check_due(conn)
    monkeypatch.setattr(_capture.time, "monotonic", lambda: now + _capture.SLOT_CHECK_SECONDS)
    assert slot_check_due(conn)


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
    if state == "invalidated":
        assert "0/1" in problem  # where the loss starts


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
