"""Judging what was read: the timeline, the one-line summary, and what to do when the message
is stuck (the commands to run, secrets masked)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence

from outbox._redact import redact
from outbox._shell import shell_line
from outbox.trace._config import TraceSource, TraceSources
from outbox.trace._model import (
    Action,
    Ident,
    InboxRecord,
    Journey,
    KeyNeighbour,
    OutboxRecord,
    ReconciliationVerdict,
    RelaySeen,
    Step,
)
from outbox.trace._render import _t


def compose_journey(
    ident: Ident,
    record: OutboxRecord | None,
    records: tuple[InboxRecord, ...],
    previous: KeyNeighbour | None,
    nxt: KeyNeighbour | None,
    blocker: KeyNeighbour | None,
    relays: tuple[RelaySeen, ...],
    verdict: ReconciliationVerdict | None,
    sources: TraceSources,
) -> Journey:
    mid, topic, key, seq = ident.id, ident.topic, ident.key, ident.seq
    published = record.published_at if record else None
    records = tuple(
        dataclasses.replace(r, since_published=r.processed_at - published)
        if published is not None and r.processed_at is not None and r.state == "applied"
        else r
        for r in records
    )
    timeline = _timeline(record, records)
    actions, notes = _actions(mid, topic, key, seq, record, records, blocker, relays, sources)
    return Journey(
        id=mid,
        topic=topic,
        key=key,
        seq=seq,
        summary=_summary(record, records),
        stuck=bool(actions),
        outbox=record,
        inboxes=records,
        previous=previous,
        next=nxt,
        blocked_by=blocker,
        relays=relays,
        reconciliation=verdict,
        timeline=timeline,
        actions=tuple(actions),
        notes=tuple(notes),
    )


def _timeline(record: OutboxRecord | None, records: Sequence[InboxRecord]) -> tuple[Step, ...]:
    steps: list[Step] = []
    committed = record.created_at if record else None
    if record is not None:
        steps.append(Step("committed", "outbox", record.created_at, None))
        if record.published_at is not None:
            steps.append(
                Step("published", "outbox", record.published_at,
                     record.published_at - record.created_at)
            )  # fmt: skip
    base = record.published_at if record and record.published_at else committed
    for r in records:
        where = f"{r.inbox}/{r.consumer}"
        if r.received_at is not None:
            steps.append(
                Step("received", where, r.received_at,
                     r.received_at - base if base else None)
            )  # fmt: skip
        if r.processed_at is not None:
            what = {"applied": "applied", "stale": "skipped (stale)"}.get(r.state, r.state)
            steps.append(
                Step(what, where, r.processed_at,
                     r.processed_at - base if base else None)
            )  # fmt: skip
    return tuple(sorted(steps, key=lambda s: s.at))


def _summary(record: OutboxRecord | None, records: Sequence[InboxRecord]) -> str:
    consumers = [r for r in records if r.consumer is not None]
    applied = [r for r in consumers if r.state in ("applied", "stale")]
    if record is None:
        head = "outbox row deleted by retention"
    elif record.status == "dead":
        return f"dead at the relay after {record.attempts} attempt(s)"
    elif record.status == "ledger":
        return "committed, not numbered yet: in the ledger for a relay to number and publish"
    elif record.status == "pending":
        return "pending: not published yet" + (
            f" (attempt {record.attempts} failed)" if record.attempts else ""
        )
    else:
        head = "published"
    if not consumers:
        return head
    dead = [r for r in consumers if r.state == "dead"]
    parked = [r for r in consumers if r.state == "parked"]
    parts = [f"applied by {len(applied)} of {len(consumers)} consumer(s)"]
    if dead:
        parts.append("dead at " + ", ".join(str(r.consumer) for r in dead))
    if parked:
        parts.append("held at " + ", ".join(str(r.consumer) for r in parked))
    return f"{head}; " + "; ".join(parts)


def _url_flag(source: TraceSource) -> tuple[str, ...]:
    return ("--url", redact(source.url.removeprefix("jdbc:")))


def _schema_flag(source: TraceSource) -> tuple[str, ...]:
    return ("--schema", source.schema) if source.schema else ()


def _cmd(*args: object) -> str:
    """A suggested command: each argument quoted for the shell (outbox/_shell.py), so a key,
    topic or consumer name chosen by whoever wrote it runs as that argument and nothing else."""
    return shell_line(str(a) for a in args)


def _actions(
    mid: uuid.UUID,
    topic: str,
    key: str,
    seq: int,
    record: OutboxRecord | None,
    records: Sequence[InboxRecord],
    blocker: KeyNeighbour | None,
    relays: Sequence[RelaySeen],
    sources: TraceSources,
) -> tuple[list[Action], list[str]]:
    actions: list[Action] = []
    notes: list[str] = []
    ob = _url_flag(sources.outbox) + _schema_flag(sources.outbox)
    inbox_flags = {s.name: _url_flag(s) + _schema_flag(s) for s in sources.inboxes}
    if record is not None and record.status == "dead":
        actions.append(
            Action(
                f"the relay gave up after {record.attempts} attempt(s): "
                f"{record.last_error or 'no error recorded'}; fix the cause, then re-queue it",
                _cmd("outbox", "dead", "retry", "--id", mid, "--reason", "...", *ob),
            )
        )
    elif record is not None and record.status in ("pending", "ledger"):
        # in the ledger: a relay numbers it within milliseconds, unless none runs
        _pending_actions(record, blocker, relays, ob, actions, notes)
    for r in records:
        action = _inbox_action(r, mid, (topic, key, seq), record, ob, inbox_flags.get(r.inbox, ()))
        if action is not None:
            actions.append(action)
    return actions, notes


def _pending_actions(
    record: OutboxRecord,
    blocker: KeyNeighbour | None,
    relays: Sequence[RelaySeen],
    ob: tuple[str, ...],
    actions: list[Action],
    notes: list[str],
) -> None:
    """What a pending message waits for: an earlier message of its key, a relay, a retry."""
    if blocker is not None and blocker.status == "pending" and not blocker.attempts:
        notes.append(
            f"seq {blocker.seq} of its key ({blocker.id}) is pending too: the relay "
            "publishes a key's messages in order, that one first"
        )
    elif blocker is not None:
        status = blocker.status
        cmd = (
            _cmd("outbox", "dead", "retry", "--id", blocker.id, "--reason", "...", *ob)
            if status == "dead"
            else _cmd("outbox", "trace", blocker.id, *ob)
        )
        actions.append(
            Action(
                f"it waits behind seq {blocker.seq} of its key ({blocker.id}, {status}): "
                "the relay publishes a key's messages in order",
                cmd,
            )
        )
    live = [r for r in relays if r.silent_for < dt.timedelta(minutes=1)]
    if not live:
        actions.append(
            Action(
                "no relay has heartbeated in the last minute: start one (`outbox relay "
                "--config relay.toml`; `outbox relay check` tests its settings first), then "
                "check",
                _cmd("outbox", "status", *ob),
            )
        )
    if record.attempts and record.last_error:
        notes.append(
            f"attempt {record.attempts} failed ({record.last_error}); the relay retries "
            f"it from {record.available_at.isoformat()}"
        )


def _inbox_retry(consumer: str, message_id: object, inbox_url: tuple[str, ...]) -> str:
    """The command that retries a consumer's dead message (``outbox inbox dead retry``)."""
    args = ("--consumer", consumer, "--id", message_id, "--reason", "...", *inbox_url)
    return _cmd("outbox", "inbox", "dead", "retry", *args)


