"""One URL rule for every command and the relay (outbox/_dburl.py): libpq's URL, ``postgres://``,
SQLAlchemy's ``postgresql+<driver>://`` (the driver dropped), JDBC's ``jdbc:postgresql://`` and
libpq's ``key=value`` string; the Spark jobs derive their JDBC URL from the same; an error names
the flag or variable the URL came from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from outbox._dburl import libpq_url
from outbox.exceptions import ConfigurationError
from relay import RelayConfig
from spark_ingest import Source

OUTBOX = str(Path(sys.executable).with_name("outbox"))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://app@db:5432/shop", "postgresql://app@db:5432/shop"),
        ("postgres://app@db/shop", "postgresql://app@db/shop"),
        ("postgresql+psycopg://app:pw@db/shop", "postgresql://app:pw@db/shop"),
        ("postgresql+asyncpg://app@db/shop", "postgresql://app@db/shop"),
        ("jdbc:postgresql://db:5432/shop", "postgresql://db:5432/shop"),
        ("host=db dbname=shop user=app", "host=db dbname=shop user=app"),
    ],
)
def test_every_form_becomes_what_libpq_takes(given: str, expected: str) -> None:
    assert libpq_url(given, "--url") == expected
    assert RelayConfig(database_url=given).database_url == expected


@pytest.mark.parametrize("bad", ["mysql://app@db/shop", "db.example.com/shop", "sqlite:///x"])
def test_another_database_is_one_line_naming_where_it_came_from(bad: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^\$DATABASE_URL: .* is not a PostgreSQL URL"):
        libpq_url(bad, "$DATABASE_URL")


@pytest.mark.parametrize(
    "given",
    [
        "postgresql://recon@db:5432/shop?sslmode=require",
        "postgresql+psycopg://recon@db:5432/shop?sslmode=require",
        "jdbc:postgresql://db:5432/shop?user=recon&sslmode=require",
        "host=db port=5432 dbname=shop user=recon sslmode=require",
    ],
)
def test_the_spark_jobs_derive_their_jdbc_url_from_any_form(given: str) -> None:
    src = Source("outbox", given)
    assert src.jdbc_url == "jdbc:postgresql://db:5432/shop"
    assert src.login == "recon"
    assert src.parameters() == {"sslmode": "require"}


def _outbox(*argv: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL")}
    environ.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run(
        [OUTBOX, *argv], capture_output=True, text=True, timeout=60, check=False, env=environ
    )


def test_every_command_takes_sqlalchemys_url_from_the_flag_or_either_variable(
    database_url: str,
) -> None:
    params = conninfo_to_dict(database_url)
    sqlalchemy = database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    keyvalue = " ".join(f"{k}={v}" for k, v in params.items())
    for argv, env in [
        (["status", "--url", sqlalchemy], {}),
        (["status"], {"DATABASE_URL": sqlalchemy}),
        (["status"], {"OUTBOX_DATABASE_URL": keyvalue}),
        (["migrate", "current", "--url", sqlalchemy], {}),
        (["migrate", "current"], {"DATABASE_URL": sqlalchemy}),
        (["dead", "list"], {"DATABASE_URL": sqlalchemy}),
    ]:
        done = _outbox(*argv, **env)
        assert done.returncode == 0, (argv, env, done.stderr)


def test_a_connection_error_names_the_variable_the_url_came_from(database_url: str) -> None:
    missing = database_url.rsplit("/", 1)[0] + "/no_such_database_i39"
    done = _outbox("status", DATABASE_URL=missing.replace("postgresql:", "postgresql+psycopg:"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert 'database "no_such_database_i39" does not exist' in line
    assert "check the database name in $DATABASE_URL" in line
    done = _outbox("status", "--url", "mysql://app@db/shop")
    assert done.stderr.strip() == (
        "error: --url: 'mysql://***@db/shop' is not a PostgreSQL URL (scheme 'mysql'): use "
        "postgresql://user@host:5432/dbname (also postgres://, postgresql+psycopg://, "
        "jdbc:postgresql://) or a libpq string 'host=... dbname=...'"
    )
