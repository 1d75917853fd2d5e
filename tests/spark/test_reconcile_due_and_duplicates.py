"""On real Spark and PostgreSQL: a retried or dead message is not a duplicate (only a delivery
after the message was settled is: inbox ``duplicates``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from spark_plant import Msg, insert_inbox, insert_outbox, new_id

from spark_ingest import JobConfig, Source, Window, reconcile

H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)


def _run(
    spark: Any, outbox: str, inbox: str, now: dt.datetime, tmp_path: Path
) -> tuple[dict[str, int], dict[str, set[str]]]:
    config = JobConfig(
        outbox=Source("outbox", outbox),
        inboxes=(Source("billing", inbox),),
        subscriptions={"orders": ("billing",)},
        window=Window(now - 36 * H, now - 12 * H),
        sla=H,
    )
    result = reconcile(spark, config, tmp_path)
    by_kind: dict[str, set[str]] = {}
    for row in result.details:
        by_kind.setdefault(row["kind"], set()).add(row["id"])
    return result.summary["counts"], by_kind


def test_reconcile_duplicate_is_a_delivery_after_settling_not_a_retry(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    created = now - 30 * H
    inbox = inbox_urls[0]
    # name -> (inbox status, attempts, duplicates)
    planted = {
        "clean": ("processed", 1, 0),
        "retried": ("processed", 3, 0),  # failed twice, then processed: healthy
        "dead": ("dead", 5, 0),  # five failed attempts, no effect: dead only
        "redelivered": ("processed", 2, 1),  # delivered again after it was processed
        "dead_redelivered": ("dead", 6, 1),  # delivered again after it was dead
    }
    ids = {name: new_id() for name in planted}
    msgs = [Msg(ids[n], "orders", n, 1, "published", created, created + M) for n in planted]
    insert_outbox(database_url, *msgs)
    for name, (status, attempts, duplicates) in planted.items():
        insert_inbox(
            inbox, "billing", ids[name], "orders", name, 1, created + 2 * M,
            status=status, attempts=attempts, duplicates=duplicates,
        )  # fmt: skip

    counts, by_kind = _run(spark, database_url, inbox, now, tmp_path)

    assert (counts["delivered"], counts["dead"], counts["duplicate"]) == (3, 2, 2)
    assert by_kind["duplicate"] == {ids["redelivered"], ids["dead_redelivered"]}
    assert by_kind["dead"] == {ids["dead"], ids["dead_redelivered"]}
