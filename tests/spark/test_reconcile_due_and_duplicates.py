"""Two misclassifications, on real Spark and PostgreSQL: a retried or dead message is not a
duplicate (only a delivery after the message was settled is: inbox ``duplicates``), and a
scheduled message is due at its ``available_at``, not at ``created_at``."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from spark_ingest import JobConfig, Source, Window, reconcile
from tests.spark.spark_plant import Msg, insert_inbox, insert_outbox, new_id

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


def test_reconcile_scheduled_message_is_due_at_available_at(
    spark: Any, database_url: str, inbox_urls: tuple[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    created = now - 30 * H
    inbox = inbox_urls[0]
    # Every message created 30 h ago (SLA 1 h); name -> (status, available_at).
    planted = {
        "not_yet_due": ("pending", now + 2 * H),  # scheduled for later: in flight
        "just_due": ("pending", now - 10 * M),  # due 10 min ago, within the SLA: in flight
        "due_long_ago": ("pending", now - 3 * H),  # due 3 h ago, not published: stuck
        "unscheduled": ("pending", None),  # due when created, 30 h ago: stuck
        "scheduled_done": ("published", created + 20 * H),  # published when due, processed
    }
    ids = {name: new_id() for name in planted}

    def msg(name: str, status: str, at: dt.datetime | None) -> Msg:
        published = None if status == "pending" else (at or created) + M
        return Msg(ids[name], "orders", name, 1, status, created, published, at)

    insert_outbox(database_url, *(msg(n, s, at) for n, (s, at) in planted.items()))
    processed = created + 20 * H + 2 * M
    insert_inbox(inbox, "billing", ids["scheduled_done"], "orders", "scheduled_done", 1, processed)

    counts, by_kind = _run(spark, database_url, inbox, now, tmp_path)

    assert (counts["in_flight"], counts["stuck"], counts["delivered"]) == (2, 2, 1)
    assert by_kind["stuck"] == {ids["due_long_ago"], ids["unscheduled"]}
