"""How many JDBC partitions the job's reads get, on real PostgreSQL (local Spark): sized from
the rows of the window, overridden by ``partitions``, bounded per database by
``max_connections``. The reads are planned only (no Spark job) except where rows are counted.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from spark_ingest import JobConfig, Source, Window
from spark_ingest._job import read_sources
from tests.spark.spark_plant import Msg, insert_inbox, insert_outbox, new_id

H = dt.timedelta(hours=1)


def _plant(outbox: str, inbox: str, start: dt.datetime, n: int) -> None:
    msgs = [
        Msg(new_id(), "orders", f"k{i}", 1, "published", start + i * H / n, start + i * H / n)
        for i in range(n)
    ]
    insert_outbox(outbox, *msgs)
    for m in msgs:
        insert_inbox(inbox, "billing", m.id, "orders", m.key, 1, m.created_at + H)


def _config(outbox: Source, inbox: Source, start: dt.datetime, **kw: Any) -> JobConfig:
    return JobConfig(
        outbox=outbox,
        inboxes=(inbox,),
        subscriptions={"orders": ("billing",)},
        window=Window(start, start + 2 * H),
        **kw,
    )


def test_outbox_and_inbox_in_one_database_share_its_max_connections(
    spark: Any, database_url: str
) -> None:
    start = dt.datetime.now(dt.UTC) - 10 * H
    _plant(database_url, database_url, start, 20)
    outbox = Source("outbox", database_url, max_connections=3)
    inbox = Source("billing", database_url, max_connections=3)
    reads = read_sources(spark, _config(outbox, inbox, start, rows_per_partition=2))
    # 20 rows each would want 10 partitions; counted up to the 6 rows 3 partitions can use,
    # each read wants 3, and together they get 3: no more queries at once on that database.
    assert reads.estimated_rows == (6, 6)
    assert reads.partitions == (2, 1)
    frames = (reads.outbox, reads.inbox)
    assert [f.rdd.getNumPartitions() for f in frames] == [2, 1]
    assert [f.count() for f in frames] == [20, 20]
    # An explicit partitions setting overrides the sizing, not the bound; nothing is counted.
    fixed = read_sources(spark, _config(outbox, inbox, start, partitions=8))
    assert fixed.estimated_rows is None
    assert fixed.partitions == (2, 1)


def test_reads_are_sized_from_the_rows_of_the_window(
    spark: Any, database_url: str, inbox_urls: tuple[str, str]
) -> None:
    start = dt.datetime.now(dt.UTC) - 10 * H
    _plant(database_url, inbox_urls[0], start, 30)
    outbox, inbox = Source("outbox", database_url), Source("billing", inbox_urls[0])
    default = read_sources(spark, _config(outbox, inbox, start))
    assert default.estimated_rows == (30, 30)
    assert default.partitions == (1, 1)  # 30 rows: one partition, not defaultParallelism
    sized = read_sources(spark, _config(outbox, inbox, start, rows_per_partition=10))
    assert sized.partitions == (3, 3)
    assert [f.rdd.getNumPartitions() for f in (sized.outbox, sized.inbox)] == [3, 3]
    # Separate databases: each read has its own max_connections (4).
    many = read_sources(spark, _config(outbox, inbox, start, partitions=9))
    assert many.partitions == (4, 4)
    # A window with no rows reads with one partition (here, one after the sources' clocks:
    # the inbox is read from the window start up to its safe time, so nothing).
    later = dt.datetime.now(dt.UTC) + 100 * H
    empty = read_sources(spark, _config(outbox, inbox, later, rows_per_partition=1))
    assert empty.estimated_rows == (0, 0)
    assert empty.partitions == (1, 1)
