"""The least privilege each part needs, as GRANT statements (``outbox migrate grants``).

Three roles, each with only what its statements touch:

* **producer** (your service, calling ``publish()``): inserts one row per message into the
  ledger (``outbox_wal_pending``), and nothing else: it cannot read or write
  ``outbox_messages``, the per-key counters, the relay's state or the dead-letter audit, so it
  cannot write a row already numbered, marked published or leased. The relay numbers and
  records what it wrote, and checks every record before it publishes it.
* **relay** (the daemon, and operators running ``outbox status``, ``outbox dead ...`` and
  ``outbox retention``, ``outbox replay``): reads, leases, marks and deletes messages; registers
  itself; audits; keeps the replay cursors;
  reads the reconciliation runs' times and verdicts (the latest is a metric).
* **consumer** (the inbox, and operators running ``outbox inbox ...``): its own tables only.
* **console** (``outbox console``): reads every table it shows, and makes the audited changes
  its operators make: requeue or purge outbox dead letters through the operator functions
  ``outbox_dead_requeue`` and ``outbox_dead_purge`` (migration outbox_0018: they change dead
  rows only and audit them; the role has no UPDATE or DELETE on ``outbox_messages``, so it
  cannot mark a pending message published or delete one), decide on held inbox keys, each
  with its audit row. It cannot publish, lease, register a relay, change the capture mode or
  change a consumer's positions (it reads them: ``outbox trace``).
* **reconcile** (the Spark reconciliation, ``outbox reconcile``): reads the columns the
  reconciliation judges (no payloads, headers or errors) and records its runs. The start of
  the oldest transaction open in the database (which bounds the inbox horizon) comes from
  ``outbox_oldest_xact_start()`` (migration outbox_0018), which it may execute: no
  ``pg_read_all_stats``, which would also show it every session's query text.
  ``outbox ingest`` (which lands payloads) and ``outbox redrive`` (a change) need more.

Role names and the schema are composed as identifiers, never formatted into the text.
"""

from __future__ import annotations

from psycopg import sql

from outbox._statements import TEMPLATES
from outbox.schema import (
    INBOX_DEAD_AUDIT,
    INBOX_HELD,
    INBOX_KAFKA_OFFSETS,
    INBOX_MESSAGES,
    INBOX_PARTITION_LEASES,
    INBOX_PARTITION_MEMBERS,
    INBOX_POSITIONS,
    OUTBOX_CAPTURE,
    OUTBOX_CAPTURE_LEASE,
    OUTBOX_DEAD_AUDIT,
    OUTBOX_IDENTITY,
    OUTBOX_MESSAGES,
    OUTBOX_RELAYS,
    OUTBOX_REPLAY_CURSORS,
    OUTBOX_SEQUENCES,
    OUTBOX_WAL_PENDING,
    OUTBOX_WRITE_COUNTER,
    RECONCILIATION_RUNS,
    check_identifier,
)

__all__ = ["ROLE_KINDS", "grant_statements"]

#: (privilege, table, columns or None for all): what each kind of role needs.
_NEEDS: dict[str, list[tuple[str, str, tuple[str, ...] | None]]] = {
    "producer": [
        # one row of the ledger per message, in both capture modes (outbox_0024): nothing else.
        # No SELECT: an idempotency key published again is ON CONFLICT DO NOTHING.
        ("INSERT", OUTBOX_WAL_PENDING, None),
    ],
    "relay": [
        # INSERT and the counters: in 'wal' mode the relay numbers and records the messages
        ("SELECT, INSERT, UPDATE, DELETE", OUTBOX_MESSAGES, None),
        ("SELECT, INSERT, UPDATE", OUTBOX_SEQUENCES, None),
        ("SELECT", OUTBOX_CAPTURE, None),
        # the streaming relay's lease on the slot; a standby terminates a lapsed holder's
        # sessions, which PostgreSQL allows a session of the same role (docs/explanation/capture.md)
        ("SELECT, INSERT, UPDATE", OUTBOX_CAPTURE_LEASE, None),
        # the ledger: the rows it numbers, records and deletes (from the slot in 'wal' mode,
        # from the table in 'polling' mode and when the slot did not deliver them)
        ("SELECT, DELETE", OUTBOX_WAL_PENDING, None),
        ("SELECT, INSERT, UPDATE, DELETE", OUTBOX_RELAYS, None),
        ("SELECT, INSERT", OUTBOX_DEAD_AUDIT, None),
        # `outbox replay`: its cursor per (topic, consumer)
        ("SELECT, INSERT, UPDATE, DELETE", OUTBOX_REPLAY_CURSORS, None),
        # the database's origin, put on every message (outbox_0020)
        ("SELECT", OUTBOX_IDENTITY, None),
        # the latest run's verdict and time (not its summary), exported as gauges for the
        # alert rules (relay/statements.sql outbox_last_reconciliation)
        ("SELECT", RECONCILIATION_RUNS, ("started_at", "finished_at", "outcome", "discrepancies")),
    ],
    "consumer": [
        ("SELECT, INSERT, UPDATE, DELETE", INBOX_MESSAGES, None),
        ("SELECT, INSERT, UPDATE", INBOX_POSITIONS, None),
        ("SELECT, INSERT, UPDATE, DELETE", INBOX_HELD, None),
        ("SELECT, INSERT, UPDATE", INBOX_KAFKA_OFFSETS, None),
        ("SELECT, INSERT", INBOX_DEAD_AUDIT, None),
        # a partitioned consumer's members and partition leases (outbox_0023)
        ("SELECT, INSERT, UPDATE, DELETE", INBOX_PARTITION_MEMBERS, None),
        ("SELECT, INSERT, UPDATE", INBOX_PARTITION_LEASES, None),
    ],
    "console": [
        # the pages (a dead letter's payload and headers included); requeue and purge go
        # through the operator functions (_FUNCTIONS), not UPDATE or DELETE
        ("SELECT", OUTBOX_MESSAGES, None),
        # the messages committed but not numbered yet (the backlog, `outbox trace`)
        ("SELECT", OUTBOX_WAL_PENDING, None),
        ("SELECT", OUTBOX_RELAYS, None),
        ("SELECT", OUTBOX_CAPTURE, None),
        ("SELECT", OUTBOX_DEAD_AUDIT, None),
        ("SELECT", INBOX_MESSAGES, None),
        # where each consumer stands on a key (`outbox trace`: applied up to, waiting, held)
        ("SELECT", INBOX_POSITIONS, None),
        # a retry or purge of a held key is a decision the consumer applies (inbox_dead_decide)
        ("SELECT", INBOX_HELD, None),
        ("UPDATE", INBOX_HELD, ("decision",)),
        ("SELECT, INSERT", INBOX_DEAD_AUDIT, None),
        ("SELECT", RECONCILIATION_RUNS, None),
        ("SELECT", OUTBOX_REPLAY_CURSORS, None),
        # the database's origin, shown with its messages
        ("SELECT", OUTBOX_IDENTITY, None),
    ],
    "reconcile": [
        # exactly the columns the reconciliation reads (spark_ingest/_sources.py)
        (
            "SELECT",
            OUTBOX_MESSAGES,
            (
                "id",
                "topic",
                "key",
                "seq",
                "status",
                "created_at",
                "available_at",
                "published_at",
                "tx_id",
            ),
        ),
        (
            "SELECT",
            INBOX_MESSAGES,
            (
                "consumer",
                "message_id",
                "topic",
                "key",
                "seq",
                "received_at",
                "processed_at",
                "attempts",
                "duplicates",
                "status",
            ),
        ),
        ("SELECT, INSERT", RECONCILIATION_RUNS, None),
    ],
}

