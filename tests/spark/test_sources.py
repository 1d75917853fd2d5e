"""Reading the sources on real Spark and PostgreSQL: what an unreadable table says, and
inbox rows stamped by a clock behind the outbox's."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from spark_ingest import JobConfig, Source, SourceError, Window, reconcile
from tests.spark.spark_plant import Msg, insert_inbox, insert_outbox, new_id
from tests.support.harness import PgServer

H = dt.timedelta(hours=1)
S = dt.timedelta(seconds=1)


@pytest.fixture
def role_without_select(pg_server: PgServer) -> Iterator[str]:
    """A login role of its own (unique name) granted nothing: it may connect, not SELECT."""
    name = f"recon_nosel_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@contextlib.contextmanager
def _horizon_granted(url: str, role: str) -> Iterator[None]:
    """EXECUTE on the horizon's function (outbox_0018), what `grants --reconcile` gives first;
    revoked after, so that the role can be dropped."""
    statement = "{} EXECUTE ON FUNCTION outbox_oldest_xact_start() {} {}"
    with psycopg.connect(url, autocommit=True) as conn:
        who = sql.Identifier(role)
        conn.execute(sql.SQL(statement).format(sql.SQL("GRANT"), sql.SQL("TO"), who))
        try:
            yield
        finally:
            conn.execute(sql.SQL(statement).format(sql.SQL("REVOKE"), sql.SQL("FROM"), who))


def test_reconcile_inbox_without_the_horizon_function_names_it_and_the_grants(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], role_without_select: str
) -> None:
    now = dt.datetime.now(dt.UTC)
    config = JobConfig(
        outbox=Source("outbox", database_url),
        inboxes=(Source("billing", inbox_urls[0], user=role_without_select),),
        subscriptions={"orders": ("billing",)},
        window=Window(now - 2 * H, now),
    )
    with pytest.raises(SourceError) as err:
        reconcile(spark, config, record=False)
    message = str(err.value)
    assert "permission denied for function outbox_oldest_xact_start" in message
    assert f"as {role_without_select}" in message
    assert f"outbox migrate grants --reconcile {role_without_select} --apply" in message
    assert err.value.source == "billing"


def test_reconcile_inbox_without_select_names_the_server_error_and_the_user(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], role_without_select: str
) -> None:
    now = dt.datetime.now(dt.UTC)
    config = JobConfig(
        outbox=Source("outbox", database_url),
        inboxes=(Source("billing", inbox_urls[0], user=role_without_select),),
        subscriptions={"orders": ("billing",)},
        window=Window(now - 2 * H, now),
    )
    # SELECT is all it lacks
    with _horizon_granted(inbox_urls[0], role_without_select), pytest.raises(SourceError) as err:
        reconcile(spark, config, record=False)
    message = str(err.value)
    assert "permission denied for table inbox_messages" in message
    assert f"as {role_without_select}" in message
    assert f'GRANT SELECT ON "inbox_messages" TO {role_without_select}' in message
    assert "An error occurred while calling" not in message
    assert err.value.source == "billing"


def test_reconcile_counts_a_delivery_stamped_by_an_inbox_clock_behind_the_outbox(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    start, end = now - 10 * H, now - 2 * H
    inbox = inbox_urls[0]
    # Created 0.5 s after the window start on the outbox clock; the inbox clock is 1 s behind,
    # so its delivery is stamped 0.4 s before the start.
    skewed = Msg(new_id(), "orders", "skewed", 1, "published", start + S / 2, start + S / 2)
    # Created before the window, delivered just before it: not this run's to judge.
    before = Msg(new_id(), "orders", "before", 1, "published", start - H / 2, start - H / 2)
    insert_outbox(database_url, skewed, before)
    insert_inbox(inbox, "billing", skewed.id, "orders", "skewed", 1, start - S * 0.4)
    insert_inbox(inbox, "billing", before.id, "orders", "before", 1, start - H / 4)
    # Rows of no outbox message: in the margin they are not this window's phantoms; inside it,
    # one still is.
    insert_inbox(inbox, "billing", new_id(), "orders", "nowhere", 1, start - 10 * S)
    phantom = new_id()
    insert_inbox(inbox, "billing", phantom, "orders", "phantom", 1, start + H)
    config = JobConfig(
        outbox=Source("outbox", database_url),
        inboxes=(Source("billing", inbox),),
        subscriptions={"orders": ("billing",)},
        window=Window(start, end),
        thresholds={"phantom": 1},
    )
    result = reconcile(spark, config, tmp_path, record=False)
    counts = result.summary["counts"]
    assert counts["lost"] == 0, result.details
    assert counts["delivered"] == 1
    assert counts["phantom"] == 1
    assert [d["id"] for d in result.details if d["kind"] == "phantom"] == [phantom]
    assert result.lost_ids == []


def _libpq_source(database_url: str, query: str) -> Source:
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    url = f"postgresql://{info['host']}:{info.get('port', 5432)}/{info['dbname']}?{query}"
    return Source("outbox", url, user=str(info["user"]))


@pytest.mark.parametrize("mode", ["disable", "prefer"])
def test_the_sslmode_of_a_source_reaches_its_psycopg_connection(
    database_url: str, mode: str
) -> None:
    from spark_ingest._sources import connect

    with connect(_libpq_source(database_url, f"sslmode={mode}&application_name=recon")) as conn:
        used = {o.keyword: o.val for o in conn.pgconn.info}  # libpq's, defaults included
        assert used[b"sslmode"] == mode.encode()
        row = conn.execute("SELECT application_name FROM pg_stat_activity "
                           "WHERE pid = pg_backend_pid()").fetchone()  # fmt: skip
    assert row == ("recon",)


def test_a_required_tls_the_server_lacks_fails_both_drivers(spark: Any, database_url: str) -> None:
    """This server runs without TLS: sslmode=require must fail, in psycopg and in JDBC, which
    shows both were given it (a dropped sslmode would connect in clear)."""
    from spark_ingest._sources import connect, read_outbox

    with psycopg.connect(database_url) as conn:
        if conn.execute("SHOW ssl").fetchone() != ("off",):
            pytest.fail("this test needs a server without TLS (ssl = off)")
    source = _libpq_source(database_url, "sslmode=require")
    with pytest.raises(SourceError, match="SSL"):
        connect(source).close()
    now = dt.datetime.now(dt.UTC)
    with pytest.raises(SourceError, match="SSL"):
        read_outbox(spark, source, now - H, now, 1).count()
    clear = _libpq_source(database_url, "sslmode=disable")
    assert read_outbox(spark, clear, now - H, now, 1).count() == 0
