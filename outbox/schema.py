"""Table definitions: the single source for the migrations, the writers and autogenerate.

Use :func:`make_metadata` to get the tables in a schema of your choice (``None`` means the
connection's ``search_path``, normally ``public``). Put the result in your Alembic
``target_metadata`` so autogenerate never proposes to drop our tables::

    target_metadata = [app_metadata, outbox.make_metadata(schema="messaging")]

Every name carries a prefix (``outbox_``, ``inbox_``) and the naming convention below keeps
constraint and index names stable, so migrations can refer to them by name.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Sequence,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.dialects.postgresql.base import ischema_names
from sqlalchemy.types import DateTime, UserDefinedType

from outbox.exceptions import ConfigurationError

__all__ = [
    "INBOX_DEAD_AUDIT",
    "INBOX_HELD",
    "INBOX_KAFKA_OFFSETS",
    "INBOX_MESSAGES",
    "INBOX_PARTITION_LEASES",
    "INBOX_PARTITION_MEMBERS",
    "INBOX_POSITIONS",
    "MESSAGE_STATUSES",
    "NAMING_CONVENTION",
    "OUTBOX_CAPTURE",
    "OUTBOX_CAPTURE_LEASE",
    "OUTBOX_DEAD_AUDIT",
    "OUTBOX_IDENTITY",
    "OUTBOX_MESSAGES",
    "OUTBOX_RELAYS",
    "OUTBOX_REPLAY_CURSORS",
    "OUTBOX_SEQUENCES",
    "OUTBOX_WAL_PENDING",
    "OUTBOX_WRITE_COUNTER",
    "RECONCILIATION_RUNS",
    "Xid8",
    "check_identifier",
    "include_object",
    "make_metadata",
    "metadata",
]

OUTBOX_MESSAGES = "outbox_messages"
OUTBOX_SEQUENCES = "outbox_key_sequences"
OUTBOX_IDENTITY = "outbox_identity"
OUTBOX_CAPTURE = "outbox_capture"
OUTBOX_CAPTURE_LEASE = "outbox_capture_lease"
OUTBOX_WAL_PENDING = "outbox_wal_pending"
#: A sequence: bumped by every polling-mode write, read by the relay's commit watch.
OUTBOX_WRITE_COUNTER = "outbox_write_counter"
INBOX_MESSAGES = "inbox_messages"
INBOX_POSITIONS = "inbox_key_positions"
INBOX_KAFKA_OFFSETS = "inbox_kafka_offsets"
INBOX_PARTITION_MEMBERS = "inbox_partition_members"
INBOX_PARTITION_LEASES = "inbox_partition_leases"
INBOX_HELD = "inbox_held"
INBOX_DEAD_AUDIT = "inbox_dead_audit"
RECONCILIATION_RUNS = "outbox_reconciliation_runs"
OUTBOX_RELAYS = "outbox_relays"
OUTBOX_DEAD_AUDIT = "outbox_dead_audit"
OUTBOX_REPLAY_CURSORS = "outbox_replay_cursors"

#: Every status a row of each messages table can have; the library's statements write no
#: other (tests/unit/test_statuses.py). 'parked' since outbox_0008.
MESSAGE_STATUSES: dict[str, frozenset[str]] = {
    OUTBOX_MESSAGES: frozenset({"pending", "published", "dead"}),
    INBOX_MESSAGES: frozenset({"processing", "processed", "stale", "dead", "parked"}),
}

NAMING_CONVENTION: dict[str, str] = {
    "ix": "%(table_name)s_%(column_0_N_name)s_idx",
    "uq": "%(table_name)s_%(column_0_N_name)s_key",
    "ck": "%(table_name)s_%(constraint_name)s_check",
    "fk": "%(table_name)s_%(column_0_N_name)s_fkey",
    "pk": "%(table_name)s_pkey",
}

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_identifier(name: str, what: str = "schema") -> str:
    """Return ``name`` if it is a plain lower-case SQL identifier, else raise ConfigurationError."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ConfigurationError(
            f"invalid {what} name {name!r}: use 1-63 lower-case letters, digits and underscores, "
            "not starting with a digit (for example 'messaging')",
            name=name,
        )
    return name


