"""WAL capture tests run on a private PostgreSQL cluster with wal_level = logical (started here,
on a free port, stopped by its pid at the end); the machine's server is never reconfigured."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from outbox._migrate import upgrade
from relay.admin import enable_capture
from tests.support.harness import LOGICAL_HOW_TO, PgServer, logical_server
from tests.support.services import missing


@pytest.fixture(scope="session")
def logical_pg() -> Iterator[PgServer]:
    with tempfile.TemporaryDirectory(prefix="outbox-logical-") as workdir:
        try:
            server = logical_server(workdir)
        except (OSError, RuntimeError) as exc:
            missing("PostgreSQL with wal_level = logical", f"{exc}; {LOGICAL_HOW_TO}")
        if server is None:
            missing("PostgreSQL with wal_level = logical", LOGICAL_HOW_TO)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def wal_url(logical_pg: PgServer) -> Iterator[str]:
    """A fresh migrated database in 'wal' mode with a slot of its own (slots are per cluster)."""
    name = f"outbox_w_{uuid.uuid4().hex[:10]}"
    url = logical_pg.create_database(name)
    upgrade(url)
    slot = f"outbox_{uuid.uuid4().hex[:10]}"
    enable_capture(url, slot=slot)
    try:
        yield url
    finally:
        with psycopg.connect(logical_pg.admin_url, autocommit=True) as conn:
            with contextlib.suppress(psycopg.Error):
                conn.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND active_pid IS NOT NULL",
                    (slot,),
                )
            for _ in range(50):
                try:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    break
                except psycopg.errors.ObjectInUse:  # the terminated walsender is exiting
                    conn.execute("SELECT pg_sleep(0.1)")
                except psycopg.errors.UndefinedObject:  # the test dropped it itself
                    break
        logical_pg.drop_database(name)
