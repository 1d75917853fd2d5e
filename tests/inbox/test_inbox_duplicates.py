"""inbox_messages.duplicates counts deliveries after the message was settled, and only those:
failed handler attempts count in ``attempts`` but are not duplicates (the reconciliation flags a
duplicate from this column)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from inbox import HandlerRunner, Outcome
from tests.inbox.inbox_helpers import Flaky, make_envelope


def _counts(url: str, msg_id: Any) -> tuple[str, int, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status, attempts, duplicates FROM inbox_messages "
            "WHERE consumer = 'c' AND message_id = %s",
            (msg_id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


@pytest.mark.parametrize(
    ("failures", "max_attempts", "redeliveries", "expected"),
    [
        (0, 5, 0, ("processed", 1, 0)),  # clean
        (2, 5, 0, ("processed", 3, 0)),  # failed twice, then processed: retried, no duplicate
        (99, 3, 0, ("dead", 3, 0)),  # dead: failed attempts only, no duplicate
        (0, 5, 2, ("processed", 3, 2)),  # redelivered twice after it was processed
        (2, 5, 1, ("processed", 4, 1)),  # retried, processed, then redelivered once
        (99, 3, 1, ("dead", 4, 1)),  # redelivered once after it was dead
    ],
)
def test_inbox_duplicates_count_only_deliveries_after_settling(
    pool: ConnectionPool,
    effects_url: str,
    failures: int,
    max_attempts: int,
    redeliveries: int,
    expected: tuple[str, int, int],
) -> None:
    runner = HandlerRunner(pool, Flaky(failures), consumer="c", max_attempts=max_attempts)
    msg = make_envelope()
    while not runner.handle(msg).outcome.ack:
        pass
    outcomes = [runner.handle(msg).outcome for _ in range(redeliveries)]
    assert outcomes == [Outcome.DUPLICATE] * redeliveries
    assert _counts(effects_url, msg.id) == expected
