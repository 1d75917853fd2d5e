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
    from pyspark import SparkConf
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


def _submitted_conf() -> SparkConf | None:
    """Spark's configuration when spark-submit (or a pyspark shell) started this process, else
    None. The JVM is already up then, and only its SparkConf holds spark-submit's settings: a
    SparkConf made in Python before any SparkContext exists is empty. A bare ``python`` run
    has no JVM yet (getOrCreate starts one), so there is nothing to read."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM; starts nothing
    return SparkConf()


def _provided_by_spark_conf(conf: SparkConf | None) -> bool:
    """True when spark-submit already put a driver on the classpath."""
    return conf is not None and any(
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
    ``spark.master`` in spark-defaults) is kept, and a run with none configured gets
    ``local[*]``. Under spark-submit, its jars and ``spark.sql.shuffle.partitions`` are kept.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    # Otherwise no master is set here: spark-submit's --master, else spark.master from
    # spark-defaults.conf, else $MASTER, else local[*] (spark-submit's own default, which
    # also applies to the JVM a bare ``python`` run starts).
    submitted = _submitted_conf()
    if jdbc_jar is not None or not _provided_by_spark_conf(submitted):
        builder = builder.config("spark.jars", find_jdbc_jar(jdbc_jar))
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
    )
    if submitted is None or not submitted.contains("spark.sql.shuffle.partitions"):
        partitions = max(2, (os.cpu_count() or 2) * 2)
        builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
