"""The claim check configured as an operator deploys the relay: the ``[claim_check]`` table of
its TOML file (and ``OUTBOX_CLAIM_CHECK_*``), no Python.

* A relay built from its file alone (RelayConfig.load + the CLI's make_publisher) uploads a
  payload over the threshold to the store (a directory; S3 on moto's server) and publishes a
  reference to NATS; a consumer resolving over the same store applies the payload whole.
* ``outbox relay check`` says whether the store can take objects, in one line.
* A bad table is one line naming the file and the table, at start; a secret in it is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from inbox import AsyncHandlerRunner, ClaimCheckResolver, NatsConsumer
from inbox.testing import ResultLog
from outbox import Message, publish_batch
from outbox.claimcheck import DirectoryStore, ObjectStore, S3Store
from outbox.exceptions import ConfigurationError
from relay import ClaimCheckPublisher, Relay, RelayConfig
from relay.cli import make_publisher
from tests.relay.relay_helpers import running
from tests.support.ledger import record
from tests.support.services import import_or_missing, require_port

OUTBOX = str(Path(sys.executable).with_name("outbox"))
BIG = 2 * 1024 * 1024  # over NATS's 1 MiB max_payload


def _toml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _no_outbox_env() -> dict[str, str]:
    return {k: "" for k in os.environ if k.startswith("OUTBOX_")}  # the file alone


def _relay_file(tmp_path: Path, url: str, subject: str, claim_check: str) -> Path:
    return _toml(tmp_path / "relay.toml", f"""
[relay]
database_url = "{url}"
relay_id = "cc-{uuid.uuid4().hex[:6]}"
poll_interval = 0.2
publish_timeout = 30
lease_seconds = 60

[broker]
url = "nats://127.0.0.1:4222"

[broker.destinations]
"*" = "{subject}"

