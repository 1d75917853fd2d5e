"""The WAL capture slot's health: can the slot the mode row names capture this database?

Replication slot names are global to a PostgreSQL server, and a logical slot decodes the
database it was created in only. So the slot ``outbox_capture`` names can be unable to capture
anything of this database: missing (dropped, never restored, lost in a failover), foreign
(another database's, as after ``CREATE DATABASE ... TEMPLATE`` or when a second database was
enabled with the first one's slot name), of another output plugin, or invalidated (its WAL
removed past ``max_slot_wal_keep_size``). Writers then write rows instead of emitting (the
check in outbox/statements.sql), which the polling loop publishes; what was emitted into a slot
before it was dropped or invalidated, and not captured yet, is lost. Every surface reads the
state from here: ``outbox status`` and ``outbox capture``, the console, the relay's log and
metrics (docs/how-to/wal-capture.md, "A slot that is missing, foreign or invalidated").
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
        'ok' (writers fall back to rows; messages may have been lost); in 'polling' mode an
        invalidated slot (what it had not captured before the switch is lost). In 'polling'
        mode a slot that is gone or another database's is normal: nothing to drain."""
        fix = "see docs/how-to/wal-capture.md, \"A slot that is missing, foreign or invalidated\""
        meanwhile = (
            "writers write rows meanwhile (the polling loop publishes them)"
            if mode == "wal"
            else "the database is in 'polling' mode"
        )
        slot = self.slot
        if self.state == "invalidated":
            return (
                f"replication slot {slot!r} is invalidated (wal_status {self.wal_status}: its "
                "WAL was removed, max_slot_wal_keep_size): messages committed in 'wal' mode "
                f"after its confirmed position {self.confirmed_lsn or 'unknown'} were never "
                f"captured and are in no table; {meanwhile}. Run `outbox capture disable`, "
                f"drop the slot, run `outbox capture enable`, and find the lost messages: {fix}"
            )
        if mode != "wal" or self.state == "ok":
            return None
        if self.state == "missing":
            return (
                f"replication slot {slot!r} does not exist: nothing decodes database "
                f"{self.this_database!r}; {meanwhile}. Messages emitted before the slot "
                f"disappeared and not yet captured are lost. Run `outbox capture enable` to "
                f"create a slot; {fix}"
            )
        if self.state == "foreign":
            owner = (
                f"belongs to database {self.database!r}"
                if self.database is not None
                else "is a physical replication slot"
            )
            return (
                f"replication slot {slot!r} {owner}, not to {self.this_database!r}: it decodes "
                f"nothing of this database (slot names are global to the server); {meanwhile}. "
                f"Give this database a slot of its own: `outbox capture enable` (it creates "
                f"{default_slot(self.this_database)!r}) or `--slot NAME`; {fix}"
            )
        return (
            f"replication slot {slot!r} uses the output plugin {self.plugin!r}, not pgoutput; "
            f"{meanwhile}. Run `outbox capture enable --slot NAME` with another name; {fix}"
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
