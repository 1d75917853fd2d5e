"""What ``outbox trace`` finds: frozen dataclasses only (times are aware ``datetime``, gaps
``timedelta``), so a terminal, a web page or a script renders a :class:`Journey` without
asking the database again; :meth:`Journey.as_dict` is its JSON form (``--json``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox._redact import redact


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


@dataclass(frozen=True)
class OutboxRecord:
    """The message's outbox row. ``status``: pending, published or dead. A pending row claimed
    by a relay right now has ``leased_by``/``lease_until``; the row does not keep which relay
    published it (the lease is cleared when it is marked)."""

    status: str
    attempts: int
    last_error: str | None
    created_at: dt.datetime
    available_at: dt.datetime
    published_at: dt.datetime | None
    leased_by: str | None
    lease_until: dt.datetime | None
    content_type: str
    headers: Mapping[str, Any]
    payload_bytes: int


@dataclass(frozen=True)
class KeyNeighbour:
    """The key's previous or next message in the outbox (absent: never written, or deleted by
    retention)."""

    seq: int
    id: uuid.UUID
    status: str
    attempts: int
    last_error: str | None
    published_at: dt.datetime | None


@dataclass(frozen=True)
class RelaySeen:
    """A registered relay: where it publishes and how long it has been silent."""

    relay_id: str
    hostname: str
    broker: str | None
    heartbeat_at: dt.datetime
    silent_for: dt.timedelta


@dataclass(frozen=True)
class InboxRecord:
    """One consumer's view of the message in one inbox database.

    ``state``: ``applied`` (processed), ``stale`` (older than what the key had applied: no
    effect), ``retrying`` (processing: a handler attempt failed, the broker redelivers),
    ``dead`` (the consumer gave up; ``held`` says whether it holds its key), ``parked`` (kept
    behind a dead message of its key, ``held_by``), ``absent`` (no record: not delivered yet,
    lost, or purged by the inbox's retention), ``unreachable`` (``error`` says why).
    """

    inbox: str
    consumer: str | None
    state: str
    attempts: int = 0
    duplicates: int = 0
    last_error: str | None = None
    received_at: dt.datetime | None = None
    processed_at: dt.datetime | None = None
    #: the dead message holds its key (on_dead="hold"); a retry or purge decision, if any
    held: bool = False
    decision: str | None = None
    #: for a parked message: the dead message of the key it waits behind
    held_by: uuid.UUID | None = None
    held_by_seq: int | None = None
    #: where the consumer stands on the key: the last seq applied, and the early seq it refused
    key_applied_seq: int | None = None
    key_waiting_seq: int | None = None
    key_blocked_since: dt.datetime | None = None
    #: published -> applied (None when either is unknown)
    since_published: dt.timedelta | None = None
    error: str | None = None


@dataclass(frozen=True)
class ReconciliationVerdict:
    """The latest reconciliation run that judged the message (its window holds the message's
    commit time), or the latest run when none did (``judged`` False).

    ``kinds``: the discrepancy classes the run found for the message, read from the run's
    files when they are reachable: ``lost`` (its ``redrive.txt``); ``files_read`` False: only
    the run's outcome is known."""

    run_id: uuid.UUID
    finished_at: dt.datetime
    outcome: str
    discrepancies: int
    judged: bool
    kinds: tuple[str, ...] = ()
    files_read: bool = False
    note: str | None = None


@dataclass(frozen=True)
class Step:
    """One point of the timeline: what happened, where, when, and the gap since the step it
    follows (committed -> published -> applied per consumer)."""

    what: str
    where: str
    at: dt.datetime
    after: dt.timedelta | None


@dataclass(frozen=True)
class Action:
    """What to do next: why, and the exact command to run (None: nothing to run, look)."""

    why: str
    command: str | None = None


@dataclass(frozen=True)
class Journey:
    """Everything ``outbox trace`` knows about one message. ``summary`` is one line for a
    headline; ``stuck`` says an operator should act (see ``actions``)."""

    id: uuid.UUID
    topic: str
    key: str
    seq: int | None
    summary: str
    stuck: bool
    outbox: OutboxRecord | None
    inboxes: tuple[InboxRecord, ...]
    previous: KeyNeighbour | None
    next: KeyNeighbour | None
    #: the oldest unpublished message of the key before this one (what a pending one waits for)
    blocked_by: KeyNeighbour | None
    relays: tuple[RelaySeen, ...]
    reconciliation: ReconciliationVerdict | None
    timeline: tuple[Step, ...]
    actions: tuple[Action, ...]
    notes: tuple[str, ...] = field(default=())
    #: the outbox database's origin (outbox_identity), which its messages carry; None: none
    #: (or the outbox database was not read)
    origin: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The journey as JSON-ready values: times ISO 8601, gaps in seconds, ids as text;
        every text masked by the redactor (a stored error may quote a URL with its password)."""
        out: dict[str, Any] = _masked(_plain(self))
        return out

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=False)


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value) if value else value
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v) for v in value]
    return value


@dataclass(frozen=True)
class Ident:
    """A message's identity: its id, and its place in its key's order."""

    id: uuid.UUID
    topic: str
    key: str
    seq: int
