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
from spark_plant import Msg, insert_outbox, new_id

from spark_ingest import JobConfig, Source, SourceError, Window, reconcile

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
