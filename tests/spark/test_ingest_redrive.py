"""Incremental ingest into the Parquet lake, `outbox redrive`, and the runs table's migration."""

from __future__ import annotations

import datetime as dt
import shutil
import time
from pathlib import Path
from typing import Any

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from outbox._migrate import sqlalchemy_url
from outbox.cli import main
from outbox.schema import RECONCILIATION_RUNS, make_metadata
from spark_ingest import Source, ingest, read_lake
from tests.spark.spark_plant import Msg, insert_inbox, insert_outbox, new_id

H = dt.timedelta(hours=1)


def _wait_below_horizon(url: str, deadline_s: float = 60) -> None:
    """Wait until every row's last writer (xmin; the outbox's tx_id too) is below the cluster's
    snapshot xmin: another session's open transaction holds the horizon back."""
    end = time.monotonic() + deadline_s
    query = """
        SELECT coalesce(max(v), 0) < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
          FROM (SELECT xmin::text::bigint AS v FROM inbox_messages
                UNION ALL SELECT xmin::text::bigint FROM outbox_messages
                UNION ALL SELECT tx_id::text::bigint FROM outbox_messages
                 WHERE tx_id <> '3'::xid8) AS t
    """  # an epoch-0 test cluster: xid8 and 32-bit xmin agree
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < end:
            row = conn.execute(query).fetchone()
            if row and row[0]:
                return
            time.sleep(0.2)
    raise AssertionError("rows stayed above the horizon (a transaction left open?)")


def _lake_ids(spark: Any, path: Path) -> list[str]:
    return [r[0] for r in spark.read.parquet(str(path)).select("id").collect()]


def _night_twice(
    spark: Any, lake: Path, tmp_path: Path, outbox: Any, billing: Any, *, expected: list[int]
) -> None:
    """Ingest a night, then the same night again as if its watermark had never been stored
    (a crash after the data landed): both land ``expected`` rows per source."""
    marks = lake / "_watermarks"
    saved = tmp_path / "marks"
    shutil.copytree(marks, saved)
    assert [x.rows for x in ingest(spark, lake, outbox, (billing,))] == expected
    shutil.rmtree(marks)
    shutil.copytree(saved, marks)
    assert [x.rows for x in ingest(spark, lake, outbox, (billing,))] == expected


