"""Three ordered consumer processes (real subprocesses, tests/support/scale_worker.py) under one
consumer name, fed by a real ``outbox relay`` process, on the brokers that hand a key to one
consumer at a time: Kafka (tansu; a consumer group over a topic of 6 partitions) and SQS FIFO
(moto; a message group per key). Messages keep coming until every process has applied some;
then every message is applied once, each key in order, and no key's handler ran in two
processes at overlapping times (checked from the handler's own table of start and end
times)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.relay.relay_helpers import write
from tests.support.poll import wait_for
from tests.support.scale_out import SCHEMA, applied, check, spawn, stop
from tests.support.services import import_or_missing

PROCESSES = 3


@pytest.fixture
def scale_url(database_url: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return database_url


Worker = Callable[[int], "subprocess.Popen[bytes]"]


def _share(url: str, topic: str, relay_broker: str, start_worker: Worker, log_dir: Path,
           rate: float, keys: int, waves: int, relay_env: dict[str, str] | None = None,
           ) -> tuple[list[uuid.UUID], set[int]]:  # fmt: skip
    """Start the workers and a relay; write a wave (one message per key) every ``rate``
    seconds until every worker has applied some (``waves`` waves at least), then wait for all
    of them to be applied."""
    workers = [start_worker(i) for i in range(PROCESSES)]
    with open(log_dir / "relay.log", "ab") as out:
        relay = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", "relay", "--url", url, "--broker", relay_broker,
             "--poll-interval", "0.1", "--batch-size", "100"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(relay_env or {})},
        )  # fmt: skip
    ids: list[uuid.UUID] = []
    pids = {w.pid for w in workers}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ids += write(url, [(topic, f"k{k}") for k in range(keys)])
            working = {r.pid for r in applied(url, "svc")}
            if working >= pids and len(ids) >= waves * keys:
                break
            assert all(w.poll() is None for w in workers), f"a worker exited: see {log_dir}"
            time.sleep(rate)
        wait_for(lambda: len({r.message_id for r in applied(url, "svc")}) >= len(ids),
                 timeout=180, what="every message applied")  # fmt: skip
    finally:
        stop([relay, *workers])
    return ids, pids


def _assert_shared(url: str, ids: list[uuid.UUID], pids: set[int]) -> None:
    rows = applied(url, "svc")
    result = check(rows, ids)
    assert result.lost == 0, result
    assert result.duplicates == 0, result
    assert result.order_violations == 0, result
    assert result.overlaps == 0, result
    assert set(result.per_process) == pids, result  # each process took a share
    by_key: dict[str, list[int]] = {}
    for r in rows:
        by_key.setdefault(r.key, []).append(r.seq)
    assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in by_key.values()), by_key


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path


def test_kafka_group_members_share_the_topic_one_process_per_key(
    scale_url: str, log_dir: Path
) -> None:
    import_or_missing("confluent_kafka", "kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.support.kafka_broker import bootstrap

    server = bootstrap()
    topic = f"scale-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": server})
    (created,) = admin.create_topics([NewTopic(topic, 6, 1)]).values()
    created.result(10)

    def worker(i: int) -> subprocess.Popen[bytes]:
        return spawn(scale_url, "kafka", server, topic, "svc", log_dir / f"worker{i}.log",
                     delay_ms=2, session_ms=6000)  # fmt: skip

    ids, pids = _share(scale_url, topic, f"kafka://{server}", worker, log_dir, rate=0.2, keys=24,
                       waves=20)  # fmt: skip
    _assert_shared(scale_url, ids, pids)


def test_sqs_fifo_receivers_share_the_queue_one_process_per_group(
    scale_url: str, log_dir: Path
) -> None:
    import tests.support.aws_server as aws_server

    sqs = aws_server.client("sqs")
    queue = f"scale-{uuid.uuid4().hex[:10]}.fifo"
    sqs.create_queue(QueueName=queue, Attributes={"FifoQueue": "true"})
    endpoint = aws_server.endpoint()
    topic = "orders"

    def worker(i: int) -> subprocess.Popen[bytes]:
        return spawn(scale_url, "sqs", endpoint, queue, "svc", log_dir / f"worker{i}.log",
                     delay_ms=2)  # fmt: skip

    broker = f"sqs://{aws_server.REGION}?endpoint={endpoint}&destination={queue}"
    # moto scans a queue on every call, and answers slowly on a busy machine: a smaller,
    # gentler load than Kafka's, and time for each send (as the fault suite gives it)
    slow = {"OUTBOX_RELAY_PUBLISH_TIMEOUT": "10"}
    ids, pids = _share(scale_url, topic, broker, worker, log_dir, rate=0.5, keys=12, waves=10,
                       relay_env=slow)  # fmt: skip
    _assert_shared(scale_url, ids, pids)
