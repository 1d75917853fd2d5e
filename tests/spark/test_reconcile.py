"""The reconciliation job on real Spark (local[2]) against real PostgreSQL databases.

One outbox database and two inbox databases (billing, shipping), with every kind of
discrepancy planted; the job must report exactly the planted sets.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from spark_ingest import JobConfig, Source, Window, reconcile
from tests.spark.spark_plant import Msg, insert_inbox, insert_outbox, new_id

H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)


def _config(outbox_url: str, billing: str, shipping: str, now: dt.datetime) -> JobConfig:
    return JobConfig(
        outbox=Source("outbox", outbox_url),
        inboxes=(Source("billing", billing), Source("shipping", shipping)),
        subscriptions={"orders": ("billing", "shipping"), "audit": ("billing",)},
        window=Window(now - 36 * H, now - 12 * H),
        sla=H,
        thresholds={"duplicate": 5},
    )


def _plant(outbox: str, billing: str, shipping: str, now: dt.datetime) -> dict[str, Any]:
    t = now - 30 * H
    ids: dict[str, str] = {}

    def msg(
        name: str,
        status: str = "published",
        *,
        key: str | None = None,
        seq: int = 1,
        topic: str = "orders",
        created: dt.datetime = t,
        published: dt.datetime | None = None,
    ) -> Msg:
        ids[name] = new_id()
        pub = published if published is not None else created + M
        return Msg(
            ids[name],
            topic,
            key or name,
            seq,
            status,
            created,
            None if status == "pending" else pub,
        )

    msgs = [
        *(msg(f"ok{i}") for i in range(3)),
        msg("lost"),
        msg("stuck", "pending"),
        msg("dead_outbox", "dead"),
        msg("dead_inbox"),
        msg("dupe"),
        msg("ooo1", key="k-ooo", seq=1),
        msg("ooo2", key="k-ooo", seq=2),
        msg("lagging", published=now - 10 * M),
        msg("stale"),
        msg("audit", topic="audit"),
        msg("before_window", created=now - 60 * H),
        msg("after_window", created=now - 6 * H),
    ]
    insert_outbox(outbox, *msgs)
    by = {m.id: m for m in msgs}

    def done(url: str, consumer: str, name: str, at: dt.datetime, **kw: Any) -> None:
        m = by[ids[name]]
        insert_inbox(url, consumer, m.id, m.topic, m.key, m.seq, at, **kw)

    p = t + 5 * M
    for name in ("ok0", "ok1", "ok2", "dead_inbox", "dupe"):
        done(shipping, "shipping", name, p)
    for name in ("ok0", "ok1", "ok2", "lost", "stale", "audit"):
        done(billing, "billing", name, p)
    done(billing, "billing", "dead_inbox", p, status="dead")
    done(billing, "billing", "dupe", p, attempts=3, duplicates=2)
    done(shipping, "shipping", "stale", p, status="stale")
    # Billing applies k-ooo in order, shipping applies seq 2 before seq 1.
    done(billing, "billing", "ooo1", p)
    done(billing, "billing", "ooo2", p + M)
    done(shipping, "shipping", "ooo2", p)
    done(shipping, "shipping", "ooo1", p + M)
    # An old message processed inside the window: not a phantom (it exists, just older).
    done(billing, "billing", "before_window", p)
    phantom = new_id()
    insert_inbox(billing, "billing", phantom, "orders", "ghost", 1, p)
    return {"ids": ids, "phantom": phantom}


@pytest.fixture
def planted(database_url: str, inbox_urls: tuple[str, str]) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC)
    billing, shipping = inbox_urls
    data = _plant(database_url, billing, shipping, now)
    data.update(config=_config(database_url, billing, shipping, now), now=now)
    return data


def test_reconcile_reports_exactly_the_planted_discrepancies(
    spark: Any, planted: dict[str, Any], database_url: str, tmp_path: Path
) -> None:
    ids = planted["ids"]
    result = reconcile(spark, planted["config"], tmp_path)
    c = result.summary["counts"]
    # 13 messages in the window: 12 orders x 2 consumers + 1 audit x 1 consumer.
    assert result.summary["messages"] == 13
    assert c["pairs"] == 25
    assert {k: c[k] for k in ("lost", "stuck", "dead", "stale", "lagging", "phantom")} == {
        "lost": 1,
        "stuck": 2,
        "dead": 3,
        "stale": 1,
        "lagging": 2,
        "phantom": 1,
    }
    assert (c["duplicate"], c["out_of_order"], c["in_flight"]) == (1, 1, 0)
    assert c["delivered"] == 25 - 1 - 2 - 3 - 1 - 2
    by_kind: dict[str, set[tuple[str, str | None]]] = {}
    for row in result.details:
        by_kind.setdefault(row["kind"], set()).add((row["id"], row["consumer"]))
    assert by_kind["lost"] == {(ids["lost"], "shipping")}
    assert by_kind["stuck"] == {(ids["stuck"], "billing"), (ids["stuck"], "shipping")}
    assert by_kind["dead"] == {
        (ids["dead_outbox"], "billing"),
        (ids["dead_outbox"], "shipping"),
        (ids["dead_inbox"], "billing"),
    }
    assert by_kind["stale"] == {(ids["stale"], "shipping")}
    assert by_kind["duplicate"] == {(ids["dupe"], "billing")}
    assert by_kind["out_of_order"] == {(ids["ooo1"], "shipping")}
    assert by_kind["phantom"] == {(planted["phantom"], "billing")}
    assert result.lost_ids == [ids["lost"]]
    # Thresholds: every discrepancy class defaults to 0, duplicate allows 5.
    assert result.exit_code == 1
    assert set(result.summary["exceeded"]) == {
        "lost",
        "stuck",
        "dead",
        "stale",
        "phantom",
        "out_of_order",
    }
    _check_outputs(spark, result, tmp_path, database_url, ids)


def _check_outputs(
    spark: Any, result: Any, tmp_path: Path, database_url: str, ids: dict[str, str]
) -> None:
    out = tmp_path / str(result.run_id)
    assert (out / "redrive.txt").read_text() == f"{ids['lost']}\n"
    saved = json.loads((out / "summary.json").read_text())
    assert saved["counts"] == result.summary["counts"]
    html = (out / "report.html").read_text()
    assert html.count("<svg") >= 3
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert spark.read.parquet(str(out / "details")).count() == len(result.details)
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT outcome, discrepancies, messages, summary->'counts'->>'lost' "
            "FROM outbox_reconciliation_runs WHERE run_id = %s",
            (str(result.run_id),),
        ).fetchone()
    assert row == ("failed", result.summary["discrepancies"], 13, "1")
