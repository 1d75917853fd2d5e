"""relay: the daemon that publishes committed outbox messages to a broker, in per-key order.

Run it with ``outbox relay --url postgresql://... --broker nats://...`` or in your own process::

    import asyncio
    from relay import Relay, RelayConfig

    config = RelayConfig.load(database_url="postgresql://app@db/app")
    asyncio.run(Relay(config, publisher).run())   # any relay.brokers.Publisher

Several relays may run on one database: each message is published once in normal operation,
message n+1 of a key never before message n, and a dead relay's work is taken over after its
lease (see docs/explanation/relay.md).
"""

from relay._admin import (
    DeadFilter,
    RelayStatus,
    dead_list,
    dead_purge,
    dead_retry,
    delete_published,
    disable_capture,
    enable_capture,
    relay_status,
)
from relay._claimcheck import ClaimCheckPublisher
from relay._config import RelayConfig, TopicPolicy
from relay._metrics import RelayMetrics
from relay._relay import Relay
from relay._replay import ReplayError, ReplayProgress, ReplayResult, replay
from relay.exceptions import (
    BrokerUnreachableError,
    NotSentError,
    PermanentPublishError,
    RelayError,
    RelayIdInUseError,
    RetryablePublishError,
)

__all__ = [
    "BrokerUnreachableError",
    "ClaimCheckPublisher",
    "DeadFilter",
    "NotSentError",
    "PermanentPublishError",
    "Relay",
    "RelayConfig",
    "RelayError",
    "RelayIdInUseError",
    "RelayMetrics",
    "RelayStatus",
    "ReplayError",
    "ReplayProgress",
    "ReplayResult",
    "RetryablePublishError",
    "TopicPolicy",
    "dead_list",
    "dead_purge",
    "dead_retry",
    "delete_published",
    "disable_capture",
    "enable_capture",
    "relay_status",
    "replay",
]
