"""Percentiles read from the log-scale histogram groups (pure logic, no Spark session)."""

from __future__ import annotations

import itertools
import math

from spark_ingest._outcomes import _percentiles


def test_one_bucket_split_over_groups_reports_its_largest_latency_in_any_order() -> None:
    # 9.99 and 10.03 ms share log bucket floor(64 * log2(ms)) = 212 but fall on either side of
    # the report's 10 ms edge, so they come in two groups of the same bucket.
    bucket = math.floor(64 * math.log2(10.0))
    assert math.floor(64 * math.log2(9.99)) == bucket == math.floor(64 * math.log2(10.03))
    groups = [
        {"bucket": bucket, "n": 1, "max_ms": 9.99},
        {"bucket": bucket, "n": 1, "max_ms": 10.03},
        {"bucket": bucket - 200, "n": 98, "max_ms": 1.0},
    ]
    for order in itertools.permutations(groups):
        got = _percentiles(order)
        assert (got["p50_ms"], got["p99_ms"], got["max_ms"]) == (1.0, 10.03, 10.03), order


def test_percentiles_of_an_empty_leg_are_none() -> None:
    assert _percentiles([{"bucket": None, "n": 3, "max_ms": None}]) == {
        "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None,
    }  # fmt: skip
