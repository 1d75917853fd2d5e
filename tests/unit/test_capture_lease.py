"""The capture lease's local decisions (relay/_capture_lease.py): when a holder must stop, how
long its sends may run, how often a standby looks. The database side is tested live in
tests/capture/test_capture_takeover.py."""

from __future__ import annotations

import time

import pytest

from relay._capture_lease import CaptureLease, standby_interval
from relay._statements import relay_statements
from relay.exceptions import CaptureLeaseLostError


def _lease(seconds: float, renewed_ago: float) -> CaptureLease:
    lease = CaptureLease(relay_statements(None), "slot", "relay-1", seconds)
    lease._renewed = time.monotonic() - renewed_ago
    return lease


def test_a_recently_renewed_lease_holds_and_bounds_the_sends() -> None:
    lease = _lease(4.0, renewed_ago=1.0)
    lease.check()
    deadline = lease.publish_deadline(10.0)
    assert deadline <= time.monotonic() + 4.0 * 0.9 - 1.0 + 0.01  # the lease, not the timeout
    assert lease.publish_deadline(0.5) <= time.monotonic() + 0.5


def test_a_holder_stops_before_a_standby_may_take_over() -> None:
    lease = _lease(4.0, renewed_ago=3.7)  # 90 % of the lease: a standby takes over at 100 %
    with pytest.raises(CaptureLeaseLostError, match=r"no heartbeat for 3\.7s"):
        lease.check()
    assert lease.lost is not None
    lease._renewed = time.monotonic()  # a lost lease stays lost
    with pytest.raises(CaptureLeaseLostError):
        lease.check()


@pytest.mark.parametrize(("lease", "interval"), [(30.0, 0.25), (1.0, 0.1), (0.05, 0.02)])
def test_a_standby_looks_often_enough_to_take_over_within_the_lease(
    lease: float, interval: float
) -> None:
    assert standby_interval(lease) == pytest.approx(interval)
