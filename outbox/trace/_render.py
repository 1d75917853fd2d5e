"""The terminal's rendering of a :class:`~outbox.trace.Journey` (the console renders the
dataclasses its own way)."""

from __future__ import annotations

import datetime as dt

from outbox._errors import one_line
from outbox._redact import redact
from outbox.trace._model import InboxRecord, Journey


def gap(delta: dt.timedelta | None) -> str:
    """A gap between two steps of a message's journey: ``+12 ms``, ``+3.4 s``, ``+2.5 min``,
    ``+1.2 h`` (empty: unknown). The console's message page writes gaps with it too."""
    if delta is None:
        return ""
    ms = delta.total_seconds() * 1000
    if abs(ms) < 1000:
        return f"+{ms:.0f} ms"
    if abs(ms) < 120_000:
        return f"+{ms / 1000:.1f} s"
    if abs(ms) < 7_200_000:
        return f"+{ms / 60_000:.1f} min"
    return f"+{ms / 3_600_000:.1f} h"


def _t(at: dt.datetime | None) -> str:
    return at.isoformat(timespec="milliseconds") if at else "-"


def render_text(journey: Journey) -> str:
    """The journey as lines for a terminal; every value from the database on one line of its
    own (control characters escaped)."""
    j = journey
    seq = j.seq if j.seq else ("not yet" if j.seq == 0 else "?")  # 0: in the ledger
    origin = f"  origin {one_line(j.origin)}" if j.origin else ""
    lines = [
        f"message {j.id}  topic {one_line(j.topic)}  key {one_line(j.key)}  seq {seq}{origin}",
        f"state: {j.summary}",
        "",
        *_outbox_lines(j),
        "",
    ]
    for r in j.inboxes:
        lines.extend(_inbox_lines(r))
    v = j.reconciliation
    if v is not None:
        verdict = ", ".join(v.kinds) if v.kinds else ("not lost" if v.files_read else "-")
        judged = "judged it" if v.judged else "did not judge it"
        lines.append(
            f"reconciliation: run {v.run_id} ({v.outcome}, {_t(v.finished_at)}) {judged}: "
            f"{verdict}" + (f"  [{v.note}]" if v.note else "")
        )
    if j.timeline:
        lines.append("")
        lines.append("timeline:")
        for s in j.timeline:
            lines.append(f"  {_t(s.at)}  {s.what:<16} {one_line(s.where):<24} {gap(s.after)}")
    for note in j.notes:
        lines.append(f"note: {one_line(redact(note))}")
    if j.actions:
        lines.append("")
        lines.append("what to do:")
        for a in j.actions:
            lines.append(f"  - {one_line(redact(a.why))}")
            if a.command:
                lines.append(f"    {a.command}")
    return "\n".join(lines)


def _outbox_lines(j: Journey) -> list[str]:
    """The outbox row, the relays, the key's neighbours."""
    lines: list[str] = []
    ob = j.outbox
    if ob is None:
        lines.append("outbox: no row (deleted by retention after publication)")
    else:
        lines.append(
            f"outbox: {ob.status}  attempts {ob.attempts}  committed {_t(ob.created_at)}"
            f"  published {_t(ob.published_at)}  {ob.payload_bytes} bytes "
            f"{one_line(ob.content_type)}"
        )
        if ob.leased_by:
            lines.append(f"  leased by relay {one_line(ob.leased_by)} until {_t(ob.lease_until)}")
        if ob.last_error:
            lines.append(f"  last error: {one_line(redact(ob.last_error))}")
    for rl in j.relays:
        lines.append(
            f"  relay {one_line(rl.relay_id)} on {one_line(rl.hostname)} -> "
            f"{one_line(rl.broker or '?')}  heartbeat {gap(rl.silent_for).lstrip('+')} ago"
        )
    for label, n in (("previous", j.previous), ("next", j.next)):
        if n is not None:
            lines.append(f"  {label}: seq {n.seq} {n.id} {n.status}")
    if j.blocked_by is not None:
        b = j.blocked_by
        lines.append(f"  waits behind: seq {b.seq} {b.id} {b.status}")
    return lines


def _inbox_lines(r: InboxRecord) -> list[str]:
    """One consumer's record."""
    where = f"{one_line(r.inbox)}/{one_line(r.consumer or '-')}"
    if r.state == "unreachable":
        return [f"inbox {where}: unreachable: {r.error}"]
    detail = f"  attempts {r.attempts}" if r.attempts else ""
    if r.duplicates:
        detail += f"  duplicates {r.duplicates}"
    if r.processed_at:
        detail += f"  at {_t(r.processed_at)}"
    if r.since_published is not None:
        detail += f"  ({gap(r.since_published)} after publication)"
    if r.held:
        detail += "  holds its key" + (f" (decision: {r.decision})" if r.decision else "")
    if r.held_by:
        detail += f"  behind dead seq {r.held_by_seq} {r.held_by}"
    if r.key_applied_seq is not None:
        detail += f"  key applied up to seq {r.key_applied_seq}"
    lines = [f"inbox {where}: {r.state}{detail}"]
    if r.last_error and r.state in ("dead", "retrying", "parked"):
        lines.append(f"  last error: {one_line(redact(r.last_error))}")
    return lines
