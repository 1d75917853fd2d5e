"""Helpers of the console tests: the console served for real, seeded data, a logged-in client."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from outbox import Message, publish_batch
from tests.support.ledger import record
from tests.support.server_process import free_port
from tests.support.services import import_or_missing

TOKEN = "console-test-token-0123456789"
#: a DNS name the browser resolves to 127.0.0.1, as an attacker's name would after a rebinding
REBOUND = "rebound.example"


@contextmanager
def serve(url: str, **options: Any) -> Iterator[str]:
    """The console at ``url``'s database, until the block ends; yields its base URL."""
    uvicorn: Any = import_or_missing("uvicorn", "console")
    from outbox_console import create_app

    app = create_app(url, sample_seconds=1.0, **options)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the console did not start")
        time.sleep(0.02)  # uvicorn sets `started`; there is nothing to wait on
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)


def seed(url: str) -> dict[str, list[Any]]:
    """Messages on two topics; some dead with different errors. Returns the dead ids by kind."""
    with psycopg.connect(url) as conn:
        ids = publish_batch(conn, [
            Message(topic="orders", key="o-1", payload={"n": 1}, headers={"tenant": "acme"}),
            Message(topic="orders", key="o-1", payload={"n": 2}),
            Message(topic="orders", key="o-2", payload={"n": 3}),
            Message(topic="payments", key="p-1", payload={"amount": "9.99"}),
            Message(topic="payments", key="p-2", payload={"amount": "1.00"}),
        ])  # fmt: skip
        conn.commit()
        record(url)  # no relay runs: number and record what the ledger holds
        dead = {"too_large": [ids[0], ids[1]], "timeout": [ids[3]]}
        conn.execute(
            "UPDATE outbox_messages SET status = 'dead', attempts = 5, last_error = %s "
            "WHERE id = ANY(%s)",
            ("PermanentPublishError: payload too large", dead["too_large"]),
        )
        conn.execute(
            "UPDATE outbox_messages SET status = 'dead', attempts = 3, last_error = %s "
            "WHERE id = ANY(%s)",
            ("RetryablePublishError: no PubAck within 8 s (timeout)", dead["timeout"]),
        )
        conn.commit()
    return {**dead, "all": ids}


def csrf_of(page: str) -> str:
    """The CSRF token a page's forms carry."""
    return page.split('name="csrf" value="')[1].split('"')[0]


def http_login(client: Any, name: str = "carol", token: str = TOKEN) -> str:
    """Log ``client`` (an httpx.Client on the console) in; returns the session's CSRF token."""
    client.post("/login", data={"csrf": csrf_of(client.get("/login").text), "operator": name,
                                "token": token})  # fmt: skip
    page = client.get("/dead")
    assert page.status_code == 200, page.text
    return csrf_of(page.text)


def screenshot(driver: Any, name: str) -> None:
    """Save a screenshot for the docs when OUTBOX_CONSOLE_SCREENSHOTS names a directory."""
    directory = os.environ.get("OUTBOX_CONSOLE_SCREENSHOTS")
    if directory:
        driver.save_screenshot(os.path.join(directory, f"console-{name}.png"))
