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

__all__ = ["REGION", "aws_env", "client", "endpoint", "launch", "stop"]

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
