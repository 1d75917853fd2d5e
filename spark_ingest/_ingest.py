"""Incremental ingest: land outbox and inbox rows in a Parquet lake, from a watermark per source.

Layout: ``<lake>/<source>/<table>/date=YYYY-MM-DD/batch=x<watermark>/part-*.parquet`` and the
watermarks in ``<lake>/_watermarks/<source>.<table>.json``.

What a run lands: every row whose current version was written by a transaction in
``[previous watermark, xmin)``, where ``xmin`` is frozen in one statement at start (see
_sources). A row's version is the 64-bit id of the transaction that last wrote it: its 32-bit
``xmin`` system column, widened against the horizon (exact while the row is less than 2^31
transactions old, which every row written since the last run is). So a run lands the rows
inserted since the last run AND the rows changed since (pending -> published, -> dead, a
re-drive, an inbox row processing -> processed, another delivery attempt), each as a new
version with a ``version`` column; ``read_lake`` gives the current state (the latest version of
each row), the lake itself the history of versions.

Why no version is missed or landed twice:

* Every transaction below ``xmin`` has ended, so no version below the new watermark can appear
  later: no gaps, whatever the commit order. A row changed again by a transaction at or above
  ``xmin`` is skipped now and landed, as that later version, by the next run.
* The batch directory is named after the watermark the batch starts from, and is written with
  dynamic partition overwrite. The watermark file is replaced (atomic rename) only after the
  data is written. A run that died in between is re-run from the same watermark, reads a
  superset of the same versions and overwrites the same batch directories: no duplicates. A
  run after a successful one starts from the new watermark and lands only newer versions.
* Any UPDATE makes a new version, including the relay's lease claims: a pending row claimed
  after it was landed is landed again, unchanged but for the lease columns (not landed).

The reconciliation reads the live tables, not the lake.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psycopg import sql
from pyspark.sql import functions as F

from outbox.kit import qualified
from outbox.schema import INBOX_MESSAGES, OUTBOX_MESSAGES
from spark_ingest._config import Source
from spark_ingest._sources import _jdbc, read_horizon, time_predicates
from spark_ingest._statements import TEMPLATES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Landed", "ingest", "read_lake", "read_watermark", "row_version"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Landed:
    """One table of one source landed by a run."""

    source: str
    table: str
    rows: int
    previous: str
    watermark: str


def _wm_path(lake: Path, source: str, table: str) -> Path:
    return lake / "_watermarks" / f"{source}.{table}.json"


def read_watermark(lake: str | Path, source: str, table: str) -> dict[str, Any] | None:
    """The stored watermark of ``source``/``table``, or None before the first run."""
    path = _wm_path(Path(lake), source, table)
    return json.loads(path.read_text()) if path.exists() else None


def _write_watermark(lake: Path, source: str, table: str, value: dict[str, Any]) -> None:
    path = _wm_path(lake, source, table)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _land(df: DataFrame, target: Path, date_col: str, batch: str) -> int:
    df = df.withColumn("date", F.to_date(F.col(date_col))).withColumn("batch", F.lit(batch))
    df = df.persist()
    try:
        rows = df.count()
        if rows:
            df.write.mode("overwrite").partitionBy("date", "batch").parquet(str(target))
        return rows
    finally:
        df.unpersist()


def _open_predicates(column: str, lo: dt.datetime, hi: dt.datetime, n: int) -> list[str]:
    """Time ranges for parallelism only: the first and last are open-ended, so every row is in
    exactly one of them whatever its time (correctness comes from the version filter)."""
    preds = time_predicates(column, lo, hi, n)
    if len(preds) == 1:
        return ["TRUE"]
    first = preds[0].split(" AND ")[1]
    last = preds[-1].split(" AND ")[0]
    return [first, *preds[1:-1], last]


def row_version(horizon: int) -> str:
    """SQL for a row's version: the 64-bit id of the transaction that last wrote it.

    ``xmin`` is 32 bits; widened by its signed distance to ``horizon`` (a 64-bit xid8), it is
    exact for any row written less than 2^31 transactions before or after the horizon.
    """
    return TEMPLATES.row_version.format(horizon=horizon, h32=horizon % 2**32).as_string(None)


def _changed(read: sql.SQL, table: str, lo: int, hi: int) -> str:
    """``read`` of ``table``: the rows whose version is in ``[lo, hi)``."""
    return read.format(
        table=sql.SQL(table), version=sql.SQL(row_version(hi)), lo=lo, hi=hi
    ).as_string(None)


def _previous(lake: Path, src: Source, table: str) -> tuple[int, dt.datetime]:
    prev = read_watermark(lake, src.name, table) or {}
    # A watermark from before versions (time only) restarts at 0: every row lands once more,
    # as a version, and read_lake keeps the latest.
    return int(prev.get("xid", 0)), dt.datetime.fromisoformat(prev.get("time", _EPOCH.isoformat()))


def _ingest_outbox(spark: SparkSession, lake: Path, src: Source, parts: int) -> Landed:
    h = read_horizon(src, OUTBOX_MESSAGES)
    xid, lo = _previous(lake, src, OUTBOX_MESSAGES)
    table = qualified(src.schema, OUTBOX_MESSAGES).as_string(None)
    query = _changed(TEMPLATES.ingest_outbox, table, xid, h.xmin)
    df = _jdbc(spark, src, query, _open_predicates("created_at", lo, h.now, parts))
    rows = _land(df, lake / src.name / OUTBOX_MESSAGES, "created_at", f"x{xid}")
    _write_watermark(lake, src.name, OUTBOX_MESSAGES, {"xid": h.xmin, "time": h.now.isoformat()})
    return Landed(src.name, OUTBOX_MESSAGES, rows, str(xid), str(h.xmin))


def _ingest_inbox(spark: SparkSession, lake: Path, src: Source, parts: int) -> Landed:
    h = read_horizon(src, INBOX_MESSAGES)
    xid, lo = _previous(lake, src, INBOX_MESSAGES)
    table = qualified(src.schema, INBOX_MESSAGES).as_string(None)
    query = _changed(TEMPLATES.ingest_inbox, table, xid, h.xmin)
    df = _jdbc(spark, src, query, _open_predicates("received_at", lo, h.now, parts))
    rows = _land(df, lake / src.name / INBOX_MESSAGES, "received_at", f"x{xid}")
    _write_watermark(lake, src.name, INBOX_MESSAGES, {"xid": h.xmin, "time": h.now.isoformat()})
    return Landed(src.name, INBOX_MESSAGES, rows, str(xid), str(h.xmin))


def read_lake(spark: SparkSession, lake: str | Path, source: str, table: str) -> DataFrame:
    """The current state of a landed table: the latest landed version of each row (rows landed
    before versions existed count as the oldest)."""
    from pyspark.sql import Window

    df = spark.read.parquet(str(Path(lake) / source / table))
    key = ["id"] if table == OUTBOX_MESSAGES else ["consumer", "message_id"]
    if "version" not in df.columns:
        df = df.withColumn("version", F.lit(None).cast("bigint"))
    latest = Window.partitionBy(*key).orderBy(F.col("version").desc_nulls_last())
    return df.withColumn("_n", F.row_number().over(latest)).where("_n = 1").drop("_n")


def ingest(
    spark: SparkSession,
    lake: str | Path,
    outbox: Source,
    inboxes: tuple[Source, ...] = (),
    *,
    partitions: int | None = None,
) -> list[Landed]:
    """Land what is new since the last run for the outbox and every inbox source."""
    root = Path(lake)
    parts = partitions or spark.sparkContext.defaultParallelism
    landed = [_ingest_outbox(spark, root, outbox, parts)]
    landed += [_ingest_inbox(spark, root, src, parts) for src in inboxes]
    return landed
