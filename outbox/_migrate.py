"""Running the shipped Alembic revisions, standalone or from an application's Alembic env."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from importlib import resources

from alembic import command
from alembic.config import Config
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Connection, create_engine, make_url
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from outbox._redact import redact
from outbox._statements import migrate_statements
from outbox.exceptions import ConfigurationError
from outbox.schema import check_identifier

#: Standalone runs keep their own version table, so they never touch the app's alembic_version.
VERSION_TABLE = "outbox_alembic_version"


def sqlalchemy_url(dsn: str) -> URL:
    """Turn a libpq-style ``postgresql://`` URL into SQLAlchemy's psycopg 3 URL."""
    try:
        url = _from_conninfo(dsn) if "://" not in dsn and "=" in dsn else make_url(dsn)
    except Exception as exc:
        raise ConfigurationError(
            f"invalid database URL {redact(dsn)!r}: expected postgresql://user@host:port/dbname "
            "or a conninfo string 'host=... dbname=...'",
            url=redact(dsn),
        ) from exc
    if url.get_backend_name() != "postgresql":
        raise ConfigurationError(
            f"unsupported database {url.get_backend_name()!r}: outbox-inbox needs PostgreSQL "
            "(postgresql://...)",
            url=url.render_as_string(hide_password=True),
        )
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def _from_conninfo(dsn: str) -> URL:
    """A libpq conninfo string (``host=db dbname=app``) as SQLAlchemy's URL, so ``migrate``
    takes what the other commands take."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    port = params.pop("port", None)
    return URL.create(
        "postgresql+psycopg",
        username=params.pop("user", None),
        password=params.pop("password", None),
        host=params.pop("host", None),
        port=int(port) if port else None,
        database=params.pop("dbname", None),
        query=params,
    )


def configured_schema(config: Config | None) -> str | None:
    """The schema our tables live in, from ``config.attributes`` or an ``[outbox]`` ini section."""
    if config is None:
        return None
    schema = config.attributes.get("outbox.schema")
    if schema is None and config.file_config.has_section("outbox"):
        schema = config.get_section_option("outbox", "schema")
    return check_identifier(schema) if schema else None


def alembic_config(
    url: str | None = None,
    *,
    schema: str | None = None,
    connection: Connection | None = None,
) -> Config:
    """An Alembic Config for the standalone runner (own env.py and version table)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("outbox_migrations")))
    cfg.set_main_option("version_table", VERSION_TABLE)
    if url is not None:
        cfg.set_main_option(
            "sqlalchemy.url",
            sqlalchemy_url(url).render_as_string(hide_password=False).replace("%", "%%"),
        )
    if schema is not None:
        cfg.attributes["outbox.schema"] = check_identifier(schema)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@contextmanager
def _connected(url: str) -> Iterator[Connection]:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def upgrade(url: str, *, schema: str | None = None, revision: str = "heads") -> None:
    """Upgrade the outbox tables to ``revision`` (default: the newest)."""
    with _connected(url) as conn:
        command.upgrade(alembic_config(schema=schema, connection=conn), revision)


def downgrade(url: str, revision: str, *, schema: str | None = None) -> None:
    """Downgrade the outbox tables to ``revision`` (``base`` removes them, and the runner's
    version table with them: nothing of ours is left)."""
    with _connected(url) as conn:
        command.downgrade(alembic_config(schema=schema, connection=conn), revision)
        stmts = migrate_statements(schema)
        left = conn.exec_driver_sql(stmts.version_rows.decode()).scalar()
        if not left:  # at base: Alembic leaves its version table behind, empty
            conn.exec_driver_sql(stmts.drop_version_table.decode())


def current(url: str, *, schema: str | None = None) -> str:
    """The applied revision(s), as Alembic prints them."""
    out = io.StringIO()
    with _connected(url) as conn, redirect_stdout(out):
        cfg = alembic_config(schema=schema, connection=conn)
        cfg.stdout = out
        command.current(cfg)
    return out.getvalue().strip()


def schemas_with_tables(url: str) -> list[str]:
    """The schemas holding a version table of this runner (where ``upgrade --schema`` put
    the tables): what ``migrate current`` suggests when it finds none where it looked."""
    with _connected(url) as conn:
        rows = conn.exec_driver_sql(
            migrate_statements(None).version_schemas.decode(), {"table": VERSION_TABLE}
        )
        return [str(r[0]) for r in rows]


def sql(
    revision: str = "heads", *, schema: str | None = None, from_revision: str | None = None
) -> str:
    """The DDL of an upgrade as SQL text (offline mode), for DBAs who apply it themselves."""
    out = io.StringIO()
    cfg = alembic_config(url="postgresql://offline/db", schema=schema)
    cfg.output_buffer = out
    target = f"{from_revision}:{revision}" if from_revision else revision
    command.upgrade(cfg, target, sql=True)
    return out.getvalue()