class Xid8(UserDefinedType[int]):
    """PostgreSQL's 64-bit transaction id (``xid8``, PostgreSQL 13+)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "xid8"


# Let reflection (Alembic's autogenerate, `alembic check`) recognise the column type.
ischema_names.setdefault("xid8", Xid8)

_TIMESTAMPTZ = DateTime(timezone=True)


def make_metadata(schema: str | None = None) -> MetaData:
    """Build the outbox and inbox tables in ``schema`` (``None``: the search_path)."""
    if schema is not None:
        check_identifier(schema)
    md = MetaData(schema=schema, naming_convention=NAMING_CONVENTION)

    _outbox_messages_table(md)
    _capture_tables(md)
    _sequence_tables(md)
    _identity_table(md)
    _inbox_message_tables(md)
    _inbox_tables(md)
    _relay_tables(md)
    _reconciliation_tables(md)
    return md


def _outbox_messages_table(md: MetaData) -> None:
    """The outbox table writers insert into and the relay publishes from."""
    Table(
        OUTBOX_MESSAGES,
        md,
        # Producer-generated: UUIDv7, or derived from an idempotency key. Never a sequence
        # value, which a failover or restore can hand out twice.
        Column("id", UUID(as_uuid=True), nullable=False),
        Column("topic", Text, nullable=False),
        Column("key", Text, nullable=False),
        # Gapless per (topic, key), assigned under the row lock of outbox_key_sequences, so it
        # increases in the order the writing transactions commit.
        Column("seq", BigInteger, nullable=False),
        Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        # Serialized once, in the business transaction; the relay never re-serializes.
        Column("payload", LargeBinary, nullable=False),
        Column("content_type", Text, nullable=False, server_default=text("'application/json'")),
        Column("traceparent", Text, nullable=True),
        Column(
            "created_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        Column(
            "available_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        Column("status", Text, nullable=False, server_default=text("'pending'")),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("last_error", Text, nullable=True),
        Column("published_at", _TIMESTAMPTZ, nullable=True),
        # The writing top-level transaction: readers that must never see a half-committed
        # window (reconciliation, incremental ingest) only take rows whose tx_id is below
        # pg_snapshot_xmin(pg_current_snapshot()). Not the xmin system column: that one is
        # 32-bit, wraps, and changes when the row is updated.
        Column("tx_id", Xid8(), nullable=False, server_default=text("pg_current_xact_id()")),
        # No UNIQUE (topic, key, seq): numbers are unique by construction (the counter row
        # below), and every lookup by key uses the relay's partial index (outbox_0005).
        PrimaryKeyConstraint("id"),
        # No CHECK constraints (outbox_0013): PostgreSQL plans a table's checks again for
        # every statement that writes it, which costs a one-row insert more than the row. Only
        # the library's statements write this table: statuses are constants in them (held to
        # MESSAGE_STATUSES by a test), topic and key are refused blank before any I/O, seq
        # comes from the counter row, attempts count up from 0.
        # Retention deletes old published rows in batches by published_at; partial so that
        # pending rows (and the writers inserting them) do not pay for it.
        Index(
            None,
            "published_at",
            postgresql_where=text("status = 'published'"),
        ),
    )


def _capture_tables(md: MetaData) -> None:
    """How committed messages reach the relay, and who streams a slot."""
    Table(
        OUTBOX_CAPTURE,
        md,
        # One row: how committed messages reach the relay (outbox_0010,
        # docs/explanation/capture.md).
        # 'polling': rows of outbox_messages; 'wal': transactional logical messages the relay
        # decodes from the replication slot named here (pgoutput, through the publication).
        Column("singleton", Boolean, nullable=False, server_default=text("true")),
        Column("mode", Text, nullable=False, server_default=text("'polling'")),
        Column("slot", Text, nullable=True),
        Column("publication", Text, nullable=True),
        Column(
            "changed_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        PrimaryKeyConstraint("singleton"),
        CheckConstraint("singleton", name="one_row"),
        CheckConstraint("mode IN ('polling', 'wal')", name="mode_valid"),
        CheckConstraint("mode = 'polling' OR slot IS NOT NULL", name="wal_has_slot"),
    )

    Table(
        OUTBOX_CAPTURE_LEASE,
        md,
        # Who streams a slot, under a lease (outbox_0014, relay/_capture.py): the holder's
        # sessions (the one holding the capture lock, which also records the batches, and the
        # walsender), its heartbeat on the server's clock, and an epoch bumped by every
        # takeover. A standby that finds the heartbeat older than lease_seconds terminates
        # the sessions started before acquired_at and takes the slot over.
        Column("slot", Text, nullable=False),
        Column("holder", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("lock_pid", Integer, nullable=False),
        Column("stream_pid", Integer, nullable=True),
        Column("lease_seconds", Float, nullable=False),
        Column("acquired_at", _TIMESTAMPTZ, nullable=False),
        Column("heartbeat_at", _TIMESTAMPTZ, nullable=False),
        PrimaryKeyConstraint("slot"),
    )

    Table(
        OUTBOX_WAL_PENDING,
        md,
        # 'wal' mode's durable record (outbox_0017, docs/explanation/capture.md): a writer
        # inserts one row per message (its id and the record of outbox/_capture.py); the relay
        # decodes the insert from the slot, records the message in outbox_messages and deletes
        # the row in the same transaction. What a lost slot held is still here: the relay
        # publishes it from the table. Only the primary key: every index costs every writer.
        Column("id", UUID(as_uuid=True), nullable=False),
        Column("record", LargeBinary, nullable=False),
        Column(
            "written_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        PrimaryKeyConstraint("id"),
    )


def _sequence_tables(md: MetaData) -> None:
    """The per-key sequence counters and the write counter."""
    Table(
        OUTBOX_SEQUENCES,
        md,
        # One row per (topic, key). A writer bumps last_seq in the same statement as its
        # insert; the row lock it holds until commit orders writers of the same key and leaves
        # writers of other keys alone.
        Column("topic", Text, nullable=False),
        Column("key", Text, nullable=False),
        Column("last_seq", BigInteger, nullable=False),
        PrimaryKeyConstraint("topic", "key"),
        # No CHECK constraint (outbox_0013), as for outbox_messages: every polling-mode
        # publish() upserts a row here; last_seq only ever counts up from 0.
    )

    # Bumped (nextval) by every statement that writes messages as rows, after the rows: a
    # polling relay's commit watch reads it with the server's snapshot (outbox_0012,
    # relay/_watch.py). Never rolled back, never waited on.
    Sequence(OUTBOX_WRITE_COUNTER, metadata=md, data_type=BigInteger, cycle=True)


def _identity_table(md: MetaData) -> None:
    """The database's origin (outbox_0020), put on every message the relay publishes."""
    Table(
        OUTBOX_IDENTITY,
        md,
        # One row. NULL: messages go out without an origin (a database that published before
        # outbox_0020 keeps doing so until an operator sets one: docs/how-to/tenants.md).
        Column("one", Boolean, nullable=False, server_default=text("true")),
        Column("origin", Text, nullable=True),
        PrimaryKeyConstraint("one"),
        CheckConstraint("one", name="one_row"),
        CheckConstraint(
            "origin IS NULL OR (origin <> '' AND octet_length(origin) <= 255)",
            name="origin_valid",
        ),
    )


