"""Consumer runners against the live brokers of this machine (Kafka: librdkafka mock cluster).

* duplicate storm: every message published 1-5 times, consumed concurrently by two consumer OS
  processes (tests/inbox/storm_worker.py: own broker connection, own database pool), one message
  failing once in each: exactly one effect per message, and the failed one redelivered and
  processed.
* crash between commit and ack: the delivery is redelivered to a fresh runner and found a
  duplicate: still one effect.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, Outcome
from inbox.testing import ResultLog, wait_until_processed
from outbox.envelope import Envelope
from tests.inbox.broker_fixtures import BROKERS, Broker, Kafka
from tests.inbox.inbox_helpers import FailOnce, effects, inbox_rows, make_envelope
from tests.support.services import require_port


class Crash(Exception):
    """Raised between the database commit and the broker ack."""


def _broker(name: str) -> Broker:
    broker = BROKERS[name]()
    if broker.port:
        require_port(broker.port, name)
    return broker


#: run as a module from the repository root, so it imports the tests' helpers as a package
WORKER = "tests.inbox.storm_worker"
ROOT = Path(__file__).resolve().parents[2]


class _Workers:
    """The consumer processes' output lines, gathered as they come, and waits on them."""

    def __init__(self, procs: list[Any]) -> None:
        self.procs = procs
        self.lines: list[list[bytes]] = [[] for _ in procs]
        self.changed = asyncio.Event()
        self.pumps = [asyncio.create_task(self._pump(i)) for i in range(len(procs))]

    async def _pump(self, i: int) -> None:
        while line := await self.procs[i].stdout.readline():
            self.lines[i].append(line.strip())
            self.changed.set()

    def count(self, line: bytes) -> int:
        return sum(out.count(line) for out in self.lines)

    def settled(self) -> int:
        return sum(1 for out in self.lines for line in out if line.startswith(b"settled "))

    async def wait_for(self, condition: Callable[[], bool], within: float, what: str) -> None:
        async with asyncio.timeout(within):
            while not condition():
                if all(p.done() for p in self.pumps):
                    raise AssertionError(f"workers exited before {what}: {self.lines}")
                self.changed.clear()
                await self.changed.wait()

    async def stop(self) -> list[dict[str, Any]]:
        """SIGTERM (graceful: the message in hand is finished), then each one's report."""
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await asyncio.gather(*self.pumps)
            codes = [await proc.wait() for proc in self.procs]
        assert codes == [0, 0], self.lines
        return [json.loads([ln for ln in out if ln.startswith(b"{")][-1]) for out in self.lines]


async def _start_worker(broker: Broker, url: str, instance: int, fail_once: uuid.UUID) -> Any:
    arg = {"broker": broker.spec(), "url": url, "instance": instance, "fail_once": [str(fail_once)]}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        WORKER,
        json.dumps(arg),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=ROOT,
    )


async def _run_storm(broker: Broker, url: str) -> tuple[list[Envelope], list[dict[str, Any]]]:
    """Two consumer OS processes of one consumer ('svc'), each with its own broker connection
    and database pool, against every message published 1-5 times in shuffled order."""
    rng = random.Random(11)
    messages = [make_envelope(key=f"k{i}", seq=1, payload=b'{"i": %d}' % i) for i in range(12)]
    copies = [m for m in messages for _ in range(rng.randint(1, 5))]
    rng.shuffle(copies)
    await broker.setup()
    procs: list[Any] = []
    try:
        procs = [await _start_worker(broker, url, i, messages[0].id) for i in range(2)]
        workers = _Workers(procs)
        await workers.wait_for(lambda: workers.count(b"ready") == 2, 30, "subscribing")
        await broker.publish(copies)
        # every copy settled, plus each failed delivery redelivered and settled again
        await workers.wait_for(
            lambda: workers.settled() >= len(copies) + workers.count(b"settled failed"),
            60,
            "settling every delivery",
        )
        ids = [m.id for m in messages]
        await asyncio.to_thread(wait_until_processed, url, consumer="svc", ids=ids, timeout=30)
        reports = await workers.stop()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await broker.teardown()
    return copies, reports


