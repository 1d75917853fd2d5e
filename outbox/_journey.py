"""``outbox trace``: one message's journey across the outbox database and the inbox databases.

:func:`trace_message` reads, in read-only transactions, the message's outbox row, its key's
neighbours, the relays, the latest reconciliation run that judged it, and every named inbox
database's records of it, and returns a :class:`Journey`: frozen dataclasses only (times are
aware ``datetime``, gaps ``timedelta``), so a terminal, a web page or a script renders it
without asking the database again. :meth:`Journey.as_dict` is its JSON form (``--json``).

Nothing here writes: the console's role is enough, or the relay's role on the outbox database
and a consumer's role on its inbox database (``outbox migrate grants``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import tomllib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import DictRow, dict_row

from outbox._errors import describe_database_error, one_line
from outbox._ids import id_from_idempotency_key
from outbox._redact import redact, remember_secrets
from outbox._trace_statements import TraceStatements, trace_statements
from outbox.exceptions import ConfigurationError, OutboxError
from outbox.schema import check_identifier

__all__ = [
    "Action",
    "AmbiguousMessageError",
    "InboxRecord",
    "Journey",
    "KeyNeighbour",
    "MessageNotFoundError",
    "OutboxRecord",
    "ReconciliationVerdict",
    "RelaySeen",
    "Step",
    "TraceSource",
    "TraceSources",
    "load_trace_sources",
    "render_text",
    "trace_message",
]

#: how long a connection attempt to one database may take
CONNECT_TIMEOUT = 10


class MessageNotFoundError(OutboxError):
    """No message matches: it was never committed, or retention deleted it everywhere."""


class AmbiguousMessageError(OutboxError):
    """More than one message matches: look it up by id."""


@dataclass(frozen=True)
class TraceSource:
    """One inbox database to look in: a name (shown in the trace), a libpq URL (``jdbc:`` is
    accepted and dropped), and, as in the reconciliation's job file, the user and where the
    password is (never in the URL)."""

    name: str
    url: str
    user: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    schema: str | None = None

    def __post_init__(self) -> None:
        if self.schema is not None:
            check_identifier(self.schema)

    def __repr__(self) -> str:  # a URL may hold a password
        return f"TraceSource(name={self.name!r}, url={redact(self.url)!r})"

    def connect_kwargs(self) -> dict[str, Any]:
        """``psycopg.connect`` keyword arguments (the password is looked up now)."""
        url = self.url.removeprefix("jdbc:")
        remember_secrets(url)
        kw: dict[str, Any] = {"conninfo": url, "connect_timeout": CONNECT_TIMEOUT}
        if self.user:
            kw["user"] = self.user
        password = _password(self.name, self.password_env, self.password_file)
        if password is not None:
            kw["password"] = password
        return kw


@dataclass(frozen=True)
class TraceSources:
    """Where to look: the outbox database and the inbox databases."""

    outbox: TraceSource
    inboxes: tuple[TraceSource, ...] = ()


def _password(name: str, env: str | None, path: str | None) -> str | None:
    if env:
        value = os.environ.get(env)
        if value is None:
            raise ConfigurationError(f"source {name!r}: environment variable {env} is not set")
        remember_secrets({"password": value})
        return value
    if path:
        try:
            value = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigurationError(
                f"source {name!r}: cannot read password file {path}: {exc.strerror}"
            ) from exc
        remember_secrets({"password": value})
        return value
    return None


_SOURCE_KEYS = {"name", "url", "user", "password_env", "password_file", "schema"}


def load_trace_sources(path: str | Path) -> tuple[TraceSource | None, tuple[TraceSource, ...]]:
    """The ``[outbox]`` and ``[[inbox]]`` tables of a reconciliation job file (the keys the
    trace needs; the job's other keys and tables are left to the job)."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"cannot read job file {path}: {exc}") from exc

    def source(where: str, default_name: str, raw: Any) -> TraceSource:
        if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
            raise ConfigurationError(f'job file {path}: {where} needs url = "postgresql://..."')
        known = {k: v for k, v in raw.items() if k in _SOURCE_KEYS}
        known.setdefault("name", default_name)
        return TraceSource(**known)

    outbox = source("[outbox]", "outbox", doc["outbox"]) if "outbox" in doc else None
    raw_inboxes = doc.get("inbox", [])
    if not isinstance(raw_inboxes, list):
        raise ConfigurationError(f"job file {path}: write [[inbox]] (a list), not [inbox]")
    inboxes = tuple(
        source(f"[[inbox]] #{i + 1}", f"inbox{i + 1}", raw) for i, raw in enumerate(raw_inboxes)
    )
    return outbox, inboxes


# ------------------------------------------------------------------------------------------
# The result
# ------------------------------------------------------------------------------------------


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

    def as_dict(self) -> dict[str, Any]:
        """The journey as JSON-ready values: times ISO 8601, gaps in seconds, ids as text."""
        out: dict[str, Any] = _plain(self)
        return out

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=False)


