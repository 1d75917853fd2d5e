"""A self-contained HTML report: inline SVG charts drawn here, no script, no network."""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from spark_ingest._config import DISCREPANCY_CLASSES

__all__ = ["bar_chart", "format_duration", "render_html"]

_COLORS = {
    "lost": "#d62728",
    "stuck": "#ff7f0e",
    "dead": "#7f7f7f",
    "stale": "#bcbd22",
    "phantom": "#9467bd",
    "duplicate": "#17becf",
    "out_of_order": "#8c564b",
    "lagging": "#1f77b4",
}
_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:right}th{background:#f3f3f3}.ok{color:#2a7}.failed{color:#c22}
svg text{font-size:11px}td.t,th.t{text-align:left}
"""


def _esc(value: object) -> str:
    return html.escape(str(value))


def format_duration(ms: float | None) -> str:
    """A duration given in milliseconds, in the largest unit that reads well: ``850 ms``,
    ``2.5 ms``, ``12.4 s``, ``3 min 20 s``, ``3 h 0 min``, ``2 d 4 h``; ``-`` for None.

    Each form is rounded to its last unit (half up) before the unit is chosen, so 59.96 s
    reads ``1 min 0 s``, never ``60.0 s``. A negative duration (a clock stepped back) gets a
    minus sign.
    """
    if ms is None:
        return "-"
    if ms < 0:
        return "-" + format_duration(-ms)
    if ms < 10 and _half_up(ms * 10) < 100:
        tenths = _half_up(ms * 10)
        return f"{tenths // 10} ms" if tenths % 10 == 0 else f"{tenths / 10:.1f} ms"
    if _half_up(ms) < 1000:
        return f"{_half_up(ms)} ms"
    tenths_s = _half_up(ms / 100)
    if tenths_s < 600:
        return f"{tenths_s / 10:.1f} s"
    seconds = _half_up(ms / 1000)
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    minutes = _half_up(ms / 60_000)
    if minutes < 24 * 60:
        return f"{minutes // 60} h {minutes % 60} min"
    hours = _half_up(ms / 3_600_000)
    return f"{hours // 24} d {hours % 24} h"


def _half_up(value: float) -> int:
    return int(value + 0.5)


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    color: str = "#1f77b4",
    width: int = 640,
    height: int = 220,
) -> str:
    """A vertical bar chart as an ``<svg>`` element."""
    top = max(values, default=0) or 1
    n = max(len(values), 1)
    plot_h, base = height - 60, height - 40
    slot = (width - 60) / n
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{_esc(title)}">',
        f'<text x="10" y="14" font-weight="bold">{_esc(title)}</text>',
        f'<line x1="50" y1="{base}" x2="{width - 5}" y2="{base}" stroke="#888"/>',
        f'<text x="5" y="{base - plot_h + 5}">{_esc(_num(top))}</text>',
    ]
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = plot_h * value / top
        x = 55 + i * slot
        parts.append(
            f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{max(slot - 6, 1):.1f}" '
            f'height="{h:.1f}" fill="{color}"><title>{_esc(label)}: {_esc(_num(value))}'
            "</title></rect>"
        )
        parts.append(
            f'<text x="{x:.1f}" y="{base + 14}">{_esc(label[:14])}</text>'
            f'<text x="{x:.1f}" y="{base - h - 3:.1f}">{_esc(_num(value))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _num(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _stacked_by_day(daily: Sequence[Mapping[str, Any]], width: int = 640) -> str:
    days = sorted({d["day"] for d in daily})
    per_day: dict[str, dict[str, int]] = defaultdict(dict)
    for d in daily:
        per_day[d["day"]][d["kind"]] = d["count"]
    top = max((sum(v.values()) for v in per_day.values()), default=0) or 1
    height, base, plot_h = 240, 200, 170
    slot = (width - 200) / max(len(days), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        'aria-label="discrepancies by day and class">',
        '<text x="10" y="14" font-weight="bold">Discrepancies by day and class</text>',
        f'<line x1="40" y1="{base}" x2="{width - 160}" y2="{base}" stroke="#888"/>',
    ]
    for i, day in enumerate(days):
        y, x = float(base), 45 + i * slot
        for kind, n in sorted(per_day[day].items()):
            h = plot_h * n / top
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(slot - 6, 1):.1f}" height="{h:.1f}" '
                f'fill="{_COLORS.get(kind, "#333")}"><title>{_esc(day)} {_esc(kind)}: {n}'
                "</title></rect>"
            )
        parts.append(f'<text x="{x:.1f}" y="{base + 14}">{_esc(day)[5:]}</text>')
    for j, kind in enumerate(_COLORS):
        parts.append(
            f'<rect x="{width - 150}" y="{30 + j * 16}" width="10" height="10" '
            f'fill="{_COLORS[kind]}"/><text x="{width - 135}" y="{39 + j * 16}">{_esc(kind)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _latency_charts(summary: Mapping[str, Any]) -> list[str]:
    hist = summary["latency_histogram"]
    edges = hist["buckets_ms"]
    labels = [f"<={format_duration(e)}" for e in edges] + [f">{format_duration(edges[-1])}"]
    groups: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * len(labels))
    for row in hist["rows"]:
        groups[(row["topic"], row["consumer"])][row["bucket"]] += row["n"]
    return [
        bar_chart(labels, values, title=f"End-to-end latency: {topic} -> {consumer}")
        for (topic, consumer), values in sorted(groups.items())
    ]


def _latency_table(summary: Mapping[str, Any]) -> str:
    head = "<tr><th class='t'>topic</th><th class='t'>consumer</th><th>n</th>" + "".join(
        f"<th>{leg} p50 / p90 / p99 / max</th>" for leg in ("publish", "process", "end_to_end")
    )
    rows = [head + "</tr>"]
    for item in summary["latency"]:
        cells = "".join(
            "<td>" + " / ".join(_esc(format_duration(item[leg][k])) for k in _PCT_KEYS) + "</td>"
            for leg in ("publish", "process", "end_to_end")
        )
        rows.append(
            f"<tr><td class='t'>{_esc(item['topic'])}</td>"
            f"<td class='t'>{_esc(item['consumer'])}</td><td>{item['n']}</td>{cells}</tr>"
        )
    return "<table id='latency'>" + "".join(rows) + "</table>"


_PCT_KEYS = ("p50_ms", "p90_ms", "p99_ms", "max_ms")

#: What each class listed in the report means to the person on call.
_MEANING = {
    "lost": "Published longer than the SLA ago, not processed: re-drive them.",
    "stuck": "Still pending in the outbox longer than the SLA after they were due: "
    "is the relay publishing?",
    "dead": "Dead in the outbox or in the consumer's inbox.",
    "stale": "Skipped by the consumer's order guard.",
    "phantom": "Processed by a consumer, in no outbox row (age since processed).",
    "duplicate": "Delivered again after they were settled (applied once).",
    "out_of_order": "Processed after a higher seq of the same key.",
}


def _cell(value: object, text: bool = True) -> str:
    shown = "-" if value is None else _esc(value)
    return f"<td class='t'>{shown}</td>" if text else f"<td>{shown}</td>"


def _worst_messages(kind: str, rows: Sequence[Mapping[str, Any]], total: int) -> str:
    shown = (
        f"all {total}"
        if len(rows) >= total
        else f"the oldest {len(rows)} of {total}; every one is in details/"
    )
    body = "".join(
        "<tr>"
        + _cell(r["id"])
        + _cell(r["topic"])
        + _cell(r["key"])
        + _cell(r["seq"], text=False)
        + _cell(r["consumer"])
        + _cell(format_duration(r["age_ms"]), text=False)
        + "</tr>"
        for r in rows
    )
    return (
        f"<h3>{_esc(kind)}: {total}</h3><p>{_esc(_MEANING.get(kind, ''))} "
        f"One row per message and consumer, oldest first ({shown}).</p>"
        f"<table id='worst-{_esc(kind)}'><tr><th class='t'>id</th><th class='t'>topic</th>"
        "<th class='t'>key</th><th>seq</th><th class='t'>consumer</th><th>age</th></tr>"
        f"{body}</table>"
    )


def _worst_keys(rows: Sequence[Mapping[str, Any]]) -> str:
    body = "".join(
        "<tr>"
        + _cell(r["topic"])
        + _cell(r["key"])
        + _cell(r["messages"], text=False)
        + _cell(", ".join(r["kinds"]))
        + _cell(format_duration(r["age_ms"]), text=False)
        + "</tr>"
        for r in rows
    )
    return (
        f"<h3>Keys with the most problem messages (the first {len(rows)})</h3>"
        "<table id='worst-keys'><tr><th class='t'>topic</th><th class='t'>key</th>"
        "<th>messages</th><th class='t'>classes</th><th>oldest</th></tr>"
        f"{body}</table>"
    )


def _redrive_link(redrive: Mapping[str, Any]) -> str:
    n = int(redrive["messages"])
    href = _esc(redrive["href"])
    held = "no message: nothing was lost" if n == 0 else f"{n} lost message{'s' * (n != 1)}"
    return (
        f"<p id='redrive'>Re-drive list: <a href=\"{href}\">{href}</a> holds {held}"
        + ("" if n == 0 else f" (<code>outbox redrive {href} --url ...</code>)")
        + ".</p>"
    )


def _attention(
    summary: Mapping[str, Any],
    worst: Mapping[str, Any] | None,
    redrive: Mapping[str, Any] | None,
) -> list[str]:
    """The messages and keys to look at first, and the re-drive file."""
    parts = ["<h2>Messages to look at</h2>"]
    if redrive is not None:
        parts.append(_redrive_link(redrive))
    if worst is None:
        return parts
    counts = summary["counts"]
    parts.append(
        f"<p>Ages as of {_esc(summary.get('as_of', '-'))}, since each message was created.</p>"
    )
    for kind, rows in worst["messages"].items():
        if rows:
            parts.append(_worst_messages(kind, rows, max(counts.get(kind, 0), len(rows))))
    if worst["keys"]:
        parts.append(_worst_keys(worst["keys"]))
    if len(parts) == 2 + (redrive is not None):
        parts.append("<p>None: no discrepancy in this run.</p>")
    return parts


def render_html(
    summary: Mapping[str, Any],
    *,
    worst: Mapping[str, Any] | None = None,
    redrive: Mapping[str, Any] | None = None,
) -> str:
    """The whole report as one HTML document.

    ``worst``: the oldest messages of each discrepancy class (``messages``: class -> rows of
    ``id, topic, key, seq, consumer, age_ms``) and the keys with the most problem messages
    (``keys``: rows of ``topic, key, messages, kinds, age_ms``), as collected by
    ``_outputs.report_rows``. ``redrive``: ``href`` (relative to the report) and ``messages``
    of the re-drive file. Every duration is shown in readable units (``format_duration``).
    """
    counts = summary["counts"]
    kinds = [*DISCREPANCY_CLASSES, "lagging"]
    outcome = summary["outcome"]
    sla = summary.get("sla_seconds")
    sla_text = "" if sla is None else f" SLA {_esc(format_duration(float(sla) * 1000))};"
    body = [
        f"<h1>Outbox reconciliation <span class='{_esc(outcome)}'>{_esc(outcome.upper())}"
        "</span></h1>",
        f"<p>Run {_esc(summary['run_id'])}; window {_esc(summary['window']['start'])} .. "
        f"{_esc(summary['window']['end'])};{sla_text} {summary['messages']} messages judged, "
        f"{counts['pairs']} message x consumer pairs, {counts['delivered']} delivered, "
        f"{summary['deferred_in_flight']} deferred (in flight at job start).</p>",
        bar_chart(
            kinds,
            [counts.get(k, 0) for k in kinds],
            title="Discrepancies by class",
            color="#d62728",
        ),
        _stacked_by_day(summary["daily"]),
        *_attention(summary, worst, redrive),
        "<h2>Latency</h2>",
        _latency_table(summary),
        *_latency_charts(summary),
    ]
    if summary["exceeded"]:
        items = "".join(
            f"<li>{_esc(k)}: {v['count']} &gt; {v['limit']}</li>"
            for k, v in summary["exceeded"].items()
        )
        body.insert(2, f"<h2>Thresholds exceeded</h2><ul>{items}</ul>")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Outbox reconciliation</title>"
        f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
