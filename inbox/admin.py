"""Operator functions of the inbox: keys that wait, held dead messages, retention.

The consumer API (``receive``, the runners, the broker consumers) lives in :mod:`inbox`; what
an operator runs against an inbox database (the ``outbox inbox ...`` commands, a cron job, the
console) lives here::

    from inbox.admin import HeldFilter, dead_retry, held_keys, purge_finished

``purge_finished`` deletes finished records past a retention window; ``dead_purge`` discards
the dead messages that hold their keys. They used to be ``inbox.purge`` and
``inbox.dead_purge``; the old names on :mod:`inbox` still work for one release and warn.
"""

from __future__ import annotations

from inbox._activity import ConsumerActivity, consumer_activity
from inbox._blocked import BlockedKey, blocked_keys
from inbox._dead import HeldFilter, HeldKey, dead_audit, dead_purge, dead_retry, held_keys
from inbox._partition_status import PartitionLease, partition_leases
from inbox._retention import purge as purge_finished

__all__ = [
    "BlockedKey",
    "ConsumerActivity",
    "HeldFilter",
    "HeldKey",
    "PartitionLease",
    "blocked_keys",
    "consumer_activity",
    "dead_audit",
    "dead_purge",
    "dead_retry",
    "held_keys",
    "partition_leases",
    "purge_finished",
]
