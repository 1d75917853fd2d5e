"""A run's outputs: published only once the run is recorded, and timestamps that are aware."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from spark_ingest import JobConfig, Source, SourceError, Window, reconcile
from tests.spark.spark_plant import Msg, insert_outbox, new_id

H = dt.timedelta(hours=1)


def _config(outbox: str, inbox: str, now: dt.datetime) -> JobConfig:
    return JobConfig(
        outbox=Source("outbox", outbox),
        inboxes=(Source("billing", inbox),),
        subscriptions={"orders": ("billing",)},
        window=Window(now - 10 * H, now - 2 * H),
    )


def _lost(outbox: str, at: dt.datetime) -> str:
    msg = Msg(new_id(), "orders", "k1", 1, "published", at, at)
    insert_outbox(outbox, msg)
    return msg.id


def test_a_run_that_cannot_be_recorded_publishes_no_files(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    _lost(database_url, now - 5 * H)
    with psycopg.connect(database_url) as conn:
        conn.execute("DROP TABLE outbox_reconciliation_runs")
    with pytest.raises(SourceError, match=r"cannot record the run .*--no-record"):
        reconcile(spark, _config(database_url, inbox_urls[0], now), tmp_path)
    assert list(tmp_path.iterdir()) == []  # no summary.json saying "ok", no partial directory
    result = reconcile(spark, _config(database_url, inbox_urls[0], now), tmp_path, record=False)
    assert result.output_dir is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(result.run_id)]
    assert (result.output_dir / "summary.json").exists()
    assert '"finished_at"' in (result.output_dir / "summary.json").read_text()


@pytest.fixture
def new_york() -> Iterator[None]:
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


def test_details_carry_aware_utc_timestamps_whatever_the_local_time_zone(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], new_york: None
) -> None:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    lost_id = _lost(database_url, now - 5 * H)
    result = reconcile(spark, _config(database_url, inbox_urls[0], now), None, record=False)
    (row,) = [d for d in result.details if d["id"] == lost_id]
    assert row["created_at"] == now - 5 * H
    assert row["created_at"].utcoffset() == dt.timedelta(0)


def test_messages_a_run_cannot_judge_for_good_start_the_next_default_window(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    from spark_ingest import carried_start

    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    window = Window(now - 10 * H, now)
    config = JobConfig(
        outbox=Source("outbox", database_url),
        inboxes=(Source("billing", inbox_urls[0]),),
        subscriptions={"orders": ("billing",)},
        window=window,
    )
    assert carried_start(config.outbox, now) == now  # nothing recorded yet
    # Created 20 minutes ago, not published yet: in flight within the 1 h SLA, so this run
    # cannot say whether it will be lost. Tomorrow's default window must cover it again.
    pending = Msg(new_id(), "orders", "late", 1, "pending", now - dt.timedelta(minutes=20), None)
    insert_outbox(database_url, pending)
    result = reconcile(spark, config, tmp_path)
    assert result.summary["counts"]["in_flight"] == 1
    assert result.summary["unjudged_from"] == (now - dt.timedelta(minutes=20)).isoformat()
    assert carried_start(config.outbox, now) == now - dt.timedelta(minutes=20)
    assert carried_start(config.outbox, now + 24 * H) == now - dt.timedelta(minutes=20)
    assert carried_start(config.outbox, now - H) == now - H  # a run that ended after that start
