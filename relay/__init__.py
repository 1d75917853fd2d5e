"""relay: the daemon that publishes committed outbox messages to a broker, in per-key order.

Run it with ``outbox relay --url postgresql://... --broker nats://...`` or in your own process::

    import asyncio
    from relay import Relay, RelayConfig

    config = RelayConfig.load(database_url="postgresql://app@db/app")
    asyncio.run(Relay(config, publisher).run())   # any relay.brokers.Publisher

Several relays may run on one database: each message is published once in normal operation,
message n+1 of a key never before message n, and a dead relay's work is taken over after its
lease (see docs/explanation/relay.md). The operator functions (status, dead letters,
retention, capture) are in :mod:`relay.admin`.
"""

import warnings
from typing import Any

from relay._claimcheck import ClaimCheckPublisher
from relay._config import RelayConfig, TopicPolicy
from relay._metrics import RelayMetrics
from relay._relay import Relay
from relay._replay import ReplayProgress, ReplayResult, replay
from relay.exceptions import (
    BrokerUnreachableError,
    NotSentError,
    PermanentPublishError,
    RelayError,
    RelayIdInUseError,
    ReplayError,
    RetryablePublishError,
)

__all__ = [
    "BrokerUnreachableError",
    "ClaimCheckPublisher",
    "NotSentError",
    "PermanentPublishError",
    "Relay",
    "RelayConfig",
    "RelayError",
    "RelayIdInUseError",
    "RelayMetrics",
    "ReplayError",
    "ReplayProgress",
    "ReplayResult",
    "RetryablePublishError",
    "TopicPolicy",
    "replay",
]

#: old names on ``relay`` of the functions now in :mod:`relay.admin`, kept for one release
_MOVED_TO_ADMIN = frozenset(
    {
        "DeadFilter",
        "RelayStatus",
        "dead_list",
        "dead_purge",
        "dead_retry",
        "delete_published",
        "disable_capture",
        "enable_capture",
        "relay_status",
    }
)
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    """The deprecated aliases: ``relay.dead_list`` is ``relay.admin.dead_list``, and so on."""
    if name not in _MOVED_TO_ADMIN:
        raise AttributeError(f"module 'relay' has no attribute {name!r}")
    from relay import admin

    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"relay.{name} is deprecated and will be removed in the next release: "
            f"use relay.admin.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
    return getattr(admin, name)
