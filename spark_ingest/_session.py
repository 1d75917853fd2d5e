"""The SparkSession: local by default, unchanged under spark-submit, JDBC jar from disk.

The PostgreSQL JDBC driver is never downloaded at run time: it comes from ``jdbc_jar``, else
``$OUTBOX_JDBC_JAR``, else Debian's ``/usr/share/java/postgresql.jar``, else whatever the
Spark configuration already provides (``spark.jars`` / ``spark.jars.packages`` set by
spark-submit or spark-defaults.conf).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from spark_ingest._errors import JdbcDriverNotFoundError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEBIAN_JAR", "find_jdbc_jar", "spark_session"]

DEBIAN_JAR = "/usr/share/java/postgresql.jar"
_HOW_TO = (
    "install one (Debian/Ubuntu: apt-get install libpostgresql-jdbc-java, which provides "
    f"{DEBIAN_JAR}), pass --jdbc-jar /path/to/postgresql-42.x.jar or set OUTBOX_JDBC_JAR; on a "
    "machine with internet access spark-submit --packages org.postgresql:postgresql:42.7.4 "
    "(spark.jars.packages) works too"
)


def find_jdbc_jar(configured: str | None = None) -> str:
    """The path of the PostgreSQL JDBC jar, or JdbcDriverNotFoundError saying how to get one."""
    candidates = [configured, os.environ.get("OUTBOX_JDBC_JAR"), DEBIAN_JAR]
    if configured or os.environ.get("OUTBOX_JDBC_JAR"):
        candidates = candidates[:2]  # an explicit choice is never silently replaced
    for path in filter(None, candidates):
        if Path(path).is_file():
            return str(path)
    tried = ", ".join(filter(None, candidates))
    raise JdbcDriverNotFoundError(
        f"no PostgreSQL JDBC driver found (tried {tried}): {_HOW_TO}", tried=tried
    )


def _provided_by_spark_conf() -> bool:
    """True when spark-submit / spark-defaults already put a driver on the classpath."""
    from pyspark import SparkConf

    conf = SparkConf()
    return any(
        "postgresql" in (conf.get(key) or "")
        for key in ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")
    )


def spark_session(
    *,
    master: str | None = None,
    jdbc_jar: str | None = None,
    app_name: str = "outbox-reconcile",
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Get or create the session.

    ``master`` wins when given; otherwise a master already configured (spark-submit,
    ``spark.master`` in spark-defaults) is kept, and only a bare ``python`` run gets
    ``local[*]``.
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):
        builder = builder.master("local[*]")
    if jdbc_jar is not None or not _provided_by_spark_conf():
        builder = builder.config("spark.jars", find_jdbc_jar(jdbc_jar))
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.sql.shuffle.partitions", str(max(2, (os.cpu_count() or 2) * 2)))
    )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