def test_ingest_lands_new_rows_once_even_when_a_night_is_rerun(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    old = [
        Msg(new_id(), "orders", f"k{i}", 1, "published", now - (30 + i) * H, now) for i in range(4)
    ]
    insert_outbox(database_url, *old)
    for m in old:
        insert_inbox(inbox_urls[0], "billing", m.id, m.topic, m.key, 1, now - 20 * H)
    outbox, billing = Source("outbox", database_url), Source("billing", inbox_urls[0])
    lake = tmp_path / "lake"
    _wait_below_horizon(database_url)
    _wait_below_horizon(inbox_urls[0])

    first = ingest(spark, lake, outbox, (billing,))
    assert [x.rows for x in first] == [4, 4]
    assert {p.name for p in (lake / "outbox" / "outbox_messages").iterdir()} >= {
        f"date={(now - 30 * H).date()}"
    }
    assert [x.rows for x in ingest(spark, lake, outbox, (billing,))] == [0, 0]

    new = [Msg(new_id(), "orders", f"n{i}", 1, "pending", now, None) for i in range(2)]
    insert_outbox(database_url, *new, tx_id=None)  # real transaction ids
    insert_inbox(inbox_urls[0], "billing", new[0].id, "orders", "n0", 1, dt.datetime.now(dt.UTC))
    _wait_below_horizon(database_url)
    _wait_below_horizon(inbox_urls[0])
    _night_twice(spark, lake, tmp_path, outbox, billing, expected=[2, 1])

    ids = _lake_ids(spark, lake / "outbox" / "outbox_messages")
    assert sorted(ids) == sorted(m.id for m in old + new)
    inbox_rows = spark.read.parquet(str(lake / "billing" / "inbox_messages")).count()
    assert inbox_rows == 5


def test_ingest_lands_a_status_change_as_the_rows_new_version(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    msgs = [Msg(new_id(), "orders", f"s{i}", 1, "pending", now - 2 * H, None) for i in range(3)]
    insert_outbox(database_url, *msgs)
    insert_inbox(inbox_urls[0], "billing", msgs[0].id, "orders", "s0", 1, now - H,
                 status="processing")  # fmt: skip
    outbox, billing = Source("outbox", database_url), Source("billing", inbox_urls[0])
    lake = tmp_path / "lake"
    _wait_below_horizon(database_url)
    _wait_below_horizon(inbox_urls[0])
    assert [x.rows for x in ingest(spark, lake, outbox, (billing,))] == [3, 1]

    # After landing: the relay publishes one message and dead-letters another (no timestamp
    # tells), the consumer finishes processing.
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE outbox_messages SET status = 'published', published_at = now() WHERE id = %s",
            (msgs[0].id,),
        )
        conn.execute("UPDATE outbox_messages SET status = 'dead' WHERE id = %s", (msgs[1].id,))
    with psycopg.connect(inbox_urls[0]) as conn:
        conn.execute("UPDATE inbox_messages SET status = 'processed', attempts = 2")
    _wait_below_horizon(database_url)
    _wait_below_horizon(inbox_urls[0])
    _night_twice(spark, lake, tmp_path, outbox, billing, expected=[2, 1])
    assert [x.rows for x in ingest(spark, lake, outbox, (billing,))] == [0, 0]

    history = spark.read.parquet(str(lake / "outbox" / "outbox_messages"))
    assert history.count() == 5  # three first versions, two second ones: no duplicates
    current = read_lake(spark, lake, "outbox", "outbox_messages")
    assert {r["id"]: r["status"] for r in current.collect()} == {
        msgs[0].id: "published",
        msgs[1].id: "dead",
        msgs[2].id: "pending",
    }
    inbox_now = read_lake(spark, lake, "billing", "inbox_messages").collect()
    assert [(r["status"], r["attempts"]) for r in inbox_now] == [("processed", 2)]


def test_redrive_requeues_lost_ids_and_keeps_their_history(
    database_url: str, tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    lost = Msg(new_id(), "orders", "a", 1, "published", now - 5 * H, now - 5 * H)
    pending = Msg(new_id(), "orders", "b", 1, "pending", now - 5 * H, None)
    insert_outbox(database_url, lost, pending)
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE outbox_messages SET attempts = 2, last_error = 'timeout' WHERE id = %s",
            (lost.id,),
        )
    missing = new_id()
    ids_file = tmp_path / "redrive.txt"
    ids_file.write_text(f"{lost.id}\n# a comment\n{pending.id}\n{missing}\n")
    args = ["redrive", str(ids_file), "--url", database_url]

    dry = CliRunner().invoke(main, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would re-queue 1; already pending 1; not found 1" in dry.output
    with psycopg.connect(database_url) as conn:
        assert conn.execute(
            "SELECT status FROM outbox_messages WHERE id = %s", (lost.id,)
        ).fetchone() == ("published",)

    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    assert "re-queued 1; already pending 1; not found 1" in done.output
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT status, attempts, last_error, published_at, "
            "available_at > now() - interval '1 minute' FROM outbox_messages WHERE id = %s",
            (lost.id,),
        ).fetchone()
    assert row == ("pending", 2, "timeout", None, True)
    again = CliRunner().invoke(main, args)
    assert "re-queued 0; already pending 2" in again.output


def test_redrive_rejects_a_file_that_is_not_ids(database_url: str, tmp_path: Path) -> None:
    ids_file = tmp_path / "bad.txt"
    ids_file.write_text("not-a-uuid\n")
    result = CliRunner().invoke(main, ["redrive", str(ids_file), "--url", database_url])
    assert result.exit_code == 2
    assert "bad.txt:1: 'not-a-uuid' is not a message id" in result.output


def test_runs_table_migration_matches_schema_py(database_url: str) -> None:
    engine = create_engine(sqlalchemy_url(database_url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), make_metadata())
    finally:
        engine.dispose()
    ours = [d for d in diff if RECONCILIATION_RUNS in repr(d)]
    assert ours == []
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (RECONCILIATION_RUNS,)).fetchone() == (
            RECONCILIATION_RUNS,
        )
