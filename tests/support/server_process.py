"""A server the tests start as a subprocess: on a free port, awaited until it listens, stopped
by its handle (at exit in any case).

The moto server (aws_server) and the Kafka broker (kafka_broker) start this way; a server that
does not come up skips the test (or fails it, with OUTBOX_REQUIRE_SERVICES) with its log's tail.
"""

from __future__ import annotations

import atexit
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence

from tests.support.services import missing

__all__ = ["free_port", "listening", "start_server", "stop"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on ``host:port``."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def start_server(
    argv: Sequence[str],
    *,
    port: int,
    service: str,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Run ``argv`` (its output to a log file) and return once ``port`` accepts connections.

    ``service`` names the server in the skip (or failure) when it exits or does not listen
    within ``timeout`` seconds; the process is stopped at exit in any case."""
    log = tempfile.NamedTemporaryFile(prefix="server-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(
        list(argv), stdout=log, stderr=subprocess.STDOUT, env=None if env is None else dict(env)
    )
    log.close()
    atexit.register(stop, proc)
    deadline = time.monotonic() + timeout
    while not listening(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            with open(log.name, "rb") as f:
                tail = f.read()[-2000:].decode("utf-8", "replace")
            missing(service, f"it did not start on port {port}: {tail}")
        time.sleep(0.05)  # nothing to wait on but the listening socket
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` (killed after 10 s) and reap it; nothing if it has exited."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