def _inbox_action(
    r: InboxRecord,
    mid: uuid.UUID,
    where: tuple[str, str, int],
    record: OutboxRecord | None,
    ob: tuple[str, ...],
    inbox_url: tuple[str, ...],
) -> Action | None:
    """What to do about one consumer's record (None: nothing)."""
    topic, key, seq = where
    if r.state == "unreachable":
        return Action(f"inbox {r.inbox} could not be read (see above)")
    consumer = r.consumer or ""
    error = r.last_error or "no error recorded"
    if r.state == "dead" and r.held:
        decided = f" (decided: {r.decision}; the consumer applies it next)" if r.decision else ""
        return Action(
            f"consumer {consumer} gave up on it after {r.attempts} attempt(s) ({error}) and "
            f"holds its key{decided}: fix the handler, then retry it (or purge it to move the "
            "key on without it)",
            _inbox_retry(consumer, mid, inbox_url),
        )
    if r.state == "dead":
        return Action(
            f"consumer {consumer} gave up on it after {r.attempts} attempt(s) ({error}); "
            "on_dead='skip': its key moved on without it. Apply its effect by hand if it matters"
        )
    if r.state == "parked":
        return Action(
            f"consumer {consumer} keeps it parked behind dead seq {r.held_by_seq} of its key "
            f"({r.held_by}): retry (or purge) that one and this one follows",
            _inbox_retry(consumer, r.held_by, inbox_url),
        )
    if r.state == "retrying":
        return Action(
            f"consumer {consumer}'s handler failed {r.attempts} time(s) ({error}); the broker "
            "redelivers it"
        )
    if r.state != "absent" or record is None or record.status != "published":
        return None
    if r.key_applied_seq is not None and r.key_applied_seq < seq - 1:
        nxt = r.key_applied_seq + 1
        return Action(
            f"consumer {consumer} has applied the key up to seq {r.key_applied_seq}: it waits "
            f"for seq {nxt} first",
            _cmd("outbox", "trace", "--topic", topic, "--key", key, "--seq", nxt, *ob),
        )
    return Action(
        f"published at {_t(record.published_at)} but consumer {consumer} has no record of it: "
        "check that it runs and reads the topic's destination; if the broker lost it, "
        "re-publish it (same id: a consumer that has it drops the copy)",
        _cmd("echo", mid)
        + " > ids.txt && "
        + _cmd("outbox", "redrive", "ids.txt", "--reason", "...", *ob),
    )
