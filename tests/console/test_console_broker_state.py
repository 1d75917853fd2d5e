"""The console's overview shows whether each relay reaches its broker, since when, and why
not (the reason masked like every other text the relay wrote)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg

from tests.console.console_helpers import seed


def test_the_overview_shows_a_relays_unreachable_broker_and_since_when(
    database_url: str, console: Any
) -> None:
    import httpx

    seed(database_url)
    secret = "s3cr3t-" + uuid.uuid4().hex[:8]
    rows = {
        "relay-down": {
            "broker": "nats://nats-1:4222",
            "broker_reachable": False,
            "broker_since": "2026-11-28T09:00:00Z",
            "broker_error": f"cannot connect to NATS at nats://relay:{secret}@nats-1:4222: "
            "ConnectionRefusedError",
        },
        "relay-up": {
            "broker": "nats://nats-2:4222",
            "broker_reachable": True,
            "broker_since": "2026-11-28T08:00:00Z",
            "broker_error": None,
        },
    }
    with psycopg.connect(database_url) as conn:
        for relay_id, config in rows.items():
            conn.execute(
                "INSERT INTO outbox_relays (relay_id, hostname, pid, config) "
                "VALUES (%s, 'host-a', 4242, %s::jsonb)",
                (relay_id, json.dumps(config)),
            )
    with console(database_url) as base, httpx.Client(base_url=base) as client:
        page = client.get("/")
    assert page.status_code == 200, page.text
    table = page.text.split('id="relays"', 1)[1].split("</table>", 1)[0]
    down = table.split("relay-down", 1)[1].split("</tr>", 1)[0]
    up = table.split("relay-up", 1)[1].split("</tr>", 1)[0]
    assert "UNREACHABLE since 2026-11-28T09:00:00Z" in down
    assert "ConnectionRefusedError" in down
    assert "reachable since 2026-11-28T08:00:00Z" in up
    assert secret not in page.text