# ------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------


#: a row read by column name
Row = DictRow


@contextmanager
def _read_only(source: TraceSource) -> Iterator[psycopg.Connection[Row]]:
    """A connection in one read-only, repeatable-read transaction (one snapshot); its rows are
    read by column name."""
    with psycopg.connect(**source.connect_kwargs(), row_factory=dict_row) as conn:
        conn.read_only = True
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            with conn.transaction():
                yield conn
        finally:
            conn.rollback()


def _outbox_record(row: Row) -> OutboxRecord:
    pending = row["status"] == "pending"
    return OutboxRecord(
        status=row["status"],
        attempts=row["attempts"],
        last_error=row["last_error"],
        created_at=row["created_at"],
        available_at=row["available_at"],
        published_at=row["published_at"],
        leased_by=row["lease_owner"] if pending else None,
        lease_until=row["lease_until"] if pending else None,
        content_type=row["content_type"],
        headers=row["headers"] or {},
        payload_bytes=row["payload_bytes"],
    )


def _neighbour(row: Row) -> KeyNeighbour:
    return KeyNeighbour(
        seq=row["seq"], id=row["id"], status=row["status"], attempts=row["attempts"],
        last_error=row["last_error"], published_at=row.get("published_at"),
    )  # fmt: skip


def _lookup_id(
    message_id: uuid.UUID | str | None,
    idempotency_key: str | None,
    topic: str | None,
    key: str | None,
    seq: int | None,
) -> tuple[uuid.UUID | None, tuple[str, str, int] | None]:
    if message_id is not None:
        if idempotency_key is not None or key is not None or seq is not None:
            raise ConfigurationError("give an id, or --idempotency-key, or --topic/--key/--seq")
        try:
            return uuid.UUID(str(message_id)), None
        except ValueError as exc:
            raise ConfigurationError(
                f"{str(message_id)[:80]!r} is not a message id (a UUID such as "
                "0190f3a2-7c1e-7d3b-9a57-0b0c5e11e7a1); look it up by --idempotency-key or "
                "--topic/--key/--seq instead"
            ) from exc
    if idempotency_key is not None:
        if topic is None:
            raise ConfigurationError("--idempotency-key needs --topic: the id is derived from both")
        return id_from_idempotency_key(topic, idempotency_key), None
    if topic is not None and key is not None and seq is not None:
        return None, (topic, key, seq)
    raise ConfigurationError(
        "which message? give its id, or --idempotency-key with --topic, or --topic, --key and "
        "--seq together"
    )


def trace_message(
    sources: TraceSources,
    message_id: uuid.UUID | str | None = None,
    *,
    idempotency_key: str | None = None,
    topic: str | None = None,
    key: str | None = None,
    seq: int | None = None,
    reports_dir: str | Path | None = None,
) -> Journey:
    """Where is the message? Read-only; one read-only transaction per database.

    Look it up by ``message_id``, by ``idempotency_key`` and ``topic``, or by ``topic``,
    ``key`` and ``seq``. Raises :class:`MessageNotFoundError` (with what that means and what
    to check), :class:`AmbiguousMessageError`, ConfigurationError for a bad lookup, and
    psycopg's error when the outbox database cannot be read (an inbox database that cannot be
    read is reported in its :class:`InboxRecord`, ``state`` "unreachable", and the rest goes
    on). ``reports_dir``: the directory the reconciliation writes its runs into, where the
    verdict for this message is looked up.
    """
    wanted_id, by_seq = _lookup_id(message_id, idempotency_key, topic, key, seq)
    found = _read_outbox(sources.outbox, wanted_id, by_seq)
    ident = found.ident
    inboxes = _read_inboxes(sources.inboxes, wanted_id, by_seq, ident)
    if ident is None:
        ident = _ident_from_inboxes(inboxes, wanted_id, by_seq)
    records = tuple(r for r, _ in inboxes)
    if ident is None:
        raise MessageNotFoundError(_not_found_text(wanted_id, by_seq, sources, records))
    verdict = (
        _verdict(found.last_run, ident[0], reports_dir) if found.last_run is not None else None
    )
    return _journey(
        ident, found.record, records, found.previous, found.next, found.blocker, found.relays,
        verdict, sources,
    )  # fmt: skip