[claim_check]
{claim_check}
""")  # fmt: skip


async def _relay_to_consumer(
    cfg: Path, store: ObjectStore, url: str, ids: list[Any], stream: str, subject: str
) -> tuple[ClaimCheckPublisher, list[Any]]:
    config = RelayConfig.load(cfg, env=_no_outbox_env())
    publisher = make_publisher(config)
    assert isinstance(publisher, ClaimCheckPublisher)
    applied: list[Any] = []

    async def handler(conn: psycopg.AsyncConnection[Any], env: Any) -> None:
        applied.append((env.id, len(env.payload), hashlib.sha256(env.payload).hexdigest()))

    log = ResultLog()
    async with AsyncConnectionPool(url, min_size=1, max_size=3, open=False) as pool:
        runner = AsyncHandlerRunner(pool, handler, consumer=f"cc-{uuid.uuid4().hex[:6]}")
        consumer = NatsConsumer(runner, stream=stream, durable=f"d{uuid.uuid4().hex[:8]}",
                                subject=subject, redeliver_delay=0.2, on_result=log,
                                claim_check=ClaimCheckResolver(store))  # fmt: skip
        task = asyncio.create_task(consumer.run())
        async with running(Relay(config, publisher)):
            await log.wait_processed(ids, within=60)
        consumer.stop()
        await task
    return publisher, applied


def _write(url: str) -> tuple[list[Any], list[bytes]]:
    big = {"blob": "x" * BIG}
    with psycopg.connect(url) as conn:
        ids = publish_batch(conn, [Message(topic="docs", key="k", payload=big),
                                   Message(topic="docs", key="k", payload={"n": 1})],
                            max_payload_bytes=4 * BIG)  # fmt: skip
        conn.commit()
        assert record(url) == 2  # numbered and recorded, as a relay does
        rows = conn.execute("SELECT id, payload FROM outbox_messages WHERE id = ANY(%s)", (ids,))
        bodies = dict(rows.fetchall())
    return ids, [bytes(bodies[i]) for i in ids]


def _assert_whole(applied: list[Any], ids: list[Any], bodies: list[bytes]) -> None:
    assert sorted(applied) == sorted(
        (i, len(b), hashlib.sha256(b).hexdigest()) for i, b in zip(ids, bodies, strict=True)
    )


def test_a_relay_configured_by_its_file_claim_checks_through_a_directory(
    url: str, tmp_path: Path
) -> None:
    """A 2 MiB payload (NATS takes 1 MiB) goes through the [claim_check] directory and is
    applied whole; the small one on the same key goes as it is."""
    import_or_missing("nats", "nats")
    require_port(4222, "NATS")
    from tests.relay.broker_helpers import nats_stream

    objects = tmp_path / "objects"
    ids, bodies = _write(url)

    async def go() -> tuple[ClaimCheckPublisher, list[Any]]:
        async with nats_stream("ccfg") as (_js, stream, subject):
            cfg = _relay_file(tmp_path, url, subject,
                              f'store = "directory"\ndirectory = "{objects}"\n'
                              'threshold = 65536\nprefix = "big/"')  # fmt: skip
            return await _relay_to_consumer(cfg, DirectoryStore(objects), url, ids, stream,
                                            subject)  # fmt: skip

    publisher, applied = asyncio.run(go())
    _assert_whole(applied, ids, bodies)
    assert publisher.uploaded == 1
    assert [p.name for p in (objects / "big" / "docs").iterdir()] == [str(ids[0])]


def test_a_relay_configured_by_its_file_claim_checks_through_s3(url: str, tmp_path: Path) -> None:
    """The same through S3 on moto's server; the credentials come from the environment only."""
    import_or_missing("nats", "nats")
    import_or_missing("boto3", "aws")
    require_port(4222, "NATS")
    from tests.relay.broker_helpers import nats_stream
    from tests.support import aws_server

    endpoint = aws_server.endpoint()
    bucket = f"cc-{uuid.uuid4().hex[:10]}"
    aws_server.client("s3").create_bucket(Bucket=bucket)
    ids, bodies = _write(url)
    table = (f'store = "s3"\nbucket = "{bucket}"\nendpoint_url = "{endpoint}"\n'
             f'region = "{aws_server.REGION}"\n[claim_check.topics]\ndocs = 100000')  # fmt: skip

    async def go() -> tuple[ClaimCheckPublisher, list[Any]]:
        async with nats_stream("ccs3") as (_js, stream, subject):
            cfg = _relay_file(tmp_path, url, subject, table)
            store = S3Store(bucket, region=aws_server.REGION, endpoint_url=endpoint)
            return await _relay_to_consumer(cfg, store, url, ids, stream, subject)

    publisher, applied = asyncio.run(go())
    _assert_whole(applied, ids, bodies)
    assert publisher.uploaded == 1
    listed = aws_server.client("s3").list_objects_v2(Bucket=bucket)["Contents"]
    assert [o["Key"] for o in listed] == [f"outbox/docs/{ids[0]}"]


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OUTBOX, *argv], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **_no_outbox_env(), **env},
    )  # fmt: skip


def test_relay_check_says_whether_the_store_takes_objects(url: str, tmp_path: Path) -> None:
    require_port(4222, "NATS")
    writable = tmp_path / "objects"
    writable.mkdir()
    cfg = _relay_file(tmp_path, url, "cc.check",
                      f'store = "directory"\ndirectory = "{writable}"')  # fmt: skip
    done = _run("relay", "check", "--config", str(cfg))
    lines = [line for line in done.stdout.splitlines() if "claim check store" in line]
    assert lines == [f"claim check store DirectoryStore('{writable}', bucket='local'): ok, "
                     f"{writable} is writable"], done.stdout + done.stderr  # fmt: skip
    assert not list(writable.iterdir())  # the probe left nothing behind

    import_or_missing("boto3", "aws")
    from tests.support import aws_server

    endpoint = aws_server.endpoint()
    cfg = _relay_file(tmp_path, url, "cc.check",
                      f'store = "s3"\nbucket = "no-such-{uuid.uuid4().hex[:8]}"\n'
                      f'endpoint_url = "{endpoint}"\nregion = "us-east-1"')  # fmt: skip
    done = _run("relay", "check", "--config", str(cfg))
    lines = [line for line in done.stdout.splitlines() if "claim check store" in line]
    assert done.returncode == 1
    assert len(lines) == 1, done.stdout
    assert ": FAILED: ClientError" in lines[0], lines
    assert "404" in lines[0] or "Not Found" in lines[0], lines


