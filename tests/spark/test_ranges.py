"""The time ranges the JDBC reads split on, and how many partitions each read gets.

Pure Python (no Spark, no database): the arithmetic behind ``time_predicates`` / ``_ranges``
and ``share_connections`` / ``plan_partitions``. The same ranges on a real cluster:
``test_ranges_cluster.py``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ingest import Source
from spark_ingest._job import plan_partitions
from spark_ingest._sources import (
    _inbox_start,
    _ranges,
    partitions_for,
    share_connections,
    time_predicates,
    time_ranges,
)

US = dt.timedelta(microseconds=1)
PARIS = ZoneInfo("Europe/Paris")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ZONES = [
    dt.UTC,
    dt.timezone(dt.timedelta(hours=5, minutes=30)),
    PARIS,
    ZoneInfo("America/New_York"),
]
_PRED = re.compile(r"^x >= '([^']+)'::timestamptz AND x < '([^']+)'::timestamptz$")


def _parsed(preds: list[str]) -> list[tuple[dt.datetime, dt.datetime]]:
    """The ranges as PostgreSQL reads them back from the SQL text."""
    out = []
    for p in preds:
        m = _PRED.match(p)
        assert m, p
        a, b = (dt.datetime.fromisoformat(g) for g in m.groups())
        assert a.tzinfo is not None, p  # never a zone-less literal
        assert b.tzinfo is not None, p
        out.append((a, b))
    return out


def _check_tiling(
    ranges: list[tuple[dt.datetime, dt.datetime]], lo: dt.datetime, stop: dt.datetime, n: int
) -> None:
    """First edge lo, last stop, contiguous, increasing, never empty, never more than n."""
    assert ranges[0][0] == lo
    assert ranges[-1][1] == stop
    assert 1 <= len(ranges) <= max(1, n)
    for (_, b), (c, _) in itertools.pairwise(ranges):
        assert b == c  # contiguous: no gap, no overlap
    if stop > lo:
        assert all(a < b for a, b in ranges)  # no empty range, instants increasing
    else:
        assert len(ranges) == 1


instants = st.datetimes(
    min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2040, 1, 1), timezones=st.just(dt.UTC)
)


@settings(max_examples=300, deadline=None)
@given(
    lo=instants,
    span_us=st.one_of(st.integers(0, 50), st.integers(0, 10**12)),
    n=st.integers(1, 5000),
    zone=st.sampled_from(ZONES),
)
def test_ranges_tile_the_window_exactly(
    lo: dt.datetime, span_us: int, n: int, zone: dt.tzinfo
) -> None:
    lo = lo.astimezone(zone)
    hi = (lo.astimezone(dt.UTC) + span_us * US).astimezone(zone)
    ranges = _ranges(lo, hi, n)
    _check_tiling(ranges, lo, hi, n)
    assert len(ranges) == max(1, min(n, span_us))  # n > microseconds: one per microsecond
    sizes = [(b - a) // US for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1  # balanced to the microsecond
    _check_tiling(_parsed(time_predicates("x", lo, hi, n)), lo, hi, n)


@settings(max_examples=200, deadline=None)
@given(
    lo=instants,
    span_us=st.integers(0, 10**11),
    until_us=st.integers(-(10**11), 10**12),
    n=st.integers(1, 64),
)
def test_time_ranges_run_the_last_range_on_to_until(
    lo: dt.datetime, span_us: int, until_us: int, n: int
) -> None:
    hi, until = lo + span_us * US, lo + until_us * US
    ranges = time_ranges(lo, hi, n, until=until)
    _check_tiling(ranges, lo, until, n)
    # The split follows [lo, min(hi, until)): every edge but the last is below both.
    assert all(a <= min(hi, until) or a == lo for a, _ in ranges)
    assert _parsed(time_predicates("x", lo, hi, n, until=until)) == ranges


def test_every_microsecond_of_a_short_window_is_in_exactly_one_range() -> None:
    for span in range(0, 40):
        for n in (1, 2, 3, 7, 39, 40, 1000):
            ranges = _parsed(time_predicates("x", T0, T0 + span * US, n))
            for k in range(-2, span + 2):
                t = T0 + k * US
                hits = sum(a <= t < b for a, b in ranges)
                assert hits == (1 if 0 <= k < span else 0), (span, n, k)


def test_a_window_shorter_than_n_squared_microseconds_stays_inside_the_window() -> None:
    # (hi - lo) / n rounds to the nearest microsecond: 6 us / 10 -> 1 us, so the old edges ran
    # on to lo + 9 us, three ranges past hi, and the last range was inverted (lo+9us, lo+6us).
    hi = T0 + 6 * US
    ranges = _ranges(T0, hi, 10)
    assert [a for a, _ in ranges] == [T0 + k * US for k in range(6)]
    assert all(T0 <= a < b <= hi for a, b in ranges)
    # with until: nothing past until either
    until = T0 + 3 * US
    assert all(b <= until for _, b in time_ranges(T0, T0 + 100 * US, 1000, until=until))


def test_ranges_across_a_dst_change_are_instants_not_wall_clock() -> None:
    # Spring forward in Paris: 02:00-03:00 does not exist on 2026-03-29. Python adds a
    # timedelta to a zoned datetime on the wall clock, so the old edges 02:00 and 02:30 (in the
    # gap, read as +01:00) came after 03:00 (+02:00): two ranges overlapped and their rows were
    # read twice. The day is also 23 h long, not the 24 h the wall clock says.
    lo = dt.datetime(2026, 3, 29, tzinfo=PARIS)
    hi = dt.datetime(2026, 3, 30, tzinfo=PARIS)
    ranges = _parsed(time_predicates("x", lo, hi, 48))
    _check_tiling(ranges, lo, hi, 48)
    assert {b - a for a, b in ranges} == {dt.timedelta(hours=23) / 48}
    # Fall back (2026-10-25, 25 h): the repeated hour is covered once.
    lo, hi = dt.datetime(2026, 10, 25, tzinfo=PARIS), dt.datetime(2026, 10, 26, tzinfo=PARIS)
    ranges = _parsed(time_predicates("x", lo, hi, 50))
    _check_tiling(ranges, lo, hi, 50)
    assert sum((b - a for a, b in ranges), dt.timedelta()) == dt.timedelta(hours=25)


def test_the_inbox_margin_is_an_hour_of_instants_across_a_dst_change() -> None:
    # 03:30 CEST on the spring-forward day is 01:30 UTC; an hour on the wall clock before it,
    # 02:30, does not exist and read as 01:30 UTC: the inbox read lost its whole margin.
    lo = dt.datetime(2026, 3, 29, 3, 30, tzinfo=PARIS)
    assert _inbox_start(lo, dt.timedelta(hours=1)) == dt.datetime(2026, 3, 29, 0, 30, tzinfo=dt.UTC)


def test_predicates_are_written_in_utc() -> None:
    lo = dt.datetime(2026, 7, 1, 12, tzinfo=PARIS)
    (pred,) = time_predicates("x", lo, lo + dt.timedelta(hours=1), 1)
    assert pred == (
        "x >= '2026-07-01T10:00:00+00:00'::timestamptz AND "
        "x < '2026-07-01T11:00:00+00:00'::timestamptz"
    )


def test_a_naive_time_is_refused_not_read_in_the_executor_time_zone() -> None:
    naive = dt.datetime(2026, 1, 1)
    with pytest.raises(ValueError, match="has no time zone"):
        time_predicates("x", naive, naive + dt.timedelta(hours=1), 2)
    with pytest.raises(ValueError, match="has no time zone"):
        time_predicates("x", T0, T0 + dt.timedelta(hours=1), 2, until=naive)


def test_lo_equal_to_hi_is_one_empty_range() -> None:
    assert _ranges(T0, T0, 8) == [(T0, T0)]
    assert time_ranges(T0, T0, 8, until=T0 + US) == [(T0, T0 + US)]
    # until before lo: one range, which PostgreSQL finds empty
    assert time_ranges(T0, T0 + US, 4, until=T0 - US) == [(T0, T0 - US)]


# --- how many partitions --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "per", "parts"),
    [(0, 100, 1), (1, 100, 1), (100, 100, 1), (101, 100, 2), (10**6, 200_000, 5)],
)
def test_partitions_for_is_the_ceiling_one_at_least(rows: int, per: int, parts: int) -> None:
    assert partitions_for(rows, per) == parts


@given(wanted=st.lists(st.integers(0, 10**6), min_size=1, max_size=6), extra=st.integers(0, 50))
def test_share_connections_bounds_the_sum_and_keeps_one_each(wanted: list[int], extra: int) -> None:
    cap = len(wanted) + extra
    got = share_connections(wanted, cap)
    assert all(1 <= g <= max(1, w) for g, w in zip(got, wanted, strict=True))
    assert sum(got) <= cap
    if sum(max(1, w) for w in wanted) <= cap:
        assert got == [max(1, w) for w in wanted]
    else:
        assert sum(got) == cap  # the connections allowed are all used


def test_share_connections_refuses_more_reads_than_connections() -> None:
    with pytest.raises(ValueError, match="3 reads cannot share 2 connections"):
        share_connections([1, 1, 1], 2)


def test_plan_partitions_bounds_the_reads_of_one_database_together() -> None:
    outbox = Source("outbox", "jdbc:postgresql://db:5432/app", max_connections=6)
    same_db = Source("billing", "postgresql://DB/app", schema="billing", max_connections=4)
    other = Source("shipping", "jdbc:postgresql://db:5432/shipping", max_connections=3)
    # outbox and billing share db:5432/app: the smaller cap (4) bounds both reads together.
    assert plan_partitions([outbox, same_db, other], [10, 10, 10]) == (2, 2, 3)
    assert plan_partitions([outbox, same_db, other], [3, 1, 2]) == (3, 1, 2)
    assert plan_partitions([outbox, same_db, other], [9, 1, 1]) == (3, 1, 1)
