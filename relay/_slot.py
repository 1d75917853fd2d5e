"""The WAL capture slot's health: can the slot the mode row names capture this database?

Replication slot names are global to a PostgreSQL server, and a logical slot decodes the
database it was created in only. So the slot ``outbox_capture`` names can be unable to capture
anything of this database: missing (dropped, never restored, lost in a failover), foreign
(another database's, as after ``CREATE DATABASE ... TEMPLATE`` or when a second database was
enabled with the first one's slot name), of another output plugin, or invalidated (its WAL
removed past ``max_slot_wal_keep_size``). Nothing is lost then: every message waits in
``outbox_wal_pending`` until the relay records it, and the capturing relay makes a fresh slot
(missing, invalidated) or publishes from the table alone (relay/_capture.py). Every surface
reads the state from here: ``outbox status`` and ``outbox capture``, the console, the relay's
log and metrics (docs/how-to/wal-capture.md, "A slot that is missing, foreign or invalidated").
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["SLOT_STATES", "SlotHealth", "default_slot"]

#: what ``outbox_capture_slot`` (relay/statements.sql) says of a slot
SLOT_STATES = ("ok", "missing", "foreign", "plugin", "invalidated")

_NOT_SLOT_CHARACTER = re.compile(r"[^a-z0-9_]")
_MAX_NAME = 63  # NAMEDATALEN - 1


def default_slot(database: str) -> str:
    """The slot ``outbox capture enable`` creates for ``database`` without ``--slot``:
    ``outbox_<database>``. A name that is not already lower-case letters, digits and
    underscores of at most 56 characters gets them (others become ``_``, the rest is cut) and
    8 hex digits of its SHA-1, so that two databases of one server never derive the same
    name ("App" and "app", "a-b" and "a_b")."""
    clean = _NOT_SLOT_CHARACTER.sub("_", database.lower())
    name = f"outbox_{clean}"
    if clean == database and len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha1(database.encode(), usedforsecurity=False).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9]}_{digest}"


@dataclass(frozen=True)
class SlotHealth:
    """One row of ``outbox_capture_slot`` (read by column name: ``class_row(SlotHealth)``)."""

    slot: str
    active: bool | None
    lag_bytes: int | None
    retained_bytes: int | None
    wal_status: str | None
    #: the database the slot decodes (None: missing, or a physical slot)
    database: str | None
    plugin: str | None
    confirmed_lsn: str | None
    state: str
    this_database: str

    @property
    def own(self) -> bool:
        """A logical slot of this database (usable or not)."""
        return self.state in ("ok", "plugin", "invalidated")

    def problem(self, mode: str | None) -> str | None:
        """What is wrong, for an operator, or None. Alert-worthy: in 'wal' mode anything but
        'ok' (messages wait in outbox_wal_pending until the relay repairs the slot or
        publishes them from the table: latency, never a loss); in 'polling' mode an
        invalidated slot (drop it). In 'polling' mode a slot that is gone or another
        database's is normal: nothing to drain."""
        fix = 'see docs/how-to/wal-capture.md, "A slot that is missing, foreign or invalidated"'
        slot = self.slot
        table = (
            "no message is lost: every one waits in outbox_wal_pending until the relay records it"
        )
        if self.state == "invalidated":
            if mode != "wal":
                return (
                    f"replication slot {slot!r} is invalidated (wal_status {self.wal_status}: "
                    "its WAL was removed, max_slot_wal_keep_size); the database is in "
                    "'polling' mode and the relay publishes what outbox_wal_pending still "
                    f"holds from the table: drop the slot (`SELECT pg_drop_replication_slot"
                    f"('{slot}')`) or run `outbox capture enable` again; {fix}"
                )
            return (
                f"replication slot {slot!r} is invalidated (wal_status {self.wal_status}: its "
                "WAL was removed past max_slot_wal_keep_size, confirmed position "
                f"{self.confirmed_lsn or 'unknown'}); {table}. The capturing relay drops it, "
                "creates a fresh one and publishes the table's messages first, each key in "
                "order; if it cannot (it lacks REPLICATION), it publishes from the table "
                f"alone: run `outbox capture enable`; {fix}"
            )
        if mode != "wal" or self.state == "ok":
            return None
        if self.state == "missing":
            return (
                f"replication slot {slot!r} does not exist (dropped, or lost in a failover or "
                f"a restore): nothing decodes database {self.this_database!r}; {table}. The "
                "capturing relay creates a fresh slot and publishes the table's messages "
                "first, each key in order; if it cannot (it lacks REPLICATION), it publishes "
                f"from the table alone: run `outbox capture enable`; {fix}"
            )
        if self.state == "foreign":
            owner = (
                f"belongs to database {self.database!r}"
                if self.database is not None
                else "is a physical replication slot"
            )
            return (
                f"replication slot {slot!r} {owner}, not to {self.this_database!r}: it decodes "
                f"nothing of this database (slot names are global to the server); {table}, "
                "and the relay publishes them from the table, a second slower. Give this "
                f"database a slot of its own: `outbox capture enable` (it creates "
                f"{default_slot(self.this_database)!r}) or `--slot NAME`; {fix}"
            )
        return (
            f"replication slot {slot!r} uses the output plugin {self.plugin!r}, not pgoutput; "
            f"{table}, and the relay publishes them from the table, a second slower. Run "
            f"`outbox capture enable --slot NAME` with another name; {fix}"
        )

    def as_status(self, mode: str | None) -> dict[str, Any]:
        """The slot's part of ``outbox status --json``'s ``capture``. Lag and retained WAL
        only for a slot of this database: another database's lag says nothing of this one."""
        state: dict[str, Any] = {
            "slot_exists": self.state != "missing",
            "slot_state": self.state,
            "slot_database": self.database,
            "database": self.this_database,
            "problem": self.problem(mode),
        }
        if self.own:
            fields = asdict(self)
            for name in ("active", "lag_bytes", "retained_bytes", "wal_status", "confirmed_lsn"):
                state[name] = fields[name]
        return state
