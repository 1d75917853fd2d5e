"""Migration outbox_0020 (origins): which databases get an origin, and the positions' new key.

A database that has never published gets an origin at migration (its name and a random
suffix); one that has published keeps publishing without one, so its consumers' positions
(kept per origin) do not start over. The inbox's positions gain the origin in their primary
key, and a downgrade keeps each key's furthest position.
"""

from __future__ import annotations

import psycopg

from outbox._migrate import downgrade, upgrade


def _origin(url: str) -> str | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT origin FROM outbox_identity").fetchone()
    assert row is not None  # one row, always
    return row[0]


def test_a_database_that_never_published_gets_an_origin(empty_database_url: str) -> None:
    upgrade(empty_database_url)
    origin = _origin(empty_database_url)
    dbname = empty_database_url.rsplit("/", 1)[1]
    assert origin is not None
    assert origin.startswith(f"{dbname}-")
    assert len(origin) == len(dbname) + 9


def test_a_database_that_published_keeps_publishing_without_one(empty_database_url: str) -> None:
    url = empty_database_url
    upgrade(url, revision="outbox_0016")
    with psycopg.connect(url) as conn:
        # written as that revision's writers wrote (this package's publish() needs the tables
        # of its own revision: outbox_wal_pending)
        conn.execute("""SELECT outbox_publish('orders', 'k1', '{"n": 1}')""")
        conn.commit()
    upgrade(url)
    assert _origin(url) is None


def test_positions_per_origin_and_back(empty_database_url: str) -> None:
    url = empty_database_url
    upgrade(url)
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO inbox_key_positions (consumer, origin, topic, key, last_seq) VALUES "
            "('c', '', 'orders', 'k1', 3), ('c', 'a', 'orders', 'k1', 7), "
            "('c', 'b', 'orders', 'k1', 5)"
        )
        conn.commit()
    downgrade(url, "outbox_0016")
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT consumer, topic, key, last_seq FROM inbox_key_positions")
        assert rows.fetchall() == [("c", "orders", "k1", 7)]
    upgrade(url)
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT origin, last_seq FROM inbox_key_positions")
        assert rows.fetchall() == [("", 7)]
