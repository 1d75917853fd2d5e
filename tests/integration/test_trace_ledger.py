"""`outbox trace` of a message that is committed but not numbered yet: it is a row of the
ledger (outbox_wal_pending) until a relay numbers it, and the trace says so, with its topic and
key, instead of "not found"; once numbered, the same id traces to its outbox row and seq."""

from __future__ import annotations

import psycopg
from click.testing import CliRunner

from outbox import publish
from outbox.cli import main
from tests.support.ledger import record


def _trace(url: str, message_id: str) -> str:
    out = CliRunner().invoke(main, ["trace", message_id, "--url", url])
    assert out.exit_code == 1, out.output  # not published: something to do
    return out.output


def test_a_message_in_the_ledger_is_traced_as_committed_not_numbered(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        msg_id = publish(conn, topic="orders", key="order-7", payload={"total": 3})
        conn.commit()
    waiting = _trace(database_url, str(msg_id))
    first = waiting.splitlines()[0]
    assert "topic orders" in first
    assert "key order-7" in first
    assert "seq not yet" in first
    assert "committed, not numbered yet" in waiting
    assert "outbox: ledger" in waiting
    assert "no relay has heartbeated" in waiting  # what to do: run one
    assert record(database_url) == 1
    numbered = _trace(database_url, str(msg_id))
    assert "seq 1" in numbered.splitlines()[0]
    assert "pending: not published yet" in numbered


def test_status_counts_the_ledger_and_an_unreadable_row_never_fails_it(database_url: str) -> None:
    """`outbox status` counts committed, not yet numbered messages by topic; a ledger row a
    hostile producer made unreadable counts under '?' instead of failing the statement."""
    from relay.admin import relay_status

    with psycopg.connect(database_url) as conn:
        publish(conn, topic="orders", key="k", payload=1)
        conn.execute(
            "INSERT INTO outbox_wal_pending (id, record) VALUES (gen_random_uuid(), '\\x01'), "
            "(gen_random_uuid(), '\\x0100' || decode(repeat('00', 24), 'hex') || '\\x7fffffff')"
        )
        conn.commit()
    pending = {t["topic"]: t["pending"] for t in relay_status(database_url).topics}
    assert pending == {"orders": 1, "?": 2}
