"""``outbox status --config FILE`` for a relay serving many databases: one line per database.

Each database is asked what ``outbox status`` asks it (relay/_admin.py ``relay_status``), a few
at a time and each within a connect timeout: one that does not answer is a line saying so, and
the others are still shown.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from outbox.kit import redact
from relay._admin import relay_status
from relay._fleet_config import FleetConfig, database_error_line

__all__ = ["fleet_status"]

#: databases asked at once
_AT_ONCE = 8


def fleet_status(fleet: FleetConfig, *, connect_timeout: float = 10.0) -> list[dict[str, Any]]:
    """Per database of the list, in its order: ``name``, ``error`` (None when it answered),
    its ``pending``, ``leased``, ``dead`` rows, ``oldest_pending_s``, the ``relays`` live on
    it and its ``capture`` mode."""

    def one(name: str) -> dict[str, Any]:
        config = fleet.configs[name]
        url = make_conninfo(config.database_url, connect_timeout=max(1, int(connect_timeout)))
        try:
            status = relay_status(url, schema=config.schema)
        except psycopg.Error as exc:
            said = database_error_line(exc)
            return {"name": name, "error": said}
        except Exception as exc:  # the library's errors (tables missing, ...): one line
            return {"name": name, "error": " ".join(redact(str(exc)).split())}
        topics = status.topics
        ages = [t["oldest_pending_s"] for t in topics if t["oldest_pending_s"] is not None]
        return {
            "name": name,
            "error": None,
            "pending": sum(t["pending"] for t in topics),
            "leased": sum(t["leased"] for t in topics),
            "dead": sum(t["dead"] for t in topics),
            "oldest_pending_s": max(ages) if ages else None,
            "relays": len(status.relays),
            "capture": status.capture.get("mode") or "polling",
        }

    names = [e.name for e in fleet.databases]
    with ThreadPoolExecutor(max_workers=_AT_ONCE) as pool:
        return list(pool.map(one, names))
