"""Operator functions of the relay: status, dead letters, retention, WAL capture.

The daemon's API (:class:`~relay.Relay`, its config, the publishers) lives in :mod:`relay`;
what an operator runs against an outbox database (the ``outbox status``, ``outbox dead ...``,
``outbox retention`` and ``outbox capture ...`` commands, a cron job, the console) lives here,
as the inbox's does in :mod:`inbox.admin`::

    from relay.admin import DeadFilter, dead_list, dead_retry, relay_status

Each function takes a database URL or an open psycopg connection and runs one short
transaction (retention: one per batch). Dead-letter changes write their audit rows in the same
statement as the change. The names used to be on :mod:`relay`; they still work there for one
release and warn.
"""

from __future__ import annotations

from relay._admin import (
    DeadFilter,
    DeadMessage,
    RelayStatus,
    audit_log,
    broker_kind,
    dead_drop,
    dead_list,
    dead_listing,
    dead_purge,
    dead_requeue,
    dead_retry,
    delete_published,
    disable_capture,
    enable_capture,
    published_since,
    relay_status,
)

__all__ = [
    "DeadFilter",
    "DeadMessage",
    "RelayStatus",
    "audit_log",
    "broker_kind",
    "dead_drop",
    "dead_list",
    "dead_listing",
    "dead_purge",
    "dead_requeue",
    "dead_retry",
    "delete_published",
    "disable_capture",
    "enable_capture",
    "published_since",
    "relay_status",
]
