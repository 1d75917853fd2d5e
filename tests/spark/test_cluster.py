"""The reconciliation job on a real Spark standalone cluster gives the local run's results.

The same planted data (300 messages, two inboxes) is reconciled three times, each run a new
driver process started the way a user would: ``outbox reconcile --master local[2]``,
``outbox reconcile --master spark://...`` and ``spark-submit --master spark://... --jars ...
spark_ingest/__main__.py reconcile ...``. The counts, the daily figures, the lost ids and the
recorded runs must be equal, and each cluster run must have had executors on both workers.

The database password travels as docs/how-to/reconcile.md says: an environment variable set for
the driver alone (the workers never see it), read by the driver and handed to the JDBC reads.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import spark_ingest
from tests.spark.spark_plant import RECON_PASSWORD_ENV, Msg, insert_outbox, new_id
from tests.support.spark_standalone import StandaloneCluster

H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)
N = 300
APP_NAME = "outbox-reconcile"


def _plant(outbox: str, billing: str, shipping: str, now: dt.datetime) -> dict[str, Any]:
    """N orders over the window (now-36h, now-12h), each for billing and shipping.

    Every 10th is lost for shipping, every 25th (from 1) is dead in the outbox, every 50th
    (from 2) was published 10 minutes ago (lagging for both); 5 phantoms in billing, 3 in
    shipping; the rest are delivered to both.
    """
    start = now - 35 * H
    msgs, lost, dead, lagging = [], [], [], []
    for i in range(N):
        created = start + i * (22 * H) / N
        status, published = "published", created + M
        if i % 25 == 1:
            status = "dead"
            dead.append(i)
        elif i % 50 == 2:
            published = now - 10 * M
            lagging.append(i)
        msgs.append(Msg(new_id(), "orders", f"k{i}", 1, status, created, published))
        if i % 10 == 0:
            lost.append(msgs[-1].id)
    insert_outbox(outbox, *msgs)
    rows: dict[str, list[tuple[Any, ...]]] = {billing: [], shipping: []}
    for i, m in enumerate(msgs):
        if i in dead or i in lagging:
            continue
        done = m.created_at + 2 * M
        rows[billing].append(("billing", m.id, m.key, done))
        if i % 10:
            rows[shipping].append(("shipping", m.id, m.key, done))
    phantoms = {billing: 5, shipping: 3}
    for url, n in phantoms.items():
        consumer = "billing" if url == billing else "shipping"
        rows[url] += [(consumer, new_id(), f"ghost{j}", start + H) for j in range(n)]
    for url, values in rows.items():
        with psycopg.connect(url) as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO inbox_messages (consumer, message_id, topic, key, seq, "
                "received_at, processed_at, attempts, duplicates, status) "
                "VALUES (%s, %s, 'orders', %s, 1, %s, %s, 1, 0, 'processed')",
                [(c, i, k, t, t) for c, i, k, t in values],
            )
    return {
        "lost": sorted(lost),
        "counts": {
            "lost": len(lost),
            "dead": 2 * len(dead),
            "lagging": 2 * len(lagging),
            "phantom": sum(phantoms.values()),
            "delivered": 2 * (N - len(dead) - len(lagging)) - len(lost),
        },
    }


def _args(outbox: str, inboxes: tuple[str, str], now: dt.datetime, output: Path) -> list[str]:
    return [
        "reconcile",
        "--outbox",
        outbox,
        "--inbox",
        inboxes[0],
        "--inbox",
        inboxes[1],
        "--password-env",
        RECON_PASSWORD_ENV,
        "--subscribe",
        "orders=billing,shipping",
        "--since",
        (now - 36 * H).isoformat(),
        "--until",
        (now - 12 * H).isoformat(),
        "--sla",
        "1h",
        "--output",
        str(output),
        "--json",
    ]


def _run(command: list[str], env: dict[str, str], output: Path) -> dict[str, Any]:
    """Run one driver; return its summary.json, with its lost ids and wall time."""
    begun = time.monotonic()
    # a Spark driver's start-up is seconds on a quiet machine and minutes on a loaded one: the
    # bound is a hang's, not a speed check (speed is bench/reconcile*.py's)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    took = time.monotonic() - begun
    # Exit status 1: the planted discrepancies exceed the default thresholds (0).
    assert done.returncode == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    (run_dir,) = output.iterdir()
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    summary["_lost"] = (run_dir / "redrive.txt").read_text().split()
    summary["_seconds"] = took
    assert json.loads(done.stdout)["run_id"] == summary["run_id"]
    return summary


def _comparable(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("window", "messages", "counts", "daily", "outcome", "exceeded", "discrepancies")
    return {k: summary[k] for k in keys} | {"lost": summary["_lost"]}


def _apps(cluster: StandaloneCluster) -> dict[str, dict[str, Any]]:
    state = cluster.state()
    return {a["id"]: a for a in state["completedapps"] + state["activeapps"]}


@pytest.mark.timeout(1500)  # three drivers, each bounded by _run
def test_a_cluster_run_equals_the_local_run(
    spark_cluster: StandaloneCluster,
    database_url: str,
    inbox_urls: tuple[str, str],
    tmp_path: Path,
) -> None:
    from spark_ingest import find_jdbc_jar

    now = dt.datetime.now(dt.UTC)
    planted = _plant(database_url, *inbox_urls, now)
    # The password for the driver alone: the workers' environment does not have it.
    env = spark_cluster.driver_env | {RECON_PASSWORD_ENV: "unused-under-trust-auth"}
    outbox = Path(sys.executable).with_name("outbox")
    main_py = Path(spark_ingest.__file__).with_name("__main__.py")
    submit = [
        str(spark_cluster.spark_home / "bin" / "spark-submit"),
        *("--master", spark_cluster.master_url, "--jars", find_jdbc_jar()),
        *("--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=512m"),
        str(main_py),
    ]
    before = set(_apps(spark_cluster))

    def args(name: str) -> list[str]:
        return _args(database_url, inbox_urls, now, tmp_path / name)

    local = _run([str(outbox), *args("local"), "--master", "local[2]"], env, tmp_path / "local")
    on_cli = _run(
        [str(outbox), *args("cli"), "--master", spark_cluster.master_url], env, tmp_path / "cli"
    )
    on_submit = _run([*submit, *args("submit")], env, tmp_path / "submit")

    counts = local["counts"]
    assert local["messages"] == N
    assert {k: counts[k] for k in planted["counts"]} == planted["counts"]
    assert counts["pairs"] == 2 * N
    assert local["_lost"] == planted["lost"]
    assert _comparable(on_cli) == _comparable(local)
    assert _comparable(on_submit) == _comparable(local)

    # Both cluster runs were applications of the master, with an executor on each worker.
    apps = {k: v for k, v in _apps(spark_cluster).items() if k not in before}
    assert sorted(a["name"] for a in apps.values()) == [APP_NAME, APP_NAME]
    for app_id in apps:
        executors = spark_cluster.executor_dirs(app_id)
        assert len(executors) == 2, (app_id, executors)
        assert {p.parent.parent for p in executors} == set(spark_cluster.worker_dirs)
    # Every run was recorded, with the same figures.
    with psycopg.connect(database_url) as conn:
        recorded = conn.execute(
            "SELECT run_id::text, outcome, discrepancies, summary->'counts' "
            "FROM outbox_reconciliation_runs"
        ).fetchall()
    assert {r[0] for r in recorded} == {s["run_id"] for s in (local, on_cli, on_submit)}
    assert {(r[1], r[2], json.dumps(r[3], sort_keys=True)) for r in recorded} == {
        ("failed", local["discrepancies"], json.dumps(counts, sort_keys=True))
    }
    took = {
        name: round(s["_seconds"], 1)
        for name, s in (("local", local), ("cli", on_cli), ("submit", on_submit))
    }
    print(f"driver wall times (s): {took}")
