"""The HTML report of a real run: readable durations, the oldest lost and stuck messages, the
keys with the most problem messages, and the link to the re-drive file."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

from spark_ingest import JobConfig, Source, Window, reconcile
from spark_ingest._outputs import report_rows
from tests.spark.spark_plant import Msg, insert_inbox, insert_outbox, new_id

H = dt.timedelta(hours=1)
# Planted ages are whole hours plus this much, so each reads "<n> h 0 min" however long the
# job takes to freeze its horizons after planting (up to 20 s).
MARGIN = dt.timedelta(seconds=10)
HOSTILE_KEY = "<script>alert('k')</script>"


def _table(doc: str, table_id: str) -> list[list[str]]:
    """The cells of each row of the table with that id, header row left out."""
    match = re.search(rf"<table id='{table_id}'>(.*?)</table>", doc)
    assert match, f"no table {table_id} in the report"
    rows = re.findall(r"<tr>(.*?)</tr>", match.group(1))
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows[1:]]


def _plant(outbox: str, inbox: str, now: dt.datetime) -> dict[str, str]:
    ids: dict[str, str] = {}

    def msg(name: str, key: str, seq: int, age: dt.timedelta, status: str = "published") -> Msg:
        ids[name] = new_id()
        created = now - age - MARGIN
        published = None if status == "pending" else created + dt.timedelta(minutes=1)
        return Msg(ids[name], "orders", key, seq, status, created, published)

    slow_created = now - 8 * H
    slow = Msg(
        new_id(),
        "orders",
        "k-slow",
        1,
        "published",
        slow_created,
        slow_created + dt.timedelta(seconds=12.4),
    )
    insert_outbox(
        outbox,
        slow,
        msg("hot1", "k-hot", 1, 7 * H),
        msg("hot2", "k-hot", 2, 6 * H),
        msg("hot3", "k-hot", 3, 5 * H),
        msg("hostile", HOSTILE_KEY, 1, 4 * H),
        msg("stuck", "k-stuck", 1, 9 * H, status="pending"),
    )
    # Delivered 3 h and 396.3 ms after it was created: end-to-end latency 10800396.3 ms.
    processed = slow_created + 3 * H + dt.timedelta(milliseconds=396.3)
    insert_inbox(inbox, "billing", slow.id, "orders", "k-slow", 1, processed)
    return ids


def test_report_shows_readable_durations_the_oldest_problem_messages_and_the_redrive_link(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    ids = _plant(database_url, inbox_urls[0], now)
    config = JobConfig(
        outbox=Source("outbox", database_url),
        inboxes=(Source("billing", inbox_urls[0]),),
        subscriptions={"orders": ("billing",)},
        window=Window(now - 10 * H, now - 2 * H),
        sla=H,
    )
    result = reconcile(spark, config, tmp_path, record=False)
    counts = result.summary["counts"]
    assert (counts["delivered"], counts["lost"], counts["stuck"]) == (1, 4, 1)
    out = tmp_path / str(result.run_id)
    doc = (out / "report.html").read_text()

    # Durations: readable in the report, raw milliseconds in summary.json.
    (latency,) = _table(doc, "latency")
    assert latency[3:] == [
        "12.4 s / 12.4 s / 12.4 s / 12.4 s",
        "3 h 0 min / 3 h 0 min / 3 h 0 min / 3 h 0 min",  # 10787996.3 ms: rounds to 3 h 0 min
        "3 h 0 min / 3 h 0 min / 3 h 0 min / 3 h 0 min",
    ]
    assert "10800396" not in doc
    assert not re.search(r"\d{4,}(\.\d+)? ?ms", doc)
    saved = json.loads((out / "summary.json").read_text())
    assert saved["latency"][0]["end_to_end"]["max_ms"] == 10800396.3
    assert "worst" not in saved

    # The oldest first, with id, topic, key (escaped), seq, consumer and age.
    esc_key = "&lt;script&gt;alert(&#x27;k&#x27;)&lt;/script&gt;"
    assert _table(doc, "worst-lost") == [
        [ids["hot1"], "orders", "k-hot", "1", "billing", "7 h 0 min"],
        [ids["hot2"], "orders", "k-hot", "2", "billing", "6 h 0 min"],
        [ids["hot3"], "orders", "k-hot", "3", "billing", "5 h 0 min"],
        [ids["hostile"], "orders", esc_key, "1", "billing", "4 h 0 min"],
    ]
    assert _table(doc, "worst-stuck") == [
        [ids["stuck"], "orders", "k-stuck", "1", "billing", "9 h 0 min"]
    ]
    assert _table(doc, "worst-keys") == [
        ["orders", "k-hot", "3", "lost", "7 h 0 min"],
        ["orders", "k-stuck", "1", "stuck", "9 h 0 min"],
        ["orders", esc_key, "1", "lost", "4 h 0 min"],
    ]
    assert "<script>" not in doc

    # The re-drive file, linked relative to the report, and how many messages it holds.
    assert '<a href="redrive.txt">redrive.txt</a> holds 4 lost messages' in doc
    lost = {ids[n] for n in ("hot1", "hot2", "hot3", "hostile")}
    assert set((out / "redrive.txt").read_text().split()) == lost

    # What the report lists is collected bounded: at most ``top`` rows per class and keys.
    details = spark.read.parquet(str(out / "details"))
    as_of = dt.datetime.fromisoformat(result.summary["as_of"])
    rows = report_rows(details, as_of, top=2)
    assert [r["id"] for r in rows["messages"]["lost"]] == [ids["hot1"], ids["hot2"]]
    assert [r["id"] for r in rows["messages"]["stuck"]] == [ids["stuck"]]
    assert rows["messages"]["dead"] == []
    assert [(k["key"], k["messages"]) for k in rows["keys"]] == [("k-hot", 3), ("k-stuck", 1)]
    # Ages are as_of minus created_at, in ms (raw; the report formats them).
    oldest = dt.timedelta(milliseconds=rows["messages"]["lost"][0]["age_ms"])
    assert 7 * H + MARGIN <= oldest <= 7 * H + 2 * MARGIN