#: Sequences each kind of role uses: nextval needs USAGE; the relay's commit watch reads the
#: write counter (SELECT) and its dead-letter retries bump it.
_SEQUENCES: dict[str, list[tuple[str, str]]] = {
    "producer": [("USAGE", OUTBOX_WRITE_COUNTER)],
    "relay": [("SELECT, USAGE", OUTBOX_WRITE_COUNTER)],
    "consumer": [],
    # a requeue's number from the write counter is taken by the operator function
    "console": [],
    "reconcile": [],
}

#: Operator functions (SECURITY DEFINER, outbox_0018) each kind of role may execute.
_FUNCTIONS: dict[str, list[str]] = {
    "console": ["outbox_dead_requeue(uuid[], text, text)", "outbox_dead_purge(uuid[], text, text)"],
    # the horizon's bound, without pg_read_all_stats (which shows every session's query text)
    "reconcile": ["outbox_oldest_xact_start()"],
}

#: Predefined roles each kind of role is made a member of (granting one needs a superuser, or
#: a role holding it WITH ADMIN OPTION).
_MEMBER_OF: dict[str, list[str]] = {}

ROLE_KINDS = tuple(_NEEDS)


def grant_statements(kind: str, role: str, *, schema: str | None = None) -> list[str]:
    """The GRANT statements that give ``role`` what a ``kind`` of role needs, as SQL text."""
    if kind not in _NEEDS:
        raise ValueError(f"unknown role kind {kind!r}: one of {', '.join(ROLE_KINDS)}")
    if schema is not None:
        check_identifier(schema)
    grantee = sql.Identifier(role)
    out: list[sql.Composable] = []
    if schema is not None:
        out.append(TEMPLATES.grant_schema.format(schema=sql.Identifier(schema), role=grantee))
    for privileges, table, columns in _NEEDS[kind]:
        name = sql.Identifier(schema, table) if schema else sql.Identifier(table)
        if columns is None:
            grant = TEMPLATES.grant_table.format(
                privileges=sql.SQL(privileges), table=name, role=grantee
            )
        else:
            grant = TEMPLATES.grant_columns.format(
                privileges=sql.SQL(privileges),
                columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
                table=name,
                role=grantee,
            )
        out.append(grant)
    for privileges, sequence in _SEQUENCES[kind]:
        name = sql.Identifier(schema, sequence) if schema else sql.Identifier(sequence)
        out.append(
            TEMPLATES.grant_sequence.format(
                privileges=sql.SQL(privileges), sequence=name, role=grantee
            )
        )
    for function in _FUNCTIONS.get(kind, []):
        fname, _, fargs = function.partition("(")
        routine = sql.Identifier(schema, fname) if schema else sql.Identifier(fname)
        out.append(
            TEMPLATES.grant_function.format(
                function=sql.Composed([routine, sql.SQL("(" + fargs)]), role=grantee
            )
        )
    for member_of in _MEMBER_OF.get(kind, []):
        out.append(TEMPLATES.grant_role.format(member_of=sql.Identifier(member_of), role=grantee))
    return [s.as_string(None) for s in out]
