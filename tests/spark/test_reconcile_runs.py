"""In-flight rows, re-runs, the CLI's exit codes, and clear errors for bad sources."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from outbox.cli import main
from outbox.exceptions import ConfigurationError
from spark_ingest import JobConfig, Source, SourceError, Window, find_jdbc_jar, reconcile
from spark_ingest._errors import JdbcDriverNotFoundError
from tests.spark.spark_plant import Msg, insert_inbox, insert_outbox, new_id
from tests.support.services import missing

H = dt.timedelta(hours=1)


def _delivered(outbox: str, inbox: str, at: dt.datetime, n: int = 2) -> list[str]:
    msgs = [Msg(new_id(), "orders", f"k{i}", 1, "published", at, at) for i in range(n)]
    insert_outbox(outbox, *msgs)
    for m in msgs:
        insert_inbox(inbox, "billing", m.id, m.topic, m.key, 1, at + dt.timedelta(seconds=2))
    return [m.id for m in msgs]


def test_reconcile_never_judges_rows_of_transactions_open_at_start(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    t = now - 5 * H
    _delivered(database_url, inbox_urls[0], t)
    with psycopg.connect(database_url) as open_tx:
        # An open transaction holding an xid, with a row that looks lost...
        open_tx.execute("SELECT pg_current_xact_id()")
        insert_sql = (
            "INSERT INTO outbox_messages (id, topic, key, seq, payload, created_at, status, "
            "published_at) VALUES (%s, 'orders', %s, 1, '\\x00', %s, 'published', %s)"
        )
        open_tx.execute(insert_sql, (new_id(), "open", t, t))
        # ...and a later transaction that committed: visible, but above the horizon.
        with psycopg.connect(database_url) as later:
            later.execute(insert_sql, (new_id(), "later", t, t))
        config = JobConfig(
            outbox=Source("outbox", database_url),
            inboxes=(Source("billing", inbox_urls[0]),),
            subscriptions={"orders": ("billing",)},
            window=Window(now - 10 * H, now - 2 * H),
        )
        first = reconcile(spark, config, tmp_path)
        second = reconcile(spark, config, tmp_path)
        open_tx.rollback()
    assert first.summary["counts"]["lost"] == 0
    assert first.summary["messages"] == 2
    assert first.summary["deferred_in_flight"] == 1
    assert first.exit_code == 0
    # A re-run over the same data reports the same thing and records a second run.
    assert second.summary["counts"] == first.summary["counts"]
    assert second.run_id != first.run_id
    with psycopg.connect(database_url) as conn:
        runs = conn.execute("SELECT count(*) FROM outbox_reconciliation_runs").fetchone()
    assert runs == (2,)


def test_cli_reconcile_exits_zero_when_clean_and_one_after_a_loss(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    _delivered(database_url, inbox_urls[0], now - 5 * H)
    args = [
        "reconcile",
        "--outbox", database_url,
        "--inbox", inbox_urls[0],
        "--subscribe", "orders=billing",
        "--since", (now - 10 * H).isoformat(),
        "--until", (now - 2 * H).isoformat(),
        "--output", str(tmp_path),
    ]  # fmt: skip
    clean = CliRunner().invoke(main, args)
    assert clean.exit_code == 0, clean.output
    assert "outcome: OK" in clean.output
    lost = Msg(new_id(), "orders", "gone", 1, "published", now - 4 * H, now - 4 * H)
    insert_outbox(database_url, lost)
    dirty = CliRunner().invoke(main, [*args, "--json"])
    assert dirty.exit_code == 1, dirty.output
    assert '"lost": 1' in dirty.output
    runs = sorted(p for p in tmp_path.iterdir() if (p / "redrive.txt").exists())
    assert [p.joinpath("redrive.txt").read_text() for p in runs].count(f"{lost.id}\n") == 1


def _config(outbox: Source, inbox: Source) -> JobConfig:
    now = dt.datetime.now(dt.UTC)
    return JobConfig(
        outbox=outbox,
        inboxes=(inbox,),
        subscriptions={"orders": ("billing",)},
        window=Window(now - 2 * H, now),
    )


def test_reconcile_bad_jdbc_url_is_a_clear_error(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    bad = Source("outbox", "jdbc:postgresql://127.0.0.1:1/nowhere")
    with pytest.raises(SourceError, match=r"cannot connect to 127\.0\.0\.1:1/nowhere"):
        reconcile(spark, _config(bad, Source("billing", database_url)), tmp_path)
    with pytest.raises(ConfigurationError, match="expected jdbc:postgresql://"):
        Source("outbox", "jdbc:mysql://127.0.0.1/db")
    with pytest.raises(ConfigurationError, match="not in the URL"):
        Source("outbox", "postgresql://u:secret@127.0.0.1/db")


def test_reconcile_missing_table_is_a_clear_error(
    spark: Any, database_url: str, empty_database_url: str, tmp_path: Path
) -> None:
    config = _config(Source("outbox", database_url), Source("billing", empty_database_url))
    with pytest.raises(SourceError, match=r"inbox_messages.* does not exist.*outbox migrate"):
        reconcile(spark, config, tmp_path)


def test_missing_jdbc_jar_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(JdbcDriverNotFoundError, match="apt-get install libpostgresql-jdbc-java"):
        find_jdbc_jar(str(tmp_path / "nope.jar"))


# --- wrong password: the shared server trusts 127.0.0.1, so start a private scram one -------


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture
def scram_server() -> Iterator[str]:
    """A private PostgreSQL (started and stopped here) that checks passwords."""
    bindir = Path("/usr/lib/postgresql/15/bin")
    if not (bindir / "initdb").exists() or (os.geteuid() == 0 and not shutil.which("runuser")):
        missing(
            "PostgreSQL 15 server binaries",
            "apt-get install postgresql-15 (to start a password-checking server)",
        )
    base = Path(tempfile.mkdtemp(prefix="outbox-scram-"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    pwfile = base / "pw"
    pwfile.write_text("admin-secret\n")
    os.chmod(pwfile, 0o644)
    data = base / "data"
    subprocess.run(
        _as_postgres([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A",
                      "scram-sha-256", f"--pwfile={pwfile}", "--no-sync"]),
        check=True, capture_output=True,
    )  # fmt: skip
    ctl = [str(bindir / "pg_ctl"), "-D", str(data), "-w"]
    for attempt in range(3):  # a free port can be taken between the probe and the start
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        opts = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
        started = subprocess.run(
            _as_postgres([*ctl, "-o", opts, "-l", str(base / "log"), "start"]),
            capture_output=True,
        )
        if started.returncode == 0:
            break
        log = (base / "log").read_text(errors="replace")[-2000:]
        if attempt == 2:
            raise RuntimeError(f"the private scram PostgreSQL did not start: {log}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres([*ctl, "-m", "fast", "stop"]), capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_reconcile_wrong_password_is_a_clear_error_without_the_password(
    spark: Any, scram_server: str, database_url: str, tmp_path: Path, monkeypatch: Any
) -> None:
    with psycopg.connect(scram_server, password="admin-secret", autocommit=True) as conn:
        conn.execute("CREATE ROLE recon LOGIN PASSWORD 'right-one'")
    url = scram_server.replace("postgres@", "recon@")
    monkeypatch.setenv("RECON_PW", "wrong-one-s3cr3t")
    outbox = Source("outbox", url, password_env="RECON_PW")
    start = time.monotonic()
    with pytest.raises(SourceError, match="password authentication failed") as err:
        reconcile(spark, _config(outbox, Source("billing", database_url)), tmp_path)
    assert "s3cr3t" not in str(err.value)
    assert "s3cr3t" not in repr(outbox)
    assert time.monotonic() - start < 30
    monkeypatch.setenv("RECON_PW", "right-one")  # right password: now it is the table
    with pytest.raises(SourceError, match="does not exist"):
        reconcile(spark, _config(outbox, Source("billing", database_url)), tmp_path)
    with psycopg.connect(scram_server, password="admin-secret", autocommit=True) as conn:
        conn.execute("DROP ROLE recon")
