"""Reading: the message's outbox row, its key's neighbours, the relays, the latest
reconciliation run that judged it, and every named inbox database's records of it, each
database in one read-only transaction."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import DictRow, dict_row

from outbox._capture import RecordError, decode_record
from outbox._errors import describe_database_error
from outbox._ids import id_from_idempotency_key
from outbox._trace_statements import TraceStatements, trace_statements
from outbox.exceptions import AmbiguousMessageError, ConfigurationError, MessageNotFoundError
from outbox.trace._advice import compose_journey
from outbox.trace._config import TraceSource, TraceSources
from outbox.trace._model import (
    Ident,
    InboxRecord,
    Journey,
    KeyNeighbour,
    OutboxRecord,
    ReconciliationVerdict,
    RelaySeen,
)

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


def _in_ledger(
    conn: Any, stmts: TraceStatements, wanted_id: uuid.UUID | None
) -> tuple[Ident, OutboxRecord] | None:
    """A message committed but not numbered yet (its ledger row): status 'ledger', seq 0."""
    if wanted_id is None:
        return None
    row = conn.execute(stmts.ledger_by_id, {"id": wanted_id}).fetchone()
    if row is None:
        return None
    try:
        rec = decode_record(bytes(row["record"]))
    except RecordError:
        return None
    record = OutboxRecord(
        status="ledger", attempts=0, last_error=None, created_at=row["written_at"],
        available_at=rec.available_at or row["written_at"], published_at=None, leased_by=None,
        lease_until=None, content_type=rec.content_type, headers=orjson.loads(rec.headers or "{}"),
        payload_bytes=len(rec.payload),
    )  # fmt: skip
    return Ident(id=rec.id, topic=rec.topic, key=rec.key, seq=0), record


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
    # the consumers' positions of the message's origin ('' for a database without one);
    # without the outbox row, every origin's
    origin = (found.origin or "") if ident is not None else None
    inboxes = _read_inboxes(sources.inboxes, wanted_id, by_seq, ident, origin)
    if ident is None:
        ident = _ident_from_inboxes(inboxes, wanted_id, by_seq)
    records = tuple(r for r, _ in inboxes)
    if ident is None:
        raise MessageNotFoundError(_not_found_text(wanted_id, by_seq, sources, records))
    verdict = (
        _verdict(found.last_run, ident.id, reports_dir) if found.last_run is not None else None
    )
    journey = compose_journey(
        ident, found.record, records, found.previous, found.next, found.blocker, found.relays,
        verdict, sources,
    )  # fmt: skip
    return dataclasses.replace(journey, origin=found.origin) if found.origin else journey


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
    origin: str | None = None


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
        origin = _origin(conn, stmts)
        if not rows:
            ledger = _in_ledger(conn, stmts, wanted_id)
            if ledger is not None:
                return _OutboxFindings(
                    ident=ledger[0], record=ledger[1], relays=relays, origin=origin
                )
            return _OutboxFindings(relays=relays, origin=origin)
        row = rows[0]
        ident = Ident(id=row["id"], topic=row["topic"], key=row["key"], seq=row["seq"])
        record = _outbox_record(row)
        params = {"topic": ident.topic, "key": ident.key, "seq": ident.seq}
        previous = nxt = None
        for n in conn.execute(stmts.neighbours, params):
            if n["seq"] < ident.seq:
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
            origin=origin,
        )


def _origin(conn: psycopg.Connection[Row], stmts: TraceStatements) -> str | None:
    """The outbox database's origin; None without one (or before outbox_0020)."""
    try:
        with conn.transaction():  # a savepoint: an older schema or a narrower role goes on
            row = conn.execute(stmts.origin).fetchone()
    except (pg_errors.InsufficientPrivilege, pg_errors.UndefinedTable):
        return None
    return row["origin"] if row else None


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
    origin: str | None = None,
) -> list[Found]:
    out: list[Found] = []
    for src in sources:
        try:
            out.extend(_read_inbox(src, wanted_id, by_seq, ident, origin))
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
    origin: str | None = None,
) -> list[Found]:
    stmts = trace_statements(src.schema)
    with _read_only(src) as conn:
        if ident is not None or wanted_id is not None:
            wanted = ident.id if ident is not None else wanted_id
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
            Ident(id=first["message_id"], topic=first["topic"], key=first["key"], seq=first["seq"])
            if first
            else None
        )
        if found is None:
            return []
        topic, key = found.topic, found.key
        positions = _positions(conn, stmts, topic, key, origin)
        held = {h["consumer"]: h for h in conn.execute(stmts.inbox_held, {"id": found.id})}
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
    conn: psycopg.Connection[Row],
    stmts: TraceStatements,
    topic: str,
    key: str,
    origin: str | None = None,
) -> dict[str, Row]:
    params = {"topic": topic, "key": key, "origin": origin}
    try:
        with conn.transaction():  # a role without SELECT on the positions still traces
            return {p["consumer"]: p for p in conn.execute(stmts.inbox_position, params)}
    except pg_errors.InsufficientPrivilege:
        return {}


def _ident_from_inboxes(
    inboxes: Sequence[Found],
    wanted_id: uuid.UUID | None,
    by_seq: tuple[str, str, int] | None,
) -> Ident | None:
    found = {ident for _, ident in inboxes if ident is not None}
    if len({i.id for i in found}) > 1:
        raise AmbiguousMessageError(
            "the inboxes hold different messages with that topic, key and seq (retention "
            "deleted the outbox row): trace each by id: "
            + ", ".join(sorted(str(i.id) for i in found))
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
