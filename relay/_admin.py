"""Operator functions behind `outbox status`, `outbox dead ...`, `outbox retention` and
`outbox capture ...`.

Synchronous, one short transaction each (retention: one per batch). Dead-letter changes write
their audit rows in the same statement as the change.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row, kwargs_row

from outbox.exceptions import ConfigurationError
from outbox.kit import Database, connected, default_actor, describe_database_error, redact
from outbox.schema import OUTBOX_CAPTURE, OUTBOX_WAL_PENDING, check_identifier
from relay._slot import SlotHealth, default_slot
from relay._statements import TEMPLATES, RelayStatements, relay_statements

# The public names are relay.admin's (its __all__); this module holds their code.


@dataclass(frozen=True)
class DeadFilter:
    """Which dead messages: every given field must match (none given: all of them)."""

    topic: str | None = None
    key: str | None = None
    ids: Sequence[uuid.UUID] | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    @property
    def empty(self) -> bool:
        return not any((self.topic, self.key, self.ids, self.since, self.until))

    def params(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "key": self.key,
            "ids": list(self.ids) if self.ids else None,
            "since": self.since,
            "until": self.until,
        }


@dataclass(frozen=True)
class DeadMessage:
    """A dead message of the outbox: why it died (``last_error``) and what it carries."""

    id: uuid.UUID
    topic: str
    key: str
    seq: int
    attempts: int
    created_at: dt.datetime
    last_error: str | None
    payload: bytes
    content_type: str
    headers: dict[str, str]


@dataclass(frozen=True)
class RelayStatus:
    """Backlog per topic, the live relays with what they hold, and the capture mode."""

    topics: list[dict[str, Any]] = field(default_factory=list)
    relays: list[dict[str, Any]] = field(default_factory=list)
    #: mode, slot, publication; with a slot: its state (relay/_slot.py: slot_state, the slot's
    #: database, and for a slot of this database active, lag_bytes, retained_bytes,
    #: wal_status) and ``problem``, the alert-worthy text or None
    capture: dict[str, Any] = field(default_factory=dict)

    @property
    def paused_destinations(self) -> list[dict[str, Any]]:
        """Topics a live relay has paused because their destination refuses messages."""
        return [
            {
                "topic": topic,
                "relay_id": r["relay_id"],
                "broker_kind": r.get("broker_kind"),
                **pause,
            }
            for r in self.relays
            for topic, pause in sorted((r.get("paused_destinations") or {}).items())
        ]


#: the broker family of each broker URL scheme (``outbox status``)
BROKER_KINDS = {
    "nats": "NATS JetStream", "amqp": "RabbitMQ", "amqps": "RabbitMQ", "kafka": "Kafka",
    "kafkas": "Kafka", "redis": "Redis Streams", "rediss": "Redis Streams", "mqtt": "MQTT 5",
    "mqtts": "MQTT 5", "amqp1": "AMQP 1.0", "amqp1s": "AMQP 1.0", "sqs": "Amazon SQS",
    "sns": "Amazon SNS", "stdout": "stdout", "file": "file", "memory": "memory",
}  # fmt: skip


def broker_kind(url: str | None) -> str | None:
    """The broker family of a broker URL (its scheme's), or None without one."""
    if not url:
        return None
    scheme = url.partition(":")[0].lower()
    return BROKER_KINDS.get(scheme, scheme)


def relay_status(url: Database, *, schema: str | None = None) -> RelayStatus:
    """What ``outbox status`` shows: the backlog per topic, the live relays (their broker
    URLs masked), and the capture mode with its slot's health."""
    stmts = relay_statements(schema)
    with connected(url) as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            topics = cur.execute(stmts.status_topics).fetchall()
            relays = cur.execute(stmts.status_relays).fetchall()
        capture = _capture_state(conn, stmts)
    for relay in relays:  # registered redacted; masked again, whatever wrote the row
        broker = relay.get("broker")
        relay["broker"] = redact(broker) if broker else None
        relay["broker_kind"] = broker_kind(broker)
        if isinstance(relay.get("broker_error"), str):
            relay["broker_error"] = redact(relay["broker_error"])
        for pause in (relay.get("paused_destinations") or {}).values():
            for text in ("destination", "reason", "error"):
                if isinstance(pause.get(text), str):
                    pause[text] = redact(pause[text])
    return RelayStatus(topics, relays, capture)


def _capture_state(conn: psycopg.Connection[Any], stmts: RelayStatements) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        state = cur.execute(stmts.capture_mode).fetchone()
    if state is None:
        return {"mode": "polling"}
    if state["slot"] is not None:
        state.update(_slot(conn, stmts, state["slot"]).as_status(state["mode"]))
    # the messages the relay has not numbered and recorded yet (the ledger, both modes)
    counted = conn.cursor(row_factory=dict_row).execute(stmts.capture_pending_count)
    pending = counted.fetchone()
    state["pending_messages"] = int(pending["messages"]) if pending else 0
    state["oldest_pending_seconds"] = pending["oldest_seconds"] if pending else None
    return state


def _slot(conn: psycopg.Connection[Any], stmts: RelayStatements, slot: str) -> SlotHealth:
    with conn.cursor(row_factory=class_row(SlotHealth)) as cur:
        health = cur.execute(stmts.capture_slot, {"slot": slot}).fetchone()
    assert health is not None  # one row, also for a missing slot
    return health


def enable_capture(
    url: str,
    *,
    slot: str | None = None,
    publication: str = "outbox_capture",
    schema: str | None = None,
) -> dict[str, Any]:
    """Switch the database to 'wal' capture mode (docs/explanation/capture.md).

    Checks ``wal_level``, creates the publication (empty: pgoutput sends logical messages
    whatever it holds) and the logical slot (pgoutput) unless they exist, then flips the mode.
    The slot exists before any writer emits a message, so none is ever missed. Needs a role
    with REPLICATION (to create the slot) and CREATE on the database (the publication).

    ``slot`` None: the slot the database already has, else ``outbox_<database>``
    (:func:`~relay._slot.default_slot`): slot names are global to the server, so each database
    gets its own. A slot of another database, a physical one, one with another plugin or an
    invalidated one is refused with what to do; so is a switch to another slot while this
    database's slot still holds what it has not captured.
    """
    if slot is not None:
        check_identifier(slot, "replication slot")
    check_identifier(publication, "publication")
    stmts = relay_statements(schema)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        level = conn.execute(stmts.wal_level).fetchone()
        if level is None or level["wal_level"] != "logical":
            raise ConfigurationError(
                f"wal_level is {level['wal_level'] if level else 'unknown'!r}; WAL capture needs "
                "wal_level = logical: set it in postgresql.conf (or ALTER SYSTEM SET "
                "wal_level = logical) and restart PostgreSQL; max_replication_slots and "
                "max_wal_senders must be at least 1 (the defaults are 10)",
                setting="wal_level",
            )
        _refuse_second_schema(conn, stmts)
        slot = _choose_slot(conn, stmts, slot)
        _ensure_publication(conn, stmts, publication, schema)
        health = _slot(conn, stmts, slot)
        if health.state == "missing":
            # created meanwhile (perhaps by a relay, or by another database): checked below
            try:
                with contextlib.suppress(psycopg.errors.DuplicateObject):
                    conn.execute(stmts.slot_create, {"slot": slot})
            except psycopg.OperationalError as exc:
                raise ConfigurationError(
                    f"creating replication slot {slot!r} failed: {describe_database_error(exc)}; "
                    "the capture mode is unchanged",
                    slot=slot,
                ) from exc
            health = _slot(conn, stmts, slot)
        _refuse_unusable(health)
        # The slot is checked again in the UPDATE itself: one dropped since is not recorded.
        cur = conn.execute(stmts.capture_enable, {"slot": slot, "publication": publication})
        if cur.rowcount != 1:
            raise ConfigurationError(
                f"replication slot {slot!r} was dropped while capture was being enabled; "
                "the mode is unchanged: run `outbox capture enable` again",
                slot=slot,
            )
        return _capture_state(conn, stmts)


def _ensure_publication(
    conn: psycopg.Connection[Any], stmts: RelayStatements, publication: str, schema: str | None
) -> None:
    """The publication of the pending table's inserts: created, or (made by an older version,
    empty) given the table."""
    name = sql.Identifier(publication)
    pending = (
        sql.Identifier(schema, OUTBOX_WAL_PENDING) if schema else sql.Identifier(OUTBOX_WAL_PENDING)
    )
    exists = conn.execute(stmts.publication_exists, {"publication": publication}).fetchone()
    if exists is None:
        conn.execute(TEMPLATES.publication_create.format(publication=name, pending=pending))
    elif conn.execute(stmts.publication_has_table, {"publication": publication}).fetchone() is None:
        conn.execute(TEMPLATES.publication_add.format(publication=name, pending=pending))


def _refuse_second_schema(conn: psycopg.Connection[dict[str, Any]], stmts: RelayStatements) -> None:
    """Refuse 'wal' mode while another schema of this database is in it, or still has a slot
    here: a slot decodes every logical message of its database, so that schema's relays
    would record this schema's messages as their own."""
    ours = conn.execute(stmts.capture_table).fetchone()
    others = conn.execute(stmts.capture_tables, {"table": OUTBOX_CAPTURE}).fetchall()
    for other in others:
        namespace = other["nspname"]
        if ours is not None and other["oid"] == ours["oid"]:
            continue
        try:
            row = conn.execute(
                TEMPLATES.capture_other.format(capture=sql.Identifier(namespace, OUTBOX_CAPTURE))
            ).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            continue  # not readable by this role: not an outbox this operator runs
        if row is None:
            continue
        what = (
            "is in 'wal' mode"
            if row["mode"] == "wal"
            else f"still has its replication slot {row['slot']!r} (drop it once `outbox capture "
            f"status --schema {namespace}` shows no lag)"
        )
        raise ConfigurationError(
            f"the outbox in schema {namespace!r} of this database {what}: a slot decodes "
            "every logical message of its database, so that schema's relays would record "
            "this schema's messages as their own. Use 'wal' mode for one schema per database",
            schema=namespace,
        )


def _choose_slot(
    conn: psycopg.Connection[dict[str, Any]], stmts: RelayStatements, slot: str | None
) -> str:
    """The slot to enable with: the one asked for, else the database's own, else the default;
    refused: a switch away from a slot of this database that still exists (what it has not
    captured would never be)."""
    row = conn.execute(stmts.capture_mode).fetchone()
    recorded = row["slot"] if row is not None else None
    own = recorded is not None and _slot(conn, stmts, recorded).own
    if slot is None:
        if own:
            return str(recorded)
        database = conn.execute(stmts.current_database).fetchone()
        return default_slot(str(database["database"] if database else ""))
    if own and recorded != slot:
        raise ConfigurationError(
            f"this database captures through replication slot {recorded!r}; switching to "
            f"{slot!r} would leave what {recorded!r} has not captured yet unpublished. Run "
            "`outbox capture disable`, wait until `outbox capture status` shows no lag, drop "
            f"it (SELECT pg_drop_replication_slot('{recorded}')), then enable with "
            f"--slot {slot}; or keep it: --slot {recorded}",
            slot=slot,
        )
    return slot


def _refuse_unusable(health: SlotHealth) -> None:
    """A ConfigurationError naming what is wrong with the slot and what to pass instead."""
    slot, state = health.slot, health.state
    if state == "ok":
        return
    if state == "foreign":
        owner = (
            f"belongs to database {health.database!r}"
            if health.database is not None
            else "is a physical replication slot"
        )
        raise ConfigurationError(
            f"replication slot {slot!r} {owner}, not to {health.this_database!r}: a slot "
            "decodes only the database it was created in, and slot names are global to the "
            f"server. Pass --slot NAME with a name no other database uses (the default for "
            f"this database is {default_slot(health.this_database)!r})",
            slot=slot,
        )
    if state == "plugin":
        raise ConfigurationError(
            f"replication slot {slot!r} exists with plugin {health.plugin!r}, not pgoutput: "
            "choose another --slot, or drop that slot if nothing else uses it",
            slot=slot,
        )
    if state == "invalidated":
        raise ConfigurationError(
            f"replication slot {slot!r} is invalidated (wal_status {health.wal_status}): it "
            "can decode nothing any more, and what it had not captured is lost (docs/how-to/"
            "wal-capture.md says how to find it). Drop it (SELECT pg_drop_replication_slot("
            f"'{slot}')) and run `outbox capture enable` again",
            slot=slot,
        )
    raise ConfigurationError(f"replication slot {slot!r} could not be created", slot=slot)


def disable_capture(url: str, *, schema: str | None = None) -> dict[str, Any]:
    """Switch back to polling: the relay reads the ledger table from then on (nothing needs to
    drain). The slot is kept and holds WAL on the server: drop it (``SELECT
    pg_drop_replication_slot(...)``) once no relay streams it."""
    stmts = relay_statements(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(stmts.capture_disable)
        return _capture_state(conn, stmts)


def dead_list(
    url: Database, where: DeadFilter, *, limit: int = 100, schema: str | None = None
) -> list[DeadMessage]:
    """The dead messages ``where`` selects, in key order, payloads and headers included."""
    stmts = relay_statements(schema)
    with connected(url) as conn, conn.cursor(row_factory=kwargs_row(_dead_message)) as cur:
        return cur.execute(stmts.dead_list, {**where.params(), "limit": limit}).fetchall()


def dead_listing(
    url: Database,
    where: DeadFilter,
    *,
    error: str = "",
    limit: int = 100,
    schema: str | None = None,
) -> list[dict[str, Any]]:
    """The dead letters ``where`` selects whose error contains ``error`` (case-folded), in key
    order, without payloads or headers: id, topic, key, seq, attempts, created_at, last_error."""
    stmts = relay_statements(schema)
    params = {**where.params(), "error": error, "limit": limit}
    with connected(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(stmts.dead_listing, params).fetchall()


def published_since(url: Database, seconds: float, *, schema: str | None = None) -> dict[str, int]:
    """Messages published per topic in the last ``seconds`` (topics with none are left out)."""
    with connected(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(relay_statements(schema).published_since, {"seconds": seconds})
        return {row["topic"]: int(row["published"]) for row in rows.fetchall()}


def _dead_message(*, payload: bytes, headers: dict[str, str] | None, **row: Any) -> DeadMessage:
    return DeadMessage(payload=bytes(payload), headers=headers or {}, **row)


def _change(
    statement: bytes,
    url: Database,
    where: DeadFilter,
    *,
    actor: str | None,
    reason: str | None,
    limit: int,
    dry_run: bool,
    schema: str | None,
) -> list[uuid.UUID]:
    if dry_run:
        return [m.id for m in dead_list(url, where, limit=limit, schema=schema)]
    params = {
        **where.params(),
        "limit": limit,
        "actor": actor or default_actor(),
        "reason": reason,
    }
    with connected(url, transaction=True) as conn:  # one transaction: change + audit + wake-up
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(statement, params).fetchall()
        if rows:
            # Re-queued rows, or a purged dead head that held its key: relays have work now.
            # The NOTIFY is delivered at commit, and not at all after a rollback.
            conn.execute(relay_statements(schema).wake_relays)
    return [r["message_id"] for r in rows]


def dead_retry(
    url: Database,
    where: DeadFilter,
    *,
    actor: str | None = None,
    reason: str | None = None,
    limit: int = 10_000,
    dry_run: bool = False,
    schema: str | None = None,
) -> list[uuid.UUID]:
    """Re-queue matching dead messages (pending, attempts 0, available now), audited."""
    stmt = relay_statements(schema).dead_retry
    return _change(
        stmt, url, where, actor=actor, reason=reason, limit=limit, dry_run=dry_run, schema=schema
    )


def dead_purge(
    url: Database,
    where: DeadFilter,
    *,
    actor: str | None = None,
    reason: str | None = None,
    limit: int = 10_000,
    dry_run: bool = False,
    schema: str | None = None,
) -> list[uuid.UUID]:
    """Delete matching dead messages for good, audited (a held key then moves on)."""
    stmt = relay_statements(schema).dead_purge
    return _change(
        stmt, url, where, actor=actor, reason=reason, limit=limit, dry_run=dry_run, schema=schema
    )


def _change_through(
    statement: bytes,
    url: Database,
    where: DeadFilter,
    *,
    actor: str | None,
    reason: str | None,
    limit: int,
    dry_run: bool,
    schema: str | None,
) -> list[uuid.UUID]:
    """:func:`_change` through an operator function (the console's role may not UPDATE or
    DELETE rows itself): the filter's ids, then the function, in one transaction."""
    if dry_run:
        return [m.id for m in dead_list(url, where, limit=limit, schema=schema)]
    with connected(url, transaction=True) as conn:
        ids = [m.id for m in dead_list(conn, where, limit=limit, schema=schema)]
        if not ids:
            return []
        params = {"ids": ids, "actor": actor or default_actor(), "reason": reason}
        rows = conn.cursor(row_factory=dict_row).execute(statement, params).fetchall()
        if rows:
            conn.execute(relay_statements(schema).wake_relays)
    return [r["id"] for r in rows]


def dead_requeue(
    url: Database,
    where: DeadFilter,
    *,
    actor: str | None = None,
    reason: str | None = None,
    limit: int = 10_000,
    dry_run: bool = False,
    schema: str | None = None,
) -> list[uuid.UUID]:
    """:func:`dead_retry` through ``outbox_dead_requeue()`` (what the console role may run)."""
    stmt = relay_statements(schema).dead_requeue_ids
    return _change_through(
        stmt, url, where, actor=actor, reason=reason, limit=limit, dry_run=dry_run, schema=schema
    )


def dead_drop(
    url: Database,
    where: DeadFilter,
    *,
    actor: str | None = None,
    reason: str | None = None,
    limit: int = 10_000,
    dry_run: bool = False,
    schema: str | None = None,
) -> list[uuid.UUID]:
    """:func:`dead_purge` through ``outbox_dead_purge()`` (what the console role may run)."""
    stmt = relay_statements(schema).dead_purge_ids
    return _change_through(
        stmt, url, where, actor=actor, reason=reason, limit=limit, dry_run=dry_run, schema=schema
    )


def audit_log(url: Database, *, limit: int = 50, schema: str | None = None) -> list[dict[str, Any]]:
    """The newest audit rows first (retries, purges, re-drives): at, actor, action,
    message_id, topic, key, seq, reason; as :func:`inbox.admin.dead_audit` gives the inbox's."""
    with connected(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(relay_statements(schema).audit_list, {"limit": limit}).fetchall()


def delete_published(
    url: str, older_than: float, *, batch: int = 1000, schema: str | None = None
) -> int:
    """Delete published rows older than ``older_than`` seconds, ``batch`` rows per transaction."""
    stmt = relay_statements(schema).retention
    total = 0
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            cur = conn.execute(stmt, {"keep_seconds": older_than, "limit": batch})
            total += cur.rowcount
            if cur.rowcount < batch:
                return total
