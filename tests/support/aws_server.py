"""Amazon SQS and SNS for the tests: moto's server mode (``moto[server]``, a test dependency),
in its own process on a free port, driven through boto3 exactly as AWS would be.

One server per test process, started on first use and stopped (by its handle) when the process
exits; tests isolate themselves with unique queue and topic names. Credentials reach the
clients the way they reach them on AWS, through the default chain: the environment variables
below hold dummy values, so no test can sign a request with a developer's real keys.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

from tests.support.server_process import free_port, start_server, stop
from tests.support.services import missing

__all__ = ["REGION", "aws_env", "client", "endpoint", "launch", "put_back", "stop"]

REGION = "us-east-1"
_started: tuple[subprocess.Popen[bytes], str] | None = None


def aws_env() -> None:
    """Dummy credentials and the region, where boto3's default chain finds them."""
    os.environ["AWS_ACCESS_KEY_ID"] = "testing"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"  # moto accepts any key
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    os.environ["AWS_DEFAULT_REGION"] = REGION
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # never wait on an instance profile


def launch(port: int) -> subprocess.Popen[bytes]:
    """A moto server on 127.0.0.1:``port``; stopped at exit in any case."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        missing("moto server (SQS, SNS)", "pip install 'moto[server]' (part of the 'test' extra)")
    return start_server(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        port=port,
        service="moto server (SQS, SNS)",
    )


def endpoint() -> str:
    """The endpoint URL of this process's moto server, started on first use."""
    global _started
    aws_env()
    if _started is None or _started[0].poll() is not None:
        port = free_port()
        _started = (launch(port), f"http://127.0.0.1:{port}")
    return _started[1]


def client(service: str) -> Any:
    """A boto3 client of ``service`` ("sqs", "sns") on the moto server."""
    try:
        import boto3
    except ImportError:
        missing("boto3", "pip install 'outbox-inbox[aws]'")
    return boto3.client(service, endpoint_url=endpoint(), region_name=REGION)


def put_back(database_url: str, sqs: Any, queue_url: str, consumer: str) -> int:
    """After a ``kill -9`` and restart of moto: put back into ``queue_url`` (a FIFO queue) what
    Amazon SQS would still hold and moto lost with its process. That is every message the
    relays had confirmed (its outbox row marked published) that ``consumer`` has not finished
    (applied, or recorded dead), each key in seq order, with its own id as the dedup id.
    Returns how many were put back. Call it once the relays' sends to the killed server have
    ended (they fail at once, their connections reset) and before clients reach the new one.

    moto keeps queues, messages and the FIFO dedup ids in memory, where AWS stores a message
    redundantly before SendMessage returns; so a ``kill -9`` of moto is not AWS's failure mode,
    and this stands in for its durability. What a test then checks is the rest of the chain:
    sends in flight at the kill (unconfirmed: the relay sends them again), an empty server with
    no dedup history (a repeat of an id is not dropped there: the inbox's duplicate check
    drops it), a consumer holding receipt handles the new server does not know (its deletes
    and visibility changes fail: those messages come back as duplicates), and clients that see
    connections refused, then an endpoint that answers again. Not modelled: a message AWS would
    redeliver after its visibility timeout although its consumer committed it (its delete
    lost: here it is not put back); SQS's own order of redelivery within a group after a
    failure of its servers; throttling."""
    import psycopg

    from outbox.envelope import Envelope
    from outbox.wire import sqs as wire

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT m.id, m.topic, m.key, m.seq, m.payload, m.content_type, m.headers, "
            "m.traceparent, m.created_at FROM outbox_messages AS m "
            "WHERE m.status = 'published' AND NOT EXISTS (SELECT 1 FROM inbox_messages AS i "
            "WHERE i.consumer = %s AND i.message_id = m.id AND i.status IN ('processed', "
            "'dead')) ORDER BY m.key, m.seq",
            (consumer,),
        ).fetchall()
    for start in range(0, len(rows), 10):
        entries = []
        for n, row in enumerate(rows[start : start + 10]):
            env = Envelope(id=row[0], topic=row[1], key=row[2], seq=int(row[3]),
                           payload=bytes(row[4]), content_type=row[5], headers=row[6],
                           traceparent=row[7], created_at=row[8])  # fmt: skip
            msg = wire.encode(env)
            entries.append({"Id": str(n), "MessageBody": msg.body,
                            "MessageAttributes": msg.attributes, "MessageGroupId": msg.group_id,
                            "MessageDeduplicationId": msg.deduplication_id})  # fmt: skip
        failed = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries).get("Failed")
        assert not failed, failed
    return len(rows)
