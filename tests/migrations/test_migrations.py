"""The shipped Alembic revisions: exact match with the declared metadata, a real downgrade,
the standalone runner, an application's own Alembic environment, and the wheel's contents."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from click.testing import CliRunner

from outbox._migrate import current, downgrade, sql, sqlalchemy_url, upgrade
from outbox.cli import main
from tests.support.schema import assert_schema_matches

REPO = Path(__file__).resolve().parents[2]


def _tables(url: str, schema: str = "public") -> set[str]:
    with psycopg.connect(url) as conn:
        return {
            r[0]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", [schema])
        }


@pytest.mark.parametrize("schema", [None, "messaging"])
def test_upgrade_head_matches_declared_metadata_exactly(
    empty_database_url: str, schema: str | None
) -> None:
    upgrade(empty_database_url, schema=schema)
    assert_schema_matches(empty_database_url, schema)


def test_upgrade_downgrade_upgrade_round_trip(empty_database_url: str) -> None:
    url = empty_database_url
    upgrade(url, schema="messaging")
    ours = {"outbox_messages", "outbox_key_sequences", "inbox_messages", "inbox_key_positions"}
    assert ours <= _tables(url, "messaging")
    assert "(head)" in current(url, schema="messaging")
    downgrade(url, "base", schema="messaging")
    assert _tables(url, "messaging") & ours == set()
    upgrade(url, schema="messaging")
    assert ours <= _tables(url, "messaging")
    assert_schema_matches(url, "messaging")


def test_cli_migrate_commands(empty_database_url: str) -> None:
    runner = CliRunner()
    up = runner.invoke(main, ["migrate", "upgrade", "--url", empty_database_url])
    assert up.exit_code == 0, up.output
    cur = runner.invoke(main, ["migrate", "current", "--url", empty_database_url])
    assert "(head)" in cur.output
    down = runner.invoke(main, ["migrate", "downgrade", "base", "--url", empty_database_url])
    assert down.exit_code == 0, down.output
    assert "outbox_messages" not in _tables(empty_database_url)


def test_cli_migrate_without_url_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTBOX_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    result = CliRunner().invoke(main, ["migrate", "upgrade"])
    assert result.exit_code == 2
    assert "OUTBOX_DATABASE_URL" in result.output


def test_cli_bad_schema_name_is_a_clear_error(empty_database_url: str) -> None:
    result = CliRunner().invoke(
        main, ["migrate", "upgrade", "--url", empty_database_url, "--schema", "Drop Table"]
    )
    assert result.exit_code == 2
    assert "invalid schema name 'Drop Table'" in result.output


def test_offline_sql_has_the_ddl() -> None:
    text = sql(schema="messaging")
    assert "CREATE SCHEMA IF NOT EXISTS messaging" in text
    assert "CREATE TABLE messaging.outbox_messages" in text
    assert "WHERE status = 'pending'" in text
    assert "INSERT INTO messaging.outbox_alembic_version" in text


APP_ENV = """
from alembic import context
from sqlalchemy import MetaData, Table, Column, Integer, create_engine
from sqlalchemy.pool import NullPool
import outbox

app_metadata = MetaData()
Table("users", app_metadata, Column("id", Integer, primary_key=True))
target_metadata = [app_metadata, outbox.make_metadata()]

engine = create_engine(context.config.get_main_option("sqlalchemy.url"), poolclass=NullPool)
with engine.begin() as conn:
    context.configure(connection=conn, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""

APP_REVISION = """
from alembic import op
import sqlalchemy as sa

revision = "app_0001"
down_revision = None
branch_labels = ("app",)
depends_on = None

def upgrade():
    op.create_table("users", sa.Column("id", sa.Integer(), primary_key=True))

def downgrade():
    op.drop_table("users")
"""


def test_inside_an_application_alembic_env(empty_database_url: str, tmp_path: Path) -> None:
    (tmp_path / "versions").mkdir()
    (tmp_path / "env.py").write_text(textwrap.dedent(APP_ENV))
    (tmp_path / "versions" / "app_0001.py").write_text(textwrap.dedent(APP_REVISION))
    url = sqlalchemy_url(empty_database_url).render_as_string(hide_password=False)
    cfg = Config()
    cfg.set_main_option("script_location", str(tmp_path))
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("version_locations", f"{tmp_path / 'versions'} outbox_migrations:versions")
    cfg.set_main_option("sqlalchemy.url", url)
    command.upgrade(cfg, "heads")
    assert {"users", "outbox_messages", "inbox_messages"} <= _tables(empty_database_url)
    command.check(cfg)  # autogenerate proposes nothing: no drop of our tables
    command.downgrade(cfg, "outbox@base")
    assert "outbox_messages" not in _tables(empty_database_url)
    assert "users" in _tables(empty_database_url)


def test_wheel_ships_migrations(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = tmp_path.glob("outbox_inbox-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "outbox_migrations/env.py",
        "outbox_migrations/script.py.mako",
        "outbox_migrations/versions/outbox_0001_initial.py",
        "outbox/py.typed",
    } <= names
