"""A relay id names one live process: a second one is refused, and a shutdown gives back only
the shutting-down process's own claims (two processes with one id released each other's
in-flight leases, and overwrote each other's registration)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from relay import Relay, RelayIdInUseError
from tests.relay.relay_helpers import FakePublisher, await_for, config, running, write

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _registration(url: str, relay_id: str) -> tuple[str, int] | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT hostname, pid FROM outbox_relays WHERE relay_id = %s", (relay_id,)
        ).fetchone()
    return None if row is None else (row[0], row[1])


def _register_other(url: str, relay_id: str, *, heartbeat_age: float = 0.0) -> None:
    """A row as another relay process (another host) writes it."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO outbox_relays (relay_id, hostname, pid, config, heartbeat_at) VALUES "
            "(%s, 'other-host', 4242, '{\"instance\": \"other\"}', "
            "clock_timestamp() - %s * interval '1 second')",
            (relay_id, heartbeat_age),
        )


def test_relay_with_the_id_of_a_live_relay_refuses_to_start(url: str) -> None:
    first = Relay(config(url, relay_id="fixed"), FakePublisher())
    second = Relay(config(url, relay_id="fixed"), FakePublisher())

    async def go() -> None:
        async with running(first):
            await await_for(lambda: _registration(url, "fixed") is not None, what="registered")
            mine = _registration(url, "fixed")
            with pytest.raises(RelayIdInUseError) as caught:
                await asyncio.wait_for(second.run(), 10)
            assert _registration(url, "fixed") == mine  # not overwritten, not unregistered
            # the first relay still works
            await asyncio.to_thread(write, url, [("t", "k")])
            await await_for(lambda: len(first.publisher.log) == 1, what="published")  # type: ignore[attr-defined]
        message = str(caught.value)
        assert "relay id 'fixed' is in use by a live relay" in message
        assert "give every relay process its own id" in message

    asyncio.run(go())


def test_relay_takes_over_the_id_of_a_relay_whose_heartbeat_lapsed(url: str) -> None:
    _register_other(url, "fixed", heartbeat_age=3600)
    relay = Relay(config(url, relay_id="fixed"), FakePublisher())

    async def go() -> None:
        async with running(relay):
            await await_for(
                lambda: (_registration(url, "fixed") or ("",))[0] != "other-host",
                what="the stale registration taken over",
            )

    asyncio.run(go())
    assert _registration(url, "fixed") is None  # unregistered at its clean stop


def test_relay_shutdown_releases_only_its_own_claims(url: str) -> None:
    # Rows leased under the same relay id by another process (its claim token): a shutdown
    # that released by owner gave them back while that process was still publishing them.
    publisher = FakePublisher()
    publisher.delay = 60  # stuck in the broker call until the shutdown cancels it
    relay = Relay(config(url, relay_id="fixed", shutdown_timeout=0.5), publisher)
    write(url, [("t", "mine")])

    def leased() -> dict[str, str | None]:
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT key, lease_owner FROM outbox_messages").fetchall()
        return dict(rows)

    async def go() -> None:
        async with running(relay):
            await await_for(lambda: leased() == {"mine": "fixed"}, what="claimed")
            await asyncio.to_thread(write, url, [("t", "theirs")])
            # in outbox_messages once this relay's ledger reader recorded it
            await await_for(lambda: "theirs" in leased(), what="recorded")
            with psycopg.connect(url) as conn:  # the other process's claim
                conn.execute(
                    "UPDATE outbox_messages SET lease_owner = 'fixed', lease_token = %s, "
                    "lease_until = clock_timestamp() + interval '1 minute', attempts = 1 "
                    "WHERE key = 'theirs'",
                    (uuid.uuid4(),),
                )

    asyncio.run(go())
    assert leased() == {"mine": None, "theirs": "fixed"}


def test_cli_relay_with_an_id_in_use_fails_with_one_clear_line(url: str) -> None:
    _register_other(url, "fixed")
    done = subprocess.run(
        [OUTBOX, "relay", "--url", url, "--broker", "memory:", "--relay-id", "fixed"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: relay id 'fixed' is in use by a live relay (host other-host, pid 4242,"
    )
    assert _registration(url, "fixed") == ("other-host", 4242)