#: a message's identity: id, topic, key, seq
Ident = tuple[uuid.UUID, str, str, int]


@dataclass(frozen=True)
class _OutboxFindings:
    """What the outbox database says: the row (None: deleted, or never committed), its key's
    neighbours, the relays and the reconciliation run that judged it."""

    ident: Ident | None = None
    record: OutboxRecord | None = None
    relays: tuple[RelaySeen, ...] = ()
    previous: KeyNeighbour | None = None
    next: KeyNeighbour | None = None
    blocker: KeyNeighbour | None = None
    last_run: Row | None = None


def _read_outbox(
    ob: TraceSource, wanted_id: uuid.UUID | None, by_seq: tuple[str, str, int] | None
) -> _OutboxFindings:
    stmts = trace_statements(ob.schema)
    with _read_only(ob) as conn:
        if wanted_id is not None:
            rows = conn.execute(stmts.message_by_id, {"id": wanted_id}).fetchall()
        else:
            assert by_seq is not None
            t, k, s = by_seq
            rows = conn.execute(stmts.message_by_seq, {"topic": t, "key": k, "seq": s}).fetchall()
        if len(rows) > 1:
            raise AmbiguousMessageError(
                f"{len(rows)} outbox rows have topic {by_seq[0]!r}, key {by_seq[1]!r}, seq "  # type: ignore[index]
                f"{by_seq[2]}: trace each by id: " + ", ".join(str(r["id"]) for r in rows)  # type: ignore[index]
            )
        relays = tuple(
            RelaySeen(
                relay_id=r["relay_id"],
                hostname=r["hostname"],
                broker=r["broker"],
                heartbeat_at=r["heartbeat_at"],
                silent_for=r["silent_for"],
            )
            for r in conn.execute(stmts.relays)
        )
        if not rows:
            return _OutboxFindings(relays=relays)
        row = rows[0]
        ident: Ident = (row["id"], row["topic"], row["key"], row["seq"])
        record = _outbox_record(row)
        params = {"topic": ident[1], "key": ident[2], "seq": ident[3]}
        previous = nxt = None
        for n in conn.execute(stmts.neighbours, params):
            if n["seq"] < ident[3]:
                previous = _neighbour(n)
            else:
                nxt = _neighbour(n)
        b = conn.execute(stmts.key_blocker, params).fetchone()
        return _OutboxFindings(
            ident=ident,
            record=record,
            relays=relays,
            previous=previous,
            next=nxt,
            blocker=_neighbour(b) if b else None,
            last_run=_last_run(conn, stmts, record.created_at),
        )


def _last_run(
    conn: psycopg.Connection[Row], stmts: TraceStatements, created_at: dt.datetime
) -> Row | None:
    try:
        with conn.transaction():  # a savepoint: a role that may not read the runs goes on
            return conn.execute(stmts.last_run, {"created_at": created_at}).fetchone()
    except (pg_errors.InsufficientPrivilege, pg_errors.UndefinedTable):
        return None


#: one consumer's record, and the message it is a record of
Found = tuple[InboxRecord, Ident | None]


def _read_inboxes(
    sources: Sequence[TraceSource],
    wanted_id: uuid.UUID | None,
    by_seq: tuple[str, str, int] | None,
    ident: Ident | None,
) -> list[Found]:
    out: list[Found] = []
    for src in sources:
        try:
            out.extend(_read_inbox(src, wanted_id, by_seq, ident))
        except psycopg.Error as exc:
            error = describe_database_error(exc).replace(
                "check --url (or $OUTBOX_DATABASE_URL)", f"check the URL of inbox {src.name!r}"
            )
            out.append((InboxRecord(src.name, None, "unreachable", error=error), None))
    return out