@pytest.mark.parametrize("name", list(BROKERS))
def test_duplicate_storm_across_two_processes_one_effect_per_message(
    effects_url: str, name: str
) -> None:
    broker = _broker(name)
    copies, reports = asyncio.run(_run_storm(broker, effects_url))
    applied = [row[1] for row in effects(effects_url, "svc")]
    assert len(applied) == len(set(applied)) == 12
    outcomes: Counter[str] = Counter()
    for report in reports:
        outcomes.update(report["outcomes"])
    assert outcomes[Outcome.PROCESSED.value] == 12  # across both processes, once per message
    assert sum(outcomes.values()) >= len(copies)  # every copy was delivered and settled
    # the injected failure happened (once per process that received the message); each one was
    # redelivered (FAILED) or, if the other process processed the message meanwhile, settled as
    # a DUPLICATE
    raised = sum(report["failures_raised"] for report in reports)
    assert 1 <= raised <= 2
    assert outcomes[Outcome.FAILED.value] <= raised
    rows = inbox_rows(effects_url, "svc")
    assert sorted(rows) == sorted({m.id for m in copies})
    assert {r[0] for r in rows.values()} == {"processed"}


async def _run_crash(broker: Broker, url: str) -> tuple[ResultLog, ResultLog]:
    first_msg, second_msg = make_envelope(), make_envelope(key="k2")
    handler = FailOnce()
    crashed, after = ResultLog(), ResultLog()

    def crash(env: Any, result: Any) -> None:
        crashed(env, result)
        raise Crash  # after the commit, before the ack

    await broker.setup()
    try:
        async with AsyncConnectionPool(url, min_size=1, max_size=2, open=False) as pool:
            runner = AsyncHandlerRunner(pool, handler, consumer="svc")
            doomed = broker.consumer(runner, crash, 0)
            task = asyncio.create_task(doomed.run())
            async with asyncio.timeout(20):
                await doomed.ready.wait()
            await broker.publish([first_msg])
            await crashed.wait_count(1, within=20)
            doomed.stop()  # the crashed runner goes away without acknowledging
            with pytest.raises(Crash):
                await task
            fresh = broker.consumer(runner, after, 0)
            task = asyncio.create_task(fresh.run())
            await broker.publish([second_msg])
            await after.wait_processed([second_msg.id], within=30)
            if not getattr(broker, "offsets_in_db", False):
                await after.wait_processed([first_msg.id], within=30)
            fresh.stop()
            await task
    finally:
        await broker.teardown()
    return crashed, after


@pytest.mark.parametrize("name", list(BROKERS))
def test_crash_between_commit_and_ack_redelivers_without_second_effect(
    effects_url: str, name: str
) -> None:
    broker = _broker(name)
    crashed, after = asyncio.run(_run_crash(broker, effects_url))
    first_id = crashed.results[0][0].id
    assert crashed.outcomes(Outcome.PROCESSED) == [first_id]
    assert first_id in after.outcomes(Outcome.DUPLICATE)  # redelivered, no second effect
    assert len(effects(effects_url, "svc")) == 2


def test_kafka_offsets_in_db_resume_after_crash_without_redelivery(effects_url: str) -> None:
    """Offsets stored with the effect: the crashed message is not even redelivered."""
    broker = Kafka()
    broker.offsets_in_db = True
    crashed, after = asyncio.run(_run_crash(broker, effects_url))
    assert [r.outcome for _, r in after.results] == [Outcome.PROCESSED]  # only the new one
    assert crashed.results[0][1].outcome is Outcome.PROCESSED
    with psycopg.connect(effects_url) as conn:
        rows = conn.execute("SELECT consumer, next_offset FROM inbox_kafka_offsets").fetchall()
    # the two messages' partitions, each resumed after its one message (or one partition: 2)
    assert sorted(rows) in ([("svc", 1), ("svc", 1)], [("svc", 2)])
    assert len(effects(effects_url, "svc")) == 2
