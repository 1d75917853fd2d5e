"""spark_ingest: nightly reconciliation of outbox and inbox tables on PySpark.

The only package that imports pyspark, and only when a job runs::

    from spark_ingest import JobConfig, Source, Window, reconcile, spark_session

    spark = spark_session()                      # local[*] unless Spark is configured
    result = reconcile(spark, JobConfig(
        outbox=Source("outbox", "jdbc:postgresql://db:5432/app", user="recon",
                      password_env="RECON_PASSWORD"),
        inboxes=(Source("billing", "jdbc:postgresql://db:5432/billing", user="recon"),),
        subscriptions={"orders": ("billing",)},
        window=Window(start, end),
    ), "reconciliation")
    result.exit_code, result.lost_ids
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_ingest._config import (
    CLASSES,
    DISCREPANCY_CLASSES,
    JobConfig,
    Source,
    Window,
    load_toml,
    previous_day,
)
from spark_ingest._errors import JdbcDriverNotFoundError, ReconciliationError, SourceError
from spark_ingest._redrive import RedriveResult, read_id_file, redrive
from spark_ingest._runs import RunSummary, latest_runs, run_report

if TYPE_CHECKING:
    from spark_ingest._ingest import Landed, ingest, read_lake
    from spark_ingest._job import RunResult, reconcile
    from spark_ingest._session import find_jdbc_jar, spark_session

__all__ = [
    "CLASSES",
    "DISCREPANCY_CLASSES",
    "JdbcDriverNotFoundError",
    "JobConfig",
    "Landed",
    "ReconciliationError",
    "RedriveResult",
    "RunResult",
    "RunSummary",
    "Source",
    "SourceError",
    "Window",
    "carried_start",
    "find_jdbc_jar",
    "ingest",
    "latest_runs",
    "load_toml",
    "previous_day",
    "read_id_file",
    "read_lake",
    "reconcile",
    "redrive",
    "run_report",
    "spark_session",
]

# Names whose modules import pyspark: loaded on first use, so importing the package is cheap.
_LAZY = {
    "Landed": "spark_ingest._ingest",
    "ingest": "spark_ingest._ingest",
    "read_lake": "spark_ingest._ingest",
    "RunResult": "spark_ingest._job",
    "carried_start": "spark_ingest._outputs",
    "reconcile": "spark_ingest._job",
    "find_jdbc_jar": "spark_ingest._session",
    "spark_session": "spark_ingest._session",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_ingest' has no attribute {name!r}")
    import importlib

    from outbox.kit import require

    require("pyspark", "spark")  # these names run on Spark: name the extra when it is missing
    return getattr(importlib.import_module(module), name)
