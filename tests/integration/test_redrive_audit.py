"""`outbox redrive` goes the relay's way: one audited statement (a row per re-queued message in
outbox_dead_audit, action 'redrive'), and relays woken by the doorbell once it has committed,
never from the re-drive's own transaction."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
from click.testing import CliRunner

from outbox import WAKEUP_CHANNEL, publish
from outbox._migrate import upgrade
from outbox.cli import main
from relay.admin import audit_log
from spark_ingest import redrive
from spark_ingest._redrive import wait_for_wakeup
from tests.support.ledger import record


def _plant(url: str, schema: str | None = None) -> dict[str, str]:
    """One published, one dead (with its error), one pending message; no wake-up."""
    with psycopg.connect(url) as conn:
        ids = {
            name: str(
                publish(conn, topic="orders", key=name, payload=1, schema=schema, wakeup=False)
            )
            for name in ("published", "dead", "pending")
        }
    assert record(url, schema) == 3  # numbered into outbox_messages, as a relay does
    table = f"{schema}.outbox_messages" if schema else "outbox_messages"
    with psycopg.connect(url) as conn:
        conn.execute(
            f"UPDATE {table} SET status = 'published', published_at = clock_timestamp() "
            "WHERE id = %s",
            (ids["published"],),
        )
        conn.execute(
            f"UPDATE {table} SET status = 'dead', attempts = 3, last_error = 'boom' WHERE id = %s",
            (ids["dead"],),
        )
    return ids


def _audit(url: str, schema: str | None = None) -> list[tuple[Any, ...]]:
    table = f"{schema}.outbox_dead_audit" if schema else "outbox_dead_audit"
    with psycopg.connect(url) as conn:
        return conn.execute(
            f"SELECT action, actor, reason, message_id::text, topic, key, seq, last_error "
            f"FROM {table} ORDER BY key"
        ).fetchall()


def _drained(listener: psycopg.Connection[Any]) -> None:
    list(listener.notifies(timeout=0.1))


def test_redrive_audits_each_requeue_and_wakes_a_listener_after_commit(database_url: str) -> None:
    ids = _plant(database_url)
    missing = str(uuid.uuid4())
    with (
        psycopg.connect(database_url, autocommit=True) as listener,
        psycopg.connect(database_url) as conn,
    ):
        listener.execute(f"LISTEN {WAKEUP_CHANNEL}")
        _drained(listener)
        result = redrive(
            conn, [*ids.values(), missing], actor="ops@test", reason="lost in the night"
        )
        assert result.requeued == sorted([ids["published"], ids["dead"]])
        assert result.already_pending == [ids["pending"]]
        assert result.missing == [missing]
        # Not committed yet: no audit row to be seen, and nobody woken to find nothing.
        assert _audit(database_url) == []
        assert list(listener.notifies(timeout=0.3)) == []
        conn.commit()
        got = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.channel for n in got] == [WAKEUP_CHANNEL]
        assert got[0].pid != conn.info.backend_pid  # the doorbell's, not the re-drive's session

        rows = _audit(database_url)
        assert rows == [
            ("redrive", "ops@test", "lost in the night", ids["dead"], "orders", "dead", 1, "boom"),
            (
                "redrive",
                "ops@test",
                "lost in the night",
                ids["published"],
                "orders",
                "published",
                1,
                None,
            ),
        ]
        status: dict[str, str] = dict(
            conn.execute(
                "SELECT key, status FROM outbox_messages WHERE id = ANY(%s::uuid[])",
                (list(ids.values()),),
            ).fetchall()
        )
        assert status == {"published": "pending", "dead": "pending", "pending": "pending"}
        conn.commit()

        # Again: nothing left to re-queue, so no audit row and no wake-up.
        _drained(listener)
        again = redrive(conn, ids.values(), actor="ops@test")
        conn.commit()
        assert again.requeued == []
        assert len(_audit(database_url)) == 2
        assert list(listener.notifies(timeout=0.3)) == []
    # The relay's audit list (`outbox dead audit`) shows re-drives next to retries and purges.
    assert {r["action"] for r in audit_log(database_url)} == {"redrive"}


def test_rolled_back_redrive_audits_nothing_and_wakes_nobody(database_url: str) -> None:
    ids = _plant(database_url)
    with (
        psycopg.connect(database_url, autocommit=True) as listener,
        psycopg.connect(database_url) as conn,
    ):
        listener.execute(f"LISTEN {WAKEUP_CHANNEL}")
        _drained(listener)
        assert redrive(conn, ids.values()).requeued
        conn.rollback()
        assert wait_for_wakeup(conn)
        assert list(listener.notifies(timeout=0.3)) == []
    assert _audit(database_url) == []


def test_cli_redrive_audits_who_and_why_and_wakes_relays(database_url: str, tmp_path: Path) -> None:
    ids = _plant(database_url)
    ids_file = tmp_path / "redrive.txt"
    ids_file.write_text("".join(f"{i}\n" for i in ids.values()))
    args = ["redrive", str(ids_file), "--url", database_url]
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {WAKEUP_CHANNEL}")
        _drained(listener)
        dry = CliRunner().invoke(main, [*args, "--dry-run"])
        assert dry.exit_code == 0, dry.output
        assert "would re-queue 2; already pending 1; not found 0" in dry.output
        assert _audit(database_url) == []
        assert list(listener.notifies(timeout=0.3)) == []

        done = CliRunner().invoke(main, [*args, "--actor", "nightly", "--reason", "run 42"])
        assert done.exit_code == 0, done.output
        assert "re-queued 2; already pending 1; not found 0" in done.output
        # The command waited for the doorbell before returning: the wake-up is already out.
        assert [n.channel for n in listener.notifies(timeout=1, stop_after=1)] == [WAKEUP_CHANNEL]
    assert [(r[0], r[1], r[2], r[3]) for r in _audit(database_url)] == [
        ("redrive", "nightly", "run 42", ids["dead"]),
        ("redrive", "nightly", "run 42", ids["published"]),
    ]


def test_redrive_in_a_schema(empty_database_url: str) -> None:
    url = empty_database_url
    upgrade(url, schema="messaging")
    ids = _plant(url, schema="messaging")
    with psycopg.connect(url) as conn:
        result = redrive(conn, ids.values(), schema="messaging", actor="ops")
    assert result.requeued == sorted([ids["published"], ids["dead"]])
    assert [r[3] for r in _audit(url, schema="messaging")] == [ids["dead"], ids["published"]]
