"""The default window of `outbox reconcile` starts early enough to judge what the last recorded
run could not (no Spark session: the window is decided before the job starts)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import psycopg

from spark_ingest import previous_day
from spark_ingest.cli import _job_config


def _opts(url: str, **overrides: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "config_file": None, "outbox_url": url, "inbox_urls": (url,),
        "user": None, "password_env": None, "password_file": None, "schema": None,
        "subscribe": ("orders=billing",), "since": None, "until": None, "sla": None,
        "fail_above": (),
    }  # fmt: skip
    return opts | overrides


def _record(url: str, window_end: dt.datetime, unjudged_from: dt.datetime | None) -> None:
    summary = {"unjudged_from": None if unjudged_from is None else unjudged_from.isoformat()}
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO outbox_reconciliation_runs (run_id, started_at, finished_at, "
            "window_start, window_end, horizon_xmin, messages, discrepancies, outcome, summary) "
            "VALUES (%s, now(), now(), %s, %s, 1, 0, 0, 'ok', %s)",
            (uuid.uuid4(), window_end - dt.timedelta(days=1), window_end, json.dumps(summary)),
        )


def test_default_window_starts_where_the_last_run_left_messages_unjudged(
    database_url: str,
) -> None:
    start = previous_day().start
    # Nothing recorded: yesterday.
    assert _job_config(_opts(database_url)).window.start == start
    # The night before left a message in flight from 23:40 the day before yesterday.
    left = start - dt.timedelta(minutes=20)
    _record(database_url, start, left)
    assert _job_config(_opts(database_url)).window.start == left
    # A re-run of that window, recorded later, judged everything: nothing to carry any more.
    _record(database_url, start, None)
    assert _job_config(_opts(database_url)).window.start == start
    # A run whose window ends after this start does not count (it is not the night before).
    _record(database_url, start + dt.timedelta(hours=1), start - dt.timedelta(days=3))
    assert _job_config(_opts(database_url)).window.start == start
    # An explicit --since always wins.
    since = start + dt.timedelta(hours=3)
    config = _job_config(_opts(database_url, since=since.isoformat()))
    assert config.window.start == since