def _read_inbox(
    src: TraceSource,
    wanted_id: uuid.UUID | None,
    by_seq: tuple[str, str, int] | None,
    ident: Ident | None,
) -> list[Found]:
    stmts = trace_statements(src.schema)
    with _read_only(src) as conn:
        if ident is not None or wanted_id is not None:
            wanted = ident[0] if ident is not None else wanted_id
            rows = conn.execute(stmts.inbox_records, {"id": wanted}).fetchall()
        else:
            assert by_seq is not None
            t, k, s = by_seq
            rows = conn.execute(
                stmts.inbox_records_by_seq, {"topic": t, "key": k, "seq": s}
            ).fetchall()
        ids = {r["message_id"] for r in rows}
        if len(ids) > 1:
            raise AmbiguousMessageError(
                f"inbox {src.name!r} has {len(ids)} messages with that topic, key and seq "
                "(retention deleted the outbox row): trace each by id: "
                + ", ".join(sorted(map(str, ids)))
            )
        first = rows[0] if rows else None
        found: Ident | None = ident or (
            (first["message_id"], first["topic"], first["key"], first["seq"]) if first else None
        )
        if found is None:
            return []
        topic, key = found[1], found[2]
        positions = _positions(conn, stmts, topic, key)
        held = {h["consumer"]: h for h in conn.execute(stmts.inbox_held, {"id": found[0]})}
        consumers = [c["consumer"] for c in conn.execute(stmts.inbox_consumers, {"topic": topic})]
    seen = {r["consumer"]: r for r in rows}
    return [
        (_inbox_record(src.name, consumer, seen.get(consumer), held.get(consumer),
                       positions.get(consumer)), found)
        for consumer in sorted(set(consumers) | set(seen) | set(positions))
    ]  # fmt: skip


def _inbox_record(
    inbox: str, consumer: str, r: Row | None, h: Row | None, pos: Row | None
) -> InboxRecord:
    """One consumer's record (``r``; None: absent), its held row and its position on the key."""
    where: dict[str, Any] = {
        "key_applied_seq": pos["last_seq"] if pos else None,
        "key_waiting_seq": pos["waiting_seq"] if pos else None,
        "key_blocked_since": pos["blocked_since"] if pos else None,
    }
    if r is None:
        return InboxRecord(inbox, consumer, "absent", **where)
    status: str = r["status"]
    state = {"processed": "applied", "processing": "retrying"}.get(status, status)
    parked = bool(h and h["role"] == "parked")
    return InboxRecord(
        inbox,
        consumer,
        state,
        attempts=r["attempts"],
        duplicates=r["duplicates"],
        last_error=r["last_error"],
        received_at=r["received_at"],
        processed_at=r["processed_at"],
        held=bool(h and h["role"] == "dead"),
        decision=h["decision"] if h else None,
        held_by=h["dead_id"] if h and parked else None,
        held_by_seq=h["dead_seq"] if h and parked else None,
        **where,
    )


def _positions(
    conn: psycopg.Connection[Row], stmts: TraceStatements, topic: str, key: str
) -> dict[str, Row]:
    try:
        with conn.transaction():  # a role without SELECT on the positions still traces
            return {
                p["consumer"]: p
                for p in conn.execute(stmts.inbox_position, {"topic": topic, "key": key})
            }
    except pg_errors.InsufficientPrivilege:
        return {}


def _ident_from_inboxes(
    inboxes: Sequence[Found],
    wanted_id: uuid.UUID | None,
    by_seq: tuple[str, str, int] | None,
) -> Ident | None:
    found = {ident for _, ident in inboxes if ident is not None}
    if len({i[0] for i in found}) > 1:
        raise AmbiguousMessageError(
            "the inboxes hold different messages with that topic, key and seq (retention "
            "deleted the outbox row): trace each by id: "
            + ", ".join(sorted(str(i[0]) for i in found))
        )
    return next(iter(found), None)


def _not_found_text(
    wanted_id: uuid.UUID | None,
    by_seq: tuple[str, str, int] | None,
    sources: TraceSources,
    records: Sequence[InboxRecord],
) -> str:
    what = (
        f"message {wanted_id}"
        if wanted_id is not None
        else f"topic {by_seq[0]!r} key {by_seq[1]!r} seq {by_seq[2]}"  # type: ignore[index]
    )
    looked = f"the outbox database ({sources.outbox.name})"
    if sources.inboxes:
        looked += " and " + ", ".join(repr(s.name) for s in sources.inboxes)
    text = (
        f"no {what} in {looked}. Either it was never committed (a transaction that rolled "
        "back writes nothing, and its id was never sent), or retention deleted the outbox row "
        "after publication and no inbox named has a record of it"
    )
    if not sources.inboxes:
        text += " (pass the consumers' databases with --inbox to look there too)"
    down = [r for r in records if r.state == "unreachable"]
    if down:
        text += "; not read: " + "; ".join(f"{r.inbox}: {r.error}" for r in down)
    text += ". Check the id (and, for --idempotency-key, the topic)"
    return text


