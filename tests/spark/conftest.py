"""One real SparkSession (local[2]) for the whole run, and helpers to plant rows.

The JVM takes ~10 s to start, so every Spark test shares the session-scoped ``spark`` fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from harness import PgServer
from services import import_or_missing, missing

import_or_missing("pyspark", "spark")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark_ingest import find_jdbc_jar, spark_session
    from spark_ingest._errors import JdbcDriverNotFoundError

    try:
        find_jdbc_jar()
    except JdbcDriverNotFoundError as exc:
        missing("the PostgreSQL JDBC driver", str(exc))
    session = spark_session(
        master="local[2]",
        extra_conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def inbox_urls(pg_server: PgServer, template_db: str) -> Iterator[tuple[str, str]]:
    """Two more fresh migrated databases: each consuming service keeps its own inbox."""
    with (
        pg_server.fresh_database(template=template_db) as a,
        pg_server.fresh_database(template=template_db) as b,
    ):
        yield a, b