def _inbox_message_tables(md: MetaData) -> None:
    """The inbox records and the per-key positions of ordered consumers."""
    Table(
        INBOX_MESSAGES,
        md,
        Column("consumer", Text, nullable=False),
        Column("message_id", UUID(as_uuid=True), nullable=False),
        Column("topic", Text, nullable=False),
        Column("key", Text, nullable=False),
        Column("seq", BigInteger, nullable=True),
        Column(
            "received_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        Column("processed_at", _TIMESTAMPTZ, nullable=True),
        # Deliveries seen, failed handler attempts included: an aid for operators, never used
        # to decide whether a message is a duplicate (the primary key does that).
        Column("attempts", Integer, nullable=False, server_default=text("1")),
        Column("status", Text, nullable=False, server_default=text("'processed'")),
        Column("last_error", Text, nullable=True),
        # Deliveries after the message was settled (processed, stale or dead): the duplicates
        # proper, unlike attempts, which also counts failed handler attempts (outbox_0006).
        Column("duplicates", Integer, nullable=False, server_default=text("0")),
        PrimaryKeyConstraint("consumer", "message_id"),
        # No CHECK constraints (outbox_0013), as for outbox_messages: one row is written in
        # every consumer transaction. Statuses are constants in the inbox's statements (held
        # to MESSAGE_STATUSES by a test); the consumer name is refused blank before any I/O.
        # Retention purges processed records older than a window, in batches.
        Index(None, "received_at"),
    )

    Table(
        INBOX_POSITIONS,
        md,
        # The per-key order guard: the last sequence number a consumer applied for a key.
        # Kept after the inbox records are purged, as a cheap second duplicate guard.
        Column("consumer", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("key", Text, nullable=False),
        Column("last_seq", BigInteger, nullable=False),
        Column(
            "updated_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        # A key waiting for a predecessor (outbox_0007): the seq that last arrived too early,
        # since when the key has waited (cleared when it moves on), and how many early
        # deliveries it refused. ``outbox inbox blocked`` lists the keys that wait too long.
        Column("waiting_seq", BigInteger, nullable=True),
        Column("blocked_since", _TIMESTAMPTZ, nullable=True),
        Column("out_of_order", BigInteger, nullable=False, server_default=text("0")),
        # The seq of the dead message that holds the key (on_dead="hold", outbox_0008): no
        # later message of the key is applied until an operator retries or purges it.
        Column("held_seq", BigInteger, nullable=True),
        # The database the key's messages come from (outbox_0020): the envelope's origin, ''
        # for messages without one. Several databases may number one (topic, key) each.
        Column("origin", Text, nullable=False, server_default=text("''")),
        PrimaryKeyConstraint("consumer", "origin", "topic", "key"),
        # The few waiting keys of a consumer, for `outbox inbox blocked` and the consumers'
        # blocked-keys gauge, without reading every position of the consumer (outbox_0007).
        Index(None, "consumer", postgresql_where=text("blocked_since IS NOT NULL")),
    )


def _inbox_tables(md: MetaData) -> None:
    """Tables the inbox adds (migrations outbox_0003 and outbox_0008)."""
    Table(
        INBOX_HELD,
        md,
        # Key-aware dead letters (on_dead="hold"): the dead message that holds a key and the
        # key's later messages parked behind it, kept whole so the consumer can apply them
        # once an operator decides (decision: 'retry' or 'purge' the dead message).
        Column("consumer", Text, nullable=False),
        Column("message_id", UUID(as_uuid=True), nullable=False),
        Column("topic", Text, nullable=False),
        Column("key", Text, nullable=False),
        Column("seq", BigInteger, nullable=False),
        Column("role", Text, nullable=False),
        Column("payload", LargeBinary, nullable=False),
        Column("content_type", Text, nullable=False),
        Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        Column("traceparent", Text, nullable=True),
        Column("created_at", _TIMESTAMPTZ, nullable=True),
        Column("held_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")),
        Column("decision", Text, nullable=True),
        # the origin of the held message (outbox_0020): its key's position is per origin
        Column("origin", Text, nullable=False, server_default=text("''")),
        PrimaryKeyConstraint("consumer", "message_id"),
        CheckConstraint("role IN ('dead', 'parked')", name="role_valid"),
        CheckConstraint(
            "decision IS NULL OR (role = 'dead' AND decision IN ('retry', 'purge'))",
            name="decision_valid",
        ),
        Index(None, "consumer", "topic", "key", "seq"),
    )
    Table(
        INBOX_DEAD_AUDIT,
        md,
        # Who decided what about a held dead message, when and why, and what the consumer made
        # of it (retried, retry_failed, purged); written with the change it describes.
        Column("id", BigInteger, Identity(always=True), nullable=False),
        Column("at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")),
        Column("actor", Text, nullable=False),
        Column("action", Text, nullable=False),
        Column("consumer", Text, nullable=False),
        Column("message_id", UUID(as_uuid=True), nullable=False),
        Column("topic", Text, nullable=False),
        Column("key", Text, nullable=False),
        Column("seq", BigInteger, nullable=False),
        Column("last_error", Text, nullable=True),
        Column("reason", Text, nullable=True),
        PrimaryKeyConstraint("id"),
        CheckConstraint(
            "action IN ('retry', 'purge', 'retried', 'retry_failed', 'purged')",
            name="action_valid",
        ),
        Index(None, "message_id"),
    )
    Table(
        INBOX_KAFKA_OFFSETS,
        md,
        # A Kafka consumer that stores its offsets in the same transaction as its effects: the
        # next offset to read per partition, read back when partitions are assigned.
        Column("consumer", Text, nullable=False),
        Column("topic", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("next_offset", BigInteger, nullable=False),
        Column(
            "updated_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        PrimaryKeyConstraint("consumer", "topic", "partition"),
        CheckConstraint("next_offset >= 0", name="next_offset_not_negative"),
    )
    _inbox_partition_tables(md)


def _inbox_partition_tables(md: MetaData) -> None:
    """Who consumes which partition of a partitioned consumer (migration outbox_0023).

    A member is one process of the consumer, alive while its heartbeat keeps ``expires_at``
    ahead; a lease row is one partition, held by ``owner`` (a member) until ``expires_at``.
    ``epoch`` counts the partition's owners: a process applies a message of the partition only
    in a transaction that finds its (owner, epoch) still holding the lease (the fence).
    """
    Table(
        INBOX_PARTITION_MEMBERS,
        md,
        Column("consumer", Text, nullable=False),
        Column("member", Text, nullable=False),
        Column("partitions", Integer, nullable=False),
        Column("expires_at", _TIMESTAMPTZ, nullable=False),
        Column("joined_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")),
        PrimaryKeyConstraint("consumer", "member"),
        CheckConstraint("partitions BETWEEN 1 AND 1024", name="partitions_valid"),
    )
    Table(
        INBOX_PARTITION_LEASES,
        md,
        Column("consumer", Text, nullable=False),
        Column("partition", Integer, nullable=False),
        Column("owner", Text, nullable=True),
        Column("epoch", BigInteger, nullable=False, server_default=text("0")),
        Column("expires_at", _TIMESTAMPTZ, nullable=True),
        PrimaryKeyConstraint("consumer", "partition"),
        CheckConstraint("partition >= 0 AND partition < 1024", name="partition_valid"),
    )


def _relay_tables(md: MetaData) -> None:
    """What the relay daemon adds (leases, live relays, audit); see migration outbox_0002.

    The relay claims rows with a lease instead of a status change: a claimed row stays
    ``pending`` and carries its owner, a fencing token and an expiry (see relay/statements.sql).
    """
    messages = md.tables[f"{md.schema}.{OUTBOX_MESSAGES}" if md.schema else OUTBOX_MESSAGES]
    # The relay holding the row, the fencing token of its claim (fresh per claim: a relay that
    # lost the row cannot mark it), and when the lease lapses (then any relay may claim it).
    messages.append_column(Column("lease_owner", Text, nullable=True))
    messages.append_column(Column("lease_token", UUID(as_uuid=True), nullable=True))
    messages.append_column(Column("lease_until", _TIMESTAMPTZ, nullable=True))
    # Head-of-key lookups: "is there an earlier unpublished row of this (topic, key)?". Partial,
    # so a key's published history, however long, is never scanned.
    Index(
        None,
        messages.c.topic,
        messages.c.key,
        messages.c.seq,
        postgresql_where=text("status <> 'published'"),
    )

    Table(
        OUTBOX_RELAYS,
        md,
        # One row per running relay process: written at start, touched every heartbeat, deleted
        # at a clean stop. Only for `outbox status`; correctness never depends on it (leases do).
        Column("relay_id", Text, nullable=False),
        Column("hostname", Text, nullable=False),
        Column("pid", Integer, nullable=False),
        Column(
            "started_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        Column(
            "heartbeat_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        Column("config", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        PrimaryKeyConstraint("relay_id"),
    )

    Table(
        OUTBOX_DEAD_AUDIT,
        md,
        # Who re-queued (retry, or `outbox redrive`) or purged which message, when, and why:
        # written in the same transaction as the change itself.
        Column("id", BigInteger, Identity(always=True), nullable=False),
        Column("at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")),
        Column("actor", Text, nullable=False),
        Column("action", Text, nullable=False),
        Column("message_id", UUID(as_uuid=True), nullable=False),
        Column("topic", Text, nullable=False),
        Column("key", Text, nullable=False),
        Column("seq", BigInteger, nullable=False),
        Column("last_error", Text, nullable=True),
        Column("reason", Text, nullable=True),
        PrimaryKeyConstraint("id"),
        CheckConstraint("action IN ('retry', 'purge', 'redrive', 'replay')", name="action_valid"),
        Index(None, "message_id"),
    )
    _replay_cursors_table(md)


def _replay_cursors_table(md: MetaData) -> None:
    """Where each ``outbox replay`` stands; see migration outbox_0016."""
    Table(
        OUTBOX_REPLAY_CURSORS,
        md,
        # `outbox replay` (outbox_0016): one row per (topic, consumer) it re-publishes to:
        # where to, from when, the last (key, seq) the broker confirmed (a re-run continues
        # after it), how many were sent, who started it, why.
        Column("topic", Text, nullable=False),
        Column("consumer", Text, nullable=False),
        Column("destination", Text, nullable=False),
        Column("since", _TIMESTAMPTZ, nullable=True),
        Column("last_key", Text, nullable=True),
        Column("last_seq", BigInteger, nullable=True),
        Column("replayed", BigInteger, nullable=False, server_default=text("0")),
        Column("actor", Text, nullable=False),
        Column("reason", Text, nullable=True),
        Column("options", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        Column(
            "started_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        Column(
            "updated_at", _TIMESTAMPTZ, nullable=False, server_default=text("clock_timestamp()")
        ),
        Column("finished_at", _TIMESTAMPTZ, nullable=True),
        PrimaryKeyConstraint("topic", "consumer"),
    )


# ---------------------------------------------------------------------------------------------
# (kept apart from the relay's section so the two evolve without touching each other)
# ---------------------------------------------------------------------------------------------


def _reconciliation_tables(md: MetaData) -> None:
    """Tables the nightly reconciliation adds (run history); see migration outbox_0004.

    Ingest watermarks live next to the Parquet lake they describe (written after the data), so
    the lake and its watermark cannot disagree; only the run history is kept here.
    """
    Table(
        RECONCILIATION_RUNS,
        md,
        Column("run_id", UUID(as_uuid=True), nullable=False),
        Column("started_at", _TIMESTAMPTZ, nullable=False),
        Column("finished_at", _TIMESTAMPTZ, nullable=False),
        Column("window_start", _TIMESTAMPTZ, nullable=False),
        Column("window_end", _TIMESTAMPTZ, nullable=False),
        # The outbox horizon frozen at job start: only rows with tx_id below it were judged.
        Column("horizon_xmin", BigInteger, nullable=False),
        Column("messages", BigInteger, nullable=False),
        Column("discrepancies", BigInteger, nullable=False),
        # 'ok' or 'failed' (a configured threshold was exceeded).
        Column("outcome", Text, nullable=False),
        # Counts per class, latency percentiles, thresholds: the JSON summary of the run.
        Column("summary", JSONB, nullable=False),
        PrimaryKeyConstraint("run_id"),
        CheckConstraint("outcome IN ('ok', 'failed')", name="outcome_valid"),
        CheckConstraint("window_start < window_end", name="window_ordered"),
        Index(None, "started_at"),
    )


#: The tables in the search_path schema.
metadata: MetaData = make_metadata()

_OUR_PREFIXES = ("outbox_", "inbox_")


def _ours(name: str | None) -> bool:
    return (name or "").startswith(_OUR_PREFIXES)


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic ``include_object`` hook for apps that do not add our MetaData to theirs.

    It hides our tables (and their indexes) from the app's autogenerate, so it never proposes
    to drop them.
    """
    if type_ == "table":
        return not _ours(name)
    table = getattr(obj, "table", None)
    return not _ours(getattr(table, "name", None))