def _verdict(
    row: Row, message_id: uuid.UUID, reports_dir: str | Path | None
) -> ReconciliationVerdict:
    run_id, files, covers = row["run_id"], row["files"], row["covers"]
    base = dict(
        run_id=run_id, finished_at=row["finished_at"], outcome=row["outcome"],
        discrepancies=row["discrepancies"], judged=bool(covers),
    )  # fmt: skip
    if not covers:
        return ReconciliationVerdict(
            **base, note="no run has judged it yet (its commit time is after the last window)"
        )
    redrive, _details = _run_files(run_id, files or {}, reports_dir)
    if redrive is None:
        return ReconciliationVerdict(
            **base,
            note="the run's files are not reachable here (pass --reports-dir): only its "
            "outcome is known",
        )
    kinds: list[str] = []
    try:
        lost = {line.strip() for line in redrive.read_text().splitlines()}
    except OSError as exc:
        return ReconciliationVerdict(**base, note=f"cannot read {redrive}: {exc.strerror}")
    if str(message_id) in lost:
        kinds.append("lost")
    note = (
        "per message, the run's lost list (redrive.txt) is read; its other classes are in the "
        "run's details/ (Parquet) and report.html"
    )
    return ReconciliationVerdict(**base, kinds=tuple(kinds), files_read=True, note=note)


def _run_files(
    run_id: uuid.UUID, files: Mapping[str, Any], reports_dir: str | Path | None
) -> tuple[Path | None, Path | None]:
    """The run's redrive.txt and details/ (None, None: not reachable from here)."""
    if reports_dir is not None:
        root = Path(reports_dir) / str(run_id)
        if (root / "redrive.txt").is_file():
            return root / "redrive.txt", root / "details"
        return None, None
    redrive = Path(str(files["redrive"])) if files.get("redrive") else None
    details = Path(str(files["details"])) if files.get("details") else None
    if redrive is None or not redrive.is_file():
        return None, None
    return redrive, details


# ------------------------------------------------------------------------------------------
# Judging: timeline, summary, what to do
# ------------------------------------------------------------------------------------------


def _journey(
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
    mid, topic, key, seq = ident
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


def _url_flag(source: TraceSource) -> str:
    return f" --url '{redact(source.url.removeprefix('jdbc:'))}'"


def _schema_flag(source: TraceSource) -> str:
    return f" --schema {source.schema}" if source.schema else ""


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
                f"outbox dead retry --id {mid} --reason '...'{ob}",
            )
        )
    elif record is not None and record.status == "pending":
        _pending_actions(record, blocker, relays, ob, actions, notes)
    for r in records:
        action = _inbox_action(r, mid, (topic, key, seq), record, ob, inbox_flags.get(r.inbox, ""))
        if action is not None:
            actions.append(action)
    return actions, notes


def _pending_actions(
    record: OutboxRecord,
    blocker: KeyNeighbour | None,
    relays: Sequence[RelaySeen],
    ob: str,
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
            f"outbox dead retry --id {blocker.id} --reason '...'{ob}"
            if status == "dead"
            else f"outbox trace {blocker.id}{ob}"
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
                f"outbox status{ob}",
            )
        )
    if record.attempts and record.last_error:
        notes.append(
            f"attempt {record.attempts} failed ({record.last_error}); the relay retries "
            f"it from {record.available_at.isoformat()}"
        )


def _inbox_action(
    r: InboxRecord,
    mid: uuid.UUID,
    where: tuple[str, str, int],
    record: OutboxRecord | None,
    ob: str,
    inbox_url: str,
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
            f"outbox inbox dead retry --consumer {consumer} --id {mid} --reason '...'{inbox_url}",
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
            f"outbox inbox dead retry --consumer {consumer} --id {r.held_by} "
            f"--reason '...'{inbox_url}",
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
            f"outbox trace --topic {topic} --key {key} --seq {nxt}{ob}",
        )
    return Action(
        f"published at {_t(record.published_at)} but consumer {consumer} has no record of it: "
        "check that it runs and reads the topic's destination; if the broker lost it, "
        "re-publish it (same id: a consumer that has it drops the copy)",
        f"echo {mid} > ids.txt && outbox redrive ids.txt --reason '...'{ob}",
    )


# ------------------------------------------------------------------------------------------
# Text (the terminal's rendering; the console renders the dataclasses its own way)
# ------------------------------------------------------------------------------------------


def _gap(delta: dt.timedelta | None) -> str:
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
    seq = j.seq if j.seq is not None else "?"
    lines = [
        f"message {j.id}  topic {one_line(j.topic)}  key {one_line(j.key)}  seq {seq}",
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
            lines.append(f"  {_t(s.at)}  {s.what:<16} {one_line(s.where):<24} {_gap(s.after)}")
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
            f"{one_line(rl.broker or '?')}  heartbeat {_gap(rl.silent_for).lstrip('+')} ago"
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
        detail += f"  ({_gap(r.since_published)} after publication)"
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
