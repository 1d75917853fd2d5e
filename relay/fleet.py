"""One relay process for many databases (a database per tenant).

``outbox relay --config FILE`` with ``[[databases]]`` tables in FILE runs a :class:`Fleet`: one
:class:`~relay.Relay` per database under one supervisor, sharing the broker connection and a
cap on concurrent database work. In your own process::

    import asyncio
    from relay.fleet import Fleet, load_fleet

    config = load_fleet("relay.toml")        # None when the file lists no databases
    asyncio.run(Fleet(config, publisher).run())

See docs/how-to/tenants.md.
"""

from relay._fleet import Fleet, FleetMetrics, SharedPublisher
from relay._fleet_config import (
    OVERRIDABLE,
    DatabaseEntry,
    FleetConfig,
    FleetSettings,
    database_config,
    load_fleet,
)
from relay._fleet_status import fleet_status

__all__ = [
    "OVERRIDABLE",
    "DatabaseEntry",
    "Fleet",
    "FleetConfig",
    "FleetMetrics",
    "FleetSettings",
    "SharedPublisher",
    "database_config",
    "fleet_status",
    "load_fleet",
]
