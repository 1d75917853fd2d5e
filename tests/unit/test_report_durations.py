"""The reconciliation report's readable durations and its lists of messages to look at (pure:
no Spark, no database)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from spark_ingest._config import DISCREPANCY_CLASSES
from spark_ingest._outputs import format_summary
from spark_ingest._report import format_duration, render_html

S = 1000.0
MIN = 60 * S
H = 60 * MIN
D = 24 * H


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (None, "-"),
        (0, "0 ms"),
        (0.04, "0 ms"),
        (2.5, "2.5 ms"),
        (3.0, "3 ms"),
        (9.96, "10 ms"),
        (850, "850 ms"),
        (999.4, "999 ms"),
        (999.6, "1.0 s"),  # rounds up into the next unit, never "1000 ms"
        (12_400, "12.4 s"),
        (59_940, "59.9 s"),
        (59_960, "1 min 0 s"),  # never "60.0 s"
        (200 * S, "3 min 20 s"),
        (3_599_400, "59 min 59 s"),
        (3_599_600, "1 h 0 min"),
        (10_800_396.3, "3 h 0 min"),  # the 3-hour lag of the issue
        (3 * H + 29 * S, "3 h 0 min"),
        (3 * H + 31 * S, "3 h 1 min"),
        (23 * H + 59 * MIN + 40 * S, "1 d 0 h"),
        (2 * D + 4 * H, "2 d 4 h"),
        (40 * D + 29 * MIN, "40 d 0 h"),
        (-1500, "-1.5 s"),  # a clock stepped back
    ],
)
def test_format_duration_picks_a_readable_unit(ms: float | None, text: str) -> None:
    assert format_duration(ms) == text


def _summary() -> dict[str, Any]:
    hostile = "<script>alert('x')</script>"
    latency = {"p50_ms": 850.0, "p90_ms": 12_400.0, "p99_ms": 200_000.0, "max_ms": 10_800_396.3}
    return {
        "run_id": "run-1",
        "window": {"start": "2026-01-01T00:00:00+00:00", "end": "2026-01-02T00:00:00+00:00"},
        "as_of": "2026-01-02T06:00:00+00:00",
        "sla_seconds": 3600.0,
        "messages": 3,
        "deferred_in_flight": 0,
        "counts": {"pairs": 3, "delivered": 1, "in_flight": 0, "lagging": 0}
        | dict.fromkeys(DISCREPANCY_CLASSES, 0)
        | {"lost": 2},
        "discrepancies": 2,
        "outcome": "failed",
        "exceeded": {"lost": {"count": 2, "limit": 0}},
        "daily": [{"day": "2026-01-01", "kind": "lost", "count": 2}],
        "latency": [
            {
                "topic": hostile,
                "consumer": "billing",
                "n": 1,
                "publish": latency,
                "process": latency,
                "end_to_end": latency,
            }
        ],
        "latency_histogram": {
            "buckets_ms": [10.0, 1_000.0, 3_600_000.0],
            "rows": [{"topic": hostile, "consumer": "billing", "bucket": 3, "n": 1}],
        },
    }


def _worst() -> dict[str, Any]:
    lost = [
        {
            "id": "id-old",
            "topic": "orders",
            "key": "<b>k&1</b>",
            "seq": 7,
            "consumer": "billing",
            "age_ms": 2 * D + 4 * H,
        },
        {
            "id": "id-new",
            "topic": "orders",
            "key": "k2",
            "seq": 1,
            "consumer": "billing",
            "age_ms": 3 * H,
        },
    ]
    keys = [
        {"topic": "orders", "key": "<b>k&1</b>", "messages": 1, "kinds": ["lost"], "age_ms": 2 * D}
    ]
    return {"top": 20, "messages": {"lost": lost, "stuck": []}, "keys": keys}


def _table(doc: str, table_id: str) -> list[list[str]]:
    """The cells of each row of the table with that id (header row included)."""
    match = re.search(rf"<table id='{table_id}'>(.*?)</table>", doc)
    assert match, f"no table {table_id}"
    return [
        re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)
        for row in re.findall(r"<tr>(.*?)</tr>", match.group(1))
    ]


def test_report_shows_durations_in_readable_units_and_escapes_what_users_wrote() -> None:
    doc = render_html(_summary(), worst=_worst(), redrive={"href": "redrive.txt", "messages": 2})
    cells = _table(doc, "latency")[1]
    assert cells[3:] == ["850 ms / 12.4 s / 3 min 20 s / 3 h 0 min"] * 3
    assert "10800396" not in doc
    assert "3600000" not in doc  # the histogram's bucket edges too: "<=1 h 0 min"
    assert "&lt;=1 h 0 min" in doc
    assert "SLA 1 h 0 min" in doc
    assert "<script>" not in doc
    assert "<b>" not in doc
    assert doc.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") >= 2


def test_report_lists_the_oldest_messages_per_class_the_worst_keys_and_the_redrive_file() -> None:
    doc = render_html(_summary(), worst=_worst(), redrive={"href": "redrive.txt", "messages": 2})
    assert _table(doc, "worst-lost")[1:] == [
        ["id-old", "orders", "&lt;b&gt;k&amp;1&lt;/b&gt;", "7", "billing", "2 d 4 h"],
        ["id-new", "orders", "k2", "1", "billing", "3 h 0 min"],
    ]
    assert "worst-stuck" not in doc  # a class with nothing to show gets no table
    assert _table(doc, "worst-keys")[1:] == [
        ["orders", "&lt;b&gt;k&amp;1&lt;/b&gt;", "1", "lost", "2 d 0 h"]
    ]
    assert '<a href="redrive.txt">redrive.txt</a> holds 2 lost messages' in doc


def test_report_says_when_it_shows_only_the_oldest_rows_of_a_class() -> None:
    summary = _summary()
    summary["counts"]["lost"] = 35
    doc = render_html(summary, worst=_worst(), redrive={"href": "redrive.txt", "messages": 35})
    assert "lost: 35" in doc
    assert "the oldest 2 of 35" in doc


def test_text_summary_shows_readable_latencies() -> None:
    summary = _summary()
    summary["latency"][0]["topic"] = "orders"
    text = format_summary(summary)
    assert "latency orders -> billing: n=1 p50 850 ms  p90 12.4 s  p99 3 min 20 s" in text
    assert "max 3 h 0 min" in text
