"""Incremental ingest: land outbox and inbox rows in a Parquet lake, from a watermark per source.

Layout: ``<lake>/<source>/<table>/date=YYYY-MM-DD/batch=<watermark>/part-*.parquet`` and the
watermarks in ``<lake>/_watermarks/<source>.<table>.json``.

Why no row is missed or landed twice:

* Outbox rows are taken by transaction id: ``previous <= tx_id < xmin`` where ``xmin`` is frozen
  in one statement at start (see _sources). Every transaction below ``xmin`` has ended, so no row
  can later appear below the new watermark: no gaps, whatever the commit order.
* Inbox rows (no transaction id) are taken by ``previous <= received_at < safe_time``: a
  transaction still open has ``received_at >= xact_start >= safe_time``, so it lands next time.
* The batch directory is named after the watermark the batch starts from, and is written with
  dynamic partition overwrite. The watermark file is replaced (atomic rename) only after the
  data is written. A run that died in between is re-run from the same watermark, reads a
  superset of the same rows and overwrites the same batch directories: no duplicates. A run
  after a successful one starts from the new watermark and lands only new rows.

Rows are landed as they were when read; a later status change (pending -> published) is not
re-landed. The reconciliation reads the live tables, not the lake.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from outbox.schema import INBOX_MESSAGES, OUTBOX_MESSAGES
from spark_ingest._config import Source
from spark_ingest._sources import _jdbc, _qualified, read_horizon, time_predicates

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Landed", "ingest", "read_watermark"]

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
    exactly one of them whatever its time (correctness comes from the tx_id / time filter)."""
    preds = time_predicates(column, lo, hi, n)
    if len(preds) == 1:
        return ["TRUE"]
    first = preds[0].split(" AND ")[1]
    last = preds[-1].split(" AND ")[0]
    return [first, *preds[1:-1], last]


def _ingest_outbox(spark: SparkSession, lake: Path, src: Source, parts: int) -> Landed:
    h = read_horizon(src, OUTBOX_MESSAGES)
    prev = read_watermark(lake, src.name, OUTBOX_MESSAGES) or {"xid": 0, "time": _EPOCH.isoformat()}
    table = _qualified(src, OUTBOX_MESSAGES).as_string(None)
    query = (
        "SELECT id::text AS id, topic, key, seq, headers::text AS headers, payload, content_type,"
        " traceparent, created_at, available_at, status, attempts, last_error, published_at,"
        f" tx_id::text::bigint AS tx_id FROM {table}"
        f" WHERE tx_id >= '{int(prev['xid'])}'::xid8 AND tx_id < '{h.xmin}'::xid8"
    )
    lo = dt.datetime.fromisoformat(prev["time"])
    df = _jdbc(spark, src, query, _open_predicates("created_at", lo, h.now, parts))
    rows = _land(df, lake / src.name / OUTBOX_MESSAGES, "created_at", f"x{prev['xid']}")
    new = {"xid": h.xmin, "time": h.now.isoformat()}
    _write_watermark(lake, src.name, OUTBOX_MESSAGES, new)
    return Landed(src.name, OUTBOX_MESSAGES, rows, str(prev["xid"]), str(h.xmin))


def _ingest_inbox(spark: SparkSession, lake: Path, src: Source, parts: int) -> Landed:
    h = read_horizon(src, INBOX_MESSAGES)
    prev = read_watermark(lake, src.name, INBOX_MESSAGES) or {"time": _EPOCH.isoformat()}
    lo = dt.datetime.fromisoformat(prev["time"])
    table = _qualified(src, INBOX_MESSAGES).as_string(None)
    query = (
        "SELECT consumer, message_id::text AS message_id, topic, key, seq, received_at,"
        f" processed_at, attempts, status, last_error FROM {table}"
    )
    preds = time_predicates("received_at", lo, h.safe_time, parts)
    df = _jdbc(spark, src, query, preds)
    batch = "t" + lo.strftime("%Y%m%dT%H%M%S%f")
    rows = _land(df, lake / src.name / INBOX_MESSAGES, "received_at", batch)
    _write_watermark(lake, src.name, INBOX_MESSAGES, {"time": h.safe_time.isoformat()})
    return Landed(src.name, INBOX_MESSAGES, rows, prev["time"], h.safe_time.isoformat())


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
