"""A driver for test_ranges_cluster.py: one Spark application on the standalone cluster that,
for each scenario of a spec file, runs the job's reads (``read_sources``: the JDBC predicates on
the executors) and the whole reconciliation, and writes what it saw as JSON.

Usage: python ranges_driver.py SPEC.json OUT.json
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from spark_ingest import JobConfig, Source, Window, spark_session
from spark_ingest._job import read_sources, reconcile


def _scenario(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    cap = spec["max_connections"]
    zone = ZoneInfo(spec["zone"])
    config = JobConfig(
        outbox=Source("outbox", spec["outbox"], max_connections=cap),
        inboxes=(Source("billing", spec["inbox"], max_connections=cap),),
        subscriptions={"orders": ("billing",)},
        # In the zone given (a window in Europe/Paris stays a Europe/Paris one).
        window=Window(
            *(dt.datetime.fromisoformat(spec[k]).astimezone(zone) for k in ("start", "end"))
        ),
        rows_per_partition=spec["rows_per_partition"],
    )
    reads = read_sources(spark, config)
    result = reconcile(spark, config, record=False)
    return {
        "partitions": list(reads.partitions),
        "estimated_rows": list(reads.estimated_rows or ()),
        "frame_partitions": [
            reads.outbox.rdd.getNumPartitions(),
            reads.inbox.rdd.getNumPartitions(),
        ],
        "outbox_ids": [r[0] for r in reads.outbox.select("id").collect()],
        "inbox_ids": [r[0] for r in reads.inbox.select("message_id").collect()],
        "inbox_until": reads.inbox_horizons[0].safe_time.isoformat(),
        "messages": result.summary["messages"],
        "counts": result.summary["counts"],
    }


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    spark = spark_session(
        master=spec["master"],
        app_name="ranges-check",
        extra_conf={"spark.sql.shuffle.partitions": "2", "spark.executor.memory": "512m"},
    )
    try:
        out = {
            "app_id": spark.sparkContext.applicationId,
            "scenarios": {name: _scenario(spark, s) for name, s in spec["scenarios"].items()},
        }
    finally:
        spark.stop()
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:3])
