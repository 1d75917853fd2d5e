"""On the real standalone cluster, the JDBC time ranges read every row exactly once.

One Spark application (``ranges_driver.py``, started once for the module) runs the job's reads
(``read_sources``: the predicates are executed by the executors' JDBC queries) and the whole
reconciliation on three scenarios, each in its own outbox and inbox databases:

* ``edges``: rows created / received exactly on every edge of the ranges the job computes (with
  the job's own function, ``_ranges``) and one microsecond either side, among 200 others;
* ``same_instant``: every outbox row created at one instant, every delivery at another;
* ``empty``: no row in the window (rows just outside it): one partition per read;
* ``dst``: a window given in Europe/Paris across the spring-forward gap, a row a minute. Split
  on the wall clock (before the fix) an edge in the gap came after the window end: the outbox
  read took rows created up to 30 minutes after the window.

The multiset of ids read must equal the rows planted in the read's span, and the counts must be
those planted. The reads are sized from the data (10 rows a partition), bounded at 5 partitions
by ``max_connections``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from spark_ingest._sources import _CLOCK_MARGIN, _ranges
from tests.spark.spark_plant import Msg, insert_outbox, new_id
from tests.support.harness import PgServer
from tests.support.spark_standalone import StandaloneCluster

H = dt.timedelta(hours=1)
US = dt.timedelta(microseconds=1)
PARTS = 5  # max_connections of every source; rows_per_partition 10 wants more
AROUND = (-US, dt.timedelta(0), US)


@dataclass
class Planted:
    outbox: str
    inbox: str
    start: dt.datetime
    end: dt.datetime
    #: created_at of each outbox row; received_at of each inbox row (phantom or delivery)
    created: dict[str, dt.datetime] = field(default_factory=dict)
    received: dict[str, dt.datetime] = field(default_factory=dict)
    phantoms: set[str] = field(default_factory=set)

    def add_outbox(self, t: dt.datetime, *, delivered_at: dt.datetime | None = None) -> None:
        msg = Msg(new_id(), "orders", f"k{len(self.created)}", 1, "published", t, t + US)
        insert_outbox(self.outbox, msg)
        self.created[msg.id] = t
        if delivered_at is not None:
            self._inbox(msg.id, msg.key, delivered_at)

    def add_phantom(self, t: dt.datetime) -> None:
        ident = new_id()
        self.phantoms.add(ident)
        self._inbox(ident, "ghost", t)

    def _inbox(self, ident: str, key: str, t: dt.datetime) -> None:
        with psycopg.connect(self.inbox) as conn:
            conn.execute(
                "INSERT INTO inbox_messages (consumer, message_id, topic, key, seq, received_at, "
                "processed_at, attempts, duplicates, status) "
                "VALUES ('billing', %s, 'orders', %s, 1, %s, %s, 1, 0, 'processed')",
                (ident, key, t, t),
            )
        self.received[ident] = t

    def outbox_in_window(self) -> list[str]:
        return [i for i, t in self.created.items() if self.start <= t < self.end]

    def inbox_read(self, until: dt.datetime) -> list[str]:
        lo = self.start.astimezone(dt.UTC) - _CLOCK_MARGIN
        return [i for i, t in self.received.items() if lo <= t < until]

    def phantoms_in_window(self) -> int:
        return sum(self.start <= self.received[i] < self.end for i in self.phantoms)


def _plant_edges(p: Planted) -> None:
    """Rows on every edge of both reads' ranges and 1 us either side, 200 more in between."""
    outbox_edges = [a for a, _ in _ranges(p.start, p.end, PARTS)] + [p.end]
    for edge in outbox_edges:
        for d in AROUND:
            t = edge + d
            p.add_outbox(
                t, delivered_at=t + dt.timedelta(milliseconds=2) if p.start <= t < p.end else None
            )
    span = p.end - p.start
    for i in range(200):
        t = p.start + span * i / 200 + 7 * US
        p.add_outbox(t, delivered_at=t + dt.timedelta(milliseconds=2))
    # The inbox splits [start - margin, end) and its last range runs on to its safe time: end is
    # no edge of it, but rows there must be read once too.
    inbox_edges = [a for a, _ in _ranges(p.start - _CLOCK_MARGIN, p.end, PARTS)] + [p.end]
    for edge in inbox_edges:
        for d in AROUND:
            p.add_phantom(edge + d)
    p.add_phantom(dt.datetime.now(dt.UTC) + H)  # after every safe time: never read


def _plant_same_instant(p: Planted) -> None:
    created = _ranges(p.start, p.end, PARTS)[2][0]  # on an edge, for good measure
    received = _ranges(p.start - _CLOCK_MARGIN, p.end, PARTS)[3][0]
    assert created < received
    for _ in range(100):
        p.add_outbox(created, delivered_at=received)


PARIS = "Europe/Paris"
#: 00:30 CET to 03:00 CEST on 2026-03-29 (02:00-03:00 does not exist): 1.5 h, not 2.5 h.
DST_WINDOW = (
    dt.datetime(2026, 3, 29, 0, 30, tzinfo=ZoneInfo(PARIS)),
    dt.datetime(2026, 3, 29, 3, 0, tzinfo=ZoneInfo(PARIS)),
)


def _plant_dst(p: Planted) -> None:
    first = dt.datetime(2026, 3, 28, 23, 0, tzinfo=dt.UTC)
    for minute in range(180):
        t = first + minute * dt.timedelta(minutes=1)
        inside = p.start <= t < p.end
        p.add_outbox(t, delivered_at=t + dt.timedelta(milliseconds=2) if inside else None)