@pytest.mark.parametrize(
    ("table", "env", "expected"),
    [
        ('store = "directory"\ndirectory = "/tmp/x"\nthreshhold = 10',
         {}, "[claim_check]: unknown key 'threshhold' (did you mean 'threshold'?)"),
        ('store = "gcs"\nbucket = "b"', {}, 'store must be one of "s3", "directory"'),
        ('store = "s3"\nbucket = "b"\naws_secret_access_key = "hunter2-secret"', {},
         "aws_secret_access_key does not belong in the configuration: S3 credentials come "
         "from the environment"),
        ('store = "s3"', {}, 'store = "s3" needs bucket'),
        ('store = "directory"\ndirectory = "/tmp/x"\nthreshold = -1', {},
         "threshold must be a number of bytes >= 0, got -1"),
        ('store = "directory"\ndirectory = "/tmp/x"', {"OUTBOX_CLAIM_CHECK_THRESHOLD": "lots"},
         "OUTBOX_CLAIM_CHECK_THRESHOLD"),
        ('store = "s3"\nbucket = "b"', {"OUTBOX_CLAIM_CHECK_AWS_SECRET_ACCESS_KEY": "x"},
         "S3 credentials are not relay settings"),
    ],
)  # fmt: skip
def test_a_bad_claim_check_setting_is_one_line_at_start(
    tmp_path: Path, table: str, env: dict[str, str], expected: str
) -> None:
    cfg = _toml(tmp_path / "relay.toml", f'database_url = "postgresql://nowhere/db"\n'
                f'broker = "stdout:"\n[claim_check]\n{table}\n')  # fmt: skip
    done = _run("relay", "--config", str(cfg), **env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert expected in lines[0]
    assert "hunter2" not in done.stderr
    if not env:
        assert f"config file {cfg}: [claim_check]" in lines[0]


def test_the_variables_build_the_claim_check_over_the_file(tmp_path: Path) -> None:
    """OUTBOX_CLAIM_CHECK_* win over the table; the daemon's publisher carries the result."""
    cfg = _toml(tmp_path / "relay.toml", 'database_url = "postgresql://h/db"\nbroker = "stdout:"\n'
                f'[claim_check]\nstore = "directory"\ndirectory = "{tmp_path}"\n'
                'threshold = 10\n')  # fmt: skip
    env = {"OUTBOX_CLAIM_CHECK_THRESHOLD": "500", "OUTBOX_CLAIM_CHECK_TOPICS": "a=0,b=7"}
    publisher = make_publisher(RelayConfig.load(cfg, env=env))
    assert isinstance(publisher, ClaimCheckPublisher)
    claim = publisher.claim_check
    assert (claim.threshold, dict(claim.topics)) == (500, {"a": 0, "b": 7})
    assert isinstance(claim.store, DirectoryStore)
    assert claim.store.root == tmp_path.resolve()
    with pytest.raises(ConfigurationError, match="OUTBOX_CLAIM_CHECK_TOPICS must be"):
        RelayConfig.load(cfg, env={"OUTBOX_CLAIM_CHECK_TOPICS": "a=lots"})


def test_the_how_tos_config_file_builds_the_claim_check(tmp_path: Path) -> None:
    """The [claim_check] TOML of docs/how-to/claim-check.md is a config the relay accepts."""
    import_or_missing("boto3", "aws")
    page = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "claim-check.md"
    blocks = re.findall(r"^```toml\n(.*?)^```", page.read_text(), flags=re.DOTALL | re.M)
    shown = next(b for b in blocks if "[claim_check]" in b)
    config = RelayConfig.load(_toml(tmp_path / "relay.toml", shown), env={})
    publisher = make_publisher(config)
    assert isinstance(publisher, ClaimCheckPublisher)
    store = publisher.claim_check.store
    assert isinstance(store, S3Store)
    assert (store.bucket, store.region) == ("acme-outbox-payloads", "eu-west-1")
    assert dict(publisher.claim_check.topics) == {"invoices.pdf": 0}
