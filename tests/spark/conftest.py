"""One real SparkSession (local[2]) for the whole run, a standalone cluster, inbox databases.

The JVM takes ~10 s to start, so every Spark test shares the session-scoped ``spark`` fixture;
the cluster tests share ``spark_cluster`` (a master and two workers, started only when asked).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.spark_plant import RECON_PASSWORD_ENV
from tests.support.harness import PgServer
from tests.support.services import import_or_missing, missing
from tests.support.spark_standalone import ClusterError, StandaloneCluster, spark_class, standalone

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


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone master and two workers (1 core, 1 GiB each) on free ports of 127.0.0.1
    (tests/support/spark_standalone.py)."""
    from spark_ingest import find_jdbc_jar
    from spark_ingest._errors import JdbcDriverNotFoundError

    try:
        find_jdbc_jar()
    except JdbcDriverNotFoundError as exc:
        missing("the PostgreSQL JDBC driver", str(exc))
    launcher = spark_class()
    if not os.access(launcher, os.X_OK):
        missing("Spark's launcher", f"{launcher} is not there or not executable")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        missing("Java", "install a JDK 17+ (apt-get install openjdk-17-jre-headless)")
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(
                standalone(
                    tmp_path_factory.mktemp("spark-cluster"),
                    driver_defaults={
                        "spark.driver.memory": "512m",
                        "spark.executor.memory": "512m",
                    },
                    drop_env=[RECON_PASSWORD_ENV],
                )
            )
        except ClusterError as exc:
            missing("a Spark standalone cluster", str(exc))
        yield cluster