def _plant_empty(p: Planted) -> None:
    p.add_outbox(p.start - US)
    p.add_outbox(p.end)
    p.add_phantom(p.start - _CLOCK_MARGIN - US)


PLANTERS = {
    "edges": _plant_edges,
    "same_instant": _plant_same_instant,
    "empty": _plant_empty,
    "dst": _plant_dst,
}


@pytest.fixture(scope="module")
def runs(
    spark_cluster: StandaloneCluster,
    pg_server: PgServer,
    template_db: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, Planted], dict[str, Any]]]:
    now = dt.datetime.now(dt.UTC)
    # A window start with microseconds, so the edges have them too.
    start = now - 30 * H + dt.timedelta(microseconds=123_457)
    end = now - 6 * H
    root = tmp_path_factory.mktemp("ranges")
    with contextlib.ExitStack() as stack:
        planted: dict[str, Planted] = {}
        for name, plant in PLANTERS.items():
            outbox = stack.enter_context(pg_server.fresh_database(template=template_db))
            inbox = stack.enter_context(pg_server.fresh_database(template=template_db))
            window = DST_WINDOW if name == "dst" else (start, end)
            planted[name] = Planted(outbox, inbox, *window)
            plant(planted[name])
        spec = {
            "master": spark_cluster.master_url,
            "scenarios": {
                name: {
                    "outbox": p.outbox,
                    "inbox": p.inbox,
                    "start": p.start.isoformat(),
                    "end": p.end.isoformat(),
                    "zone": PARIS if name == "dst" else "UTC",
                    "max_connections": PARTS,
                    "rows_per_partition": 10,
                }
                for name, p in planted.items()
            },
        }
        (root / "spec.json").write_text(json.dumps(spec))
        driver = Path(__file__).with_name("ranges_driver.py")
        done = subprocess.run(
            [sys.executable, str(driver), str(root / "spec.json"), str(root / "out.json")],
            env=spark_cluster.driver_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}"
        out: dict[str, Any] = json.loads((root / "out.json").read_text())
        # The reads ran on the cluster's executors, one on each worker.
        executors = spark_cluster.executor_dirs(out["app_id"])
        assert {p.parent.parent for p in executors} == set(spark_cluster.worker_dirs)
        yield planted, out["scenarios"]


def _check_reads(p: Planted, got: dict[str, Any]) -> None:
    assert Counter(got["outbox_ids"]) == Counter(p.outbox_in_window())
    until = dt.datetime.fromisoformat(got["inbox_until"])
    assert Counter(got["inbox_ids"]) == Counter(p.inbox_read(until))


def test_rows_on_the_range_edges_are_read_exactly_once(
    runs: tuple[dict[str, Planted], dict[str, Any]],
) -> None:
    planted, got = runs[0]["edges"], runs[1]["edges"]
    # Sized from the data (over 50 rows each), bounded by max_connections: the edges planted
    # are the edges read.
    assert got["partitions"] == [PARTS, PARTS]
    assert got["frame_partitions"] == [PARTS, PARTS]
    assert got["estimated_rows"] == [PARTS * 10, PARTS * 10]  # counted up to what can be used
    _check_reads(planted, got)
    messages = len(planted.outbox_in_window())
    assert messages == 200 + 3 * (PARTS + 1) - 3  # lo - 1 us, hi and hi + 1 us are outside
    assert got["messages"] == messages
    counts = got["counts"]
    assert counts["pairs"] == messages
    assert counts["delivered"] == messages
    assert counts["phantom"] == planted.phantoms_in_window() == 3 * (PARTS - 1) + 1
    assert {
        k: v for k, v in counts.items() if v and k not in ("pairs", "delivered", "phantom")
    } == {}


def test_rows_all_at_one_instant_are_read_exactly_once(
    runs: tuple[dict[str, Planted], dict[str, Any]],
) -> None:
    planted, got = runs[0]["same_instant"], runs[1]["same_instant"]
    assert got["partitions"] == [PARTS, PARTS]
    _check_reads(planted, got)
    assert len(got["outbox_ids"]) == len(got["inbox_ids"]) == 100
    assert got["messages"] == 100
    assert got["counts"]["delivered"] == got["counts"]["pairs"] == 100
    assert sum(got["counts"].values()) == 200  # pairs + delivered, nothing else


def test_an_empty_window_reads_nothing_with_one_partition(
    runs: tuple[dict[str, Planted], dict[str, Any]],
) -> None:
    planted, got = runs[0]["empty"], runs[1]["empty"]
    assert got["estimated_rows"] == [0, 0]
    assert got["partitions"] == got["frame_partitions"] == [1, 1]
    _check_reads(planted, got)
    assert got["outbox_ids"] == got["inbox_ids"] == []
    assert got["messages"] == 0
    assert set(got["counts"].values()) == {0}


def test_a_window_across_a_dst_change_reads_its_instants_once(
    runs: tuple[dict[str, Planted], dict[str, Any]],
) -> None:
    planted, got = runs[0]["dst"], runs[1]["dst"]
    assert planted.end.astimezone(dt.UTC) - planted.start.astimezone(dt.UTC) == 1.5 * H
    assert got["partitions"] == [PARTS, PARTS]
    _check_reads(planted, got)
    assert len(got["outbox_ids"]) == got["messages"] == 90
    assert got["counts"]["delivered"] == 90
    assert got["counts"]["lost"] == 0
