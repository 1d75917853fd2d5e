"""A self-contained HTML report: inline SVG charts drawn here, no script, no network."""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from spark_ingest._config import DISCREPANCY_CLASSES

__all__ = ["bar_chart", "render_html"]

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
svg text{font-size:11px}
"""


def _esc(value: object) -> str:
    return html.escape(str(value))


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
            f'<text x="{x:.1f}" y="{base + 14}">{_esc(label)[:14]}</text>'
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
            f'fill="{_COLORS[kind]}"/><text x="{width - 135}" y="{39 + j * 16}">{kind}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _latency_charts(summary: Mapping[str, Any]) -> list[str]:
    hist = summary["latency_histogram"]
    edges = hist["buckets_ms"]
    labels = [f"<={_num(e / 1000)}s" if e >= 1000 else f"<={_num(e)}ms" for e in edges] + [
        f">{_num(edges[-1] / 1000)}s"
    ]
    groups: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * len(labels))
    for row in hist["rows"]:
        groups[(row["topic"], row["consumer"])][row["bucket"]] += row["n"]
    return [
        bar_chart(labels, values, title=f"End-to-end latency: {topic} -> {consumer}")
        for (topic, consumer), values in sorted(groups.items())
    ]


def _latency_table(summary: Mapping[str, Any]) -> str:
    head = "<tr><th>topic</th><th>consumer</th><th>n</th>" + "".join(
        f"<th>{leg} p50/p90/p99/max (ms)</th>" for leg in ("publish", "process", "end_to_end")
    )
    rows = [head + "</tr>"]
    for item in summary["latency"]:
        cells = "".join(
            "<td>"
            + " / ".join("-" if item[leg][k] is None else _num(item[leg][k]) for k in _PCT_KEYS)
            + "</td>"
            for leg in ("publish", "process", "end_to_end")
        )
        rows.append(
            f"<tr><td>{_esc(item['topic'])}</td><td>{_esc(item['consumer'])}</td>"
            f"<td>{item['n']}</td>{cells}</tr>"
        )
    return "<table>" + "".join(rows) + "</table>"


_PCT_KEYS = ("p50_ms", "p90_ms", "p99_ms", "max_ms")


def render_html(summary: Mapping[str, Any]) -> str:
    """The whole report as one HTML document."""
    counts = summary["counts"]
    kinds = [*DISCREPANCY_CLASSES, "lagging"]
    outcome = summary["outcome"]
    body = [
        f"<h1>Outbox reconciliation <span class='{outcome}'>{_esc(outcome.upper())}</span></h1>",
        f"<p>Run {_esc(summary['run_id'])}; window {_esc(summary['window']['start'])} .. "
        f"{_esc(summary['window']['end'])}; {summary['messages']} messages judged, "
        f"{counts['pairs']} message x consumer pairs, {counts['delivered']} delivered, "
        f"{summary['deferred_in_flight']} deferred (in flight at job start).</p>",
        bar_chart(
            kinds,
            [counts.get(k, 0) for k in kinds],
            title="Discrepancies by class",
            color="#d62728",
        ),
        _stacked_by_day(summary["daily"]),
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
