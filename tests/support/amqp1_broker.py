"""A real AMQP 1.0 broker for the tests: a private RabbitMQ node with its bundled
``rabbitmq_amqp1_0`` plugin, on free ports, in a temporary directory.

The machine's own RabbitMQ node (5672) is never touched: the private node has its own node name,
ports, data and log directories, enabled-plugins file, configuration and Erlang cookie (its
``HOME`` is the temporary directory). Started as the ``rabbitmq`` user when the tests run as
root. One node per test process, started on first use, stopped (``rabbitmqctl stop``, then by
its pid) when the process exits. :meth:`Node.kill` is a ``kill -9`` of the node's Erlang VM;
:meth:`Node.restart` brings it back on the same port with the same data.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.support.server_process import free_port, listening
from tests.support.services import missing

__all__ = ["Node", "node"]

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
HOW = "install Debian's rabbitmq-server (3.8+; it bundles the rabbitmq_amqp1_0 plugin)"


class Node:
    """A private RabbitMQ node speaking AMQP 1.0 (and 0-9-1) on ``port``."""

    def __init__(self) -> None:
        if not SERVER.exists() or not CTL.exists() or shutil.which("erl") is None:
            missing("RabbitMQ (for its AMQP 1.0 plugin)", HOW)
        if shutil.which("openssl") is None:  # the TLS listener's certificates
            missing("openssl", "install openssl (Debian: apt-get install openssl)")
        self.name = f"outbox_amqp1_{os.getpid()}_{uuid.uuid4().hex[:6]}@localhost"
        self.port = free_port()
        self.tls_port = free_port()
        self.dist_port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-amqp1-"))
        self._user = "rabbitmq" if os.geteuid() == 0 else None
        self.ca = self._certificates()
        (self.dir / "env.conf").write_text("")  # not the machine's rabbitmq-env.conf
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            f"listeners.ssl.1 = 127.0.0.1:{self.tls_port}\n"
            f"ssl_options.cacertfile = {self.ca}\n"
            f"ssl_options.certfile = {self.dir / 'server.pem'}\n"
            f"ssl_options.keyfile = {self.dir / 'server.key'}\n"
            "ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n"
            "log.console = false\nlog.file.level = warning\n"
        )
        (self.dir / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            for path in [self.dir, *self.dir.iterdir()]:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)
        self.start()

    def _certificates(self) -> Path:
        """A test CA and a server certificate for localhost and 127.0.0.1 (the TLS listener)."""
        d = self.dir

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-subj", "/CN=outbox test CA", "-keyout", "ca.key", "-out", "ca.pem")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                "-keyout", "server.key", "-out", "server.csr")
        (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.pem")
        return d / "ca.pem"  # fmt: skip

    @property
    def tls_url(self) -> str:
        return f"amqp1s://guest:guest@localhost:{self.tls_port}"  # the certificate's name

    @property
    def url(self) -> str:
        return f"amqp1://guest:guest@127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        d = str(self.dir)
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": d,  # the node's own Erlang cookie
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": f"{d}/env.conf",
            "RABBITMQ_CONFIG_FILE": f"{d}/rabbitmq.conf",
            "RABBITMQ_ADVANCED_CONFIG_FILE": f"{d}/advanced.config",
            "RABBITMQ_MNESIA_BASE": f"{d}/mnesia",
            "RABBITMQ_LOG_BASE": f"{d}/log",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{d}/enabled_plugins",
            "RABBITMQ_PLUGINS_EXPAND_DIR": f"{d}/plugins-expand",
            "RABBITMQ_PID_FILE": f"{d}/node.pid",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self) -> None:
        """Start the node and wait (up to 60 s) until it takes connections."""
        out = open(self.dir / "server.out", "ab")  # noqa: SIM115 - kept by the child
        self.proc = subprocess.Popen(
            [str(SERVER)], env=self._env(), cwd=self.dir, stdout=out, stderr=subprocess.STDOUT,
            user=self._user, group=self._user, start_new_session=True,
        )  # fmt: skip
        out.close()
        deadline = time.monotonic() + 60
        while not listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.dir / "server.out").read_bytes()[-2000:].decode("utf-8", "replace")
                self.stop()
                missing("RabbitMQ (private AMQP 1.0 node)", f"it did not start: {tail}")
            time.sleep(0.1)  # nothing to wait on but the listening socket

    def vm_pid(self) -> int | None:
        try:
            return int((self.dir / "node.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        """``kill -9`` the node's Erlang VM (no clean shutdown) and wait until it is gone."""
        pid = self.vm_pid()
        assert pid is not None, "the node wrote no pid file"
        os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)
        while listening(self.port):
            time.sleep(0.05)

    def restart(self) -> None:
        self.start()

    def ctl(self, *args: str) -> str:
        done = subprocess.run(
            [str(CTL), "-n", self.name, *args], env=self._env(), cwd=self.dir,
            capture_output=True, timeout=60, user=self._user, group=self._user, check=True,
        )  # fmt: skip
        return done.stdout.decode()

    def stop(self) -> None:
        """Stop the node (``rabbitmqctl stop``; by pid if that fails) and remove its directory;
        idempotent."""
        if self.proc is None or self.proc.poll() is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        try:
            self.ctl("stop")
            self.proc.wait(30)
        except (subprocess.SubprocessError, OSError):
            pid = self.vm_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


_node: Node | None = None


def node() -> Node:
    """This test process's private AMQP 1.0 node, started on first call."""
    global _node
    if _node is None:
        _node = Node()
    return _node
