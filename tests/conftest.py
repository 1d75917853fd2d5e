"""Fixtures on a real PostgreSQL (see tests/support/harness.py for how one is found).

* ``session`` / ``pg_conn``: a transaction on a shared migrated database, rolled back after the
  test. The fast default, for tests that do not need to commit.
* ``database_url``: a fresh database cloned from a migrated template, dropped after the test,
  for tests that commit, use several connections, or LISTEN/NOTIFY.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from outbox._migrate import sqlalchemy_url, upgrade
from tests.support.harness import HOW_TO, PgServer, find_server
from tests.support.services import missing


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = find_server()
    if server is None:
        missing("PostgreSQL", HOW_TO)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def template_db(pg_server: PgServer) -> Iterator[str]:
    """Name of a database with every migration applied, to clone per test."""
    name = f"outbox_tmpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = pg_server.create_database(name)
    upgrade(url)
    try:
        yield name
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def database_url(pg_server: PgServer, template_db: str) -> Iterator[str]:
    with pg_server.fresh_database(template=template_db) as url:
        yield url


@pytest.fixture
def empty_database_url(pg_server: PgServer) -> Iterator[str]:
    with pg_server.fresh_database() as url:
        yield url


@pytest.fixture(scope="session")
def shared_url(pg_server: PgServer, template_db: str) -> Iterator[str]:
    with pg_server.fresh_database(template=template_db) as url:
        yield url


@pytest.fixture(scope="session")
def shared_engine(shared_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(shared_url), poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def session(shared_engine: Engine) -> Iterator[Session]:
    """A Session whose work is rolled back after the test (it may call commit())."""
    with shared_engine.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode="create_savepoint") as s:
            yield s
        outer.rollback()


@pytest.fixture
def pg_conn(shared_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A psycopg connection in a transaction that is rolled back after the test."""
    with psycopg.connect(shared_url) as conn:
        yield conn
        conn.rollback()


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on a fresh database of its own."""
    eng = create_engine(sqlalchemy_url(database_url), pool_size=20, max_overflow=10)
    yield eng
    eng.dispose()
