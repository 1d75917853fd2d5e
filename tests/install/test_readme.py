"""The README as a newcomer runs it: from the wheel in a clean virtualenv, its commands as
written, against a fresh ``nats-server -js`` that has no stream, through to a consumer that
applies the message.

The only change to the page's text is the NATS server's port (this machine's 4222 belongs to
the shared server; the test's own runs elsewhere). The relay's block runs in the background,
as a reader runs it in a terminal of its own; so does the consumer's Python block.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from tests.support.nats_server import PrivateNats
from tests.support.services import missing, require_port

Env = Any
ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
SUPERUSER = "postgresql://postgres@127.0.0.1:5432/postgres"


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(lang, code) for lang, _, code in FENCE.findall(text)]


def _fresh_shop_database() -> None:
    """The page's database starts empty: an earlier run's rows would already be published."""
    with psycopg.connect(SUPERUSER, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS shop WITH (FORCE)")


def _invoices() -> list[str]:
    try:
        with psycopg.connect("postgresql://shop@127.0.0.1:5432/shop") as conn:
            return [r[0] for r in conn.execute("SELECT order_id FROM invoices").fetchall()]
    except psycopg.Error:
        return []  # not created yet


def _published() -> int:
    with psycopg.connect("postgresql://shop@127.0.0.1:5432/shop") as conn:
        row = conn.execute("SELECT count(*) FROM outbox_messages WHERE status = 'published'")
        return int(row.fetchone()[0])  # type: ignore[index]


def _stop(proc: subprocess.Popen[str], sig: signal.Signals) -> tuple[int, str]:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return proc.returncode, out


def test_the_readme_delivers_a_message_on_a_fresh_nats_server(
    installed: Callable[[str], Env], project: Path, tmp_path: Path
) -> None:
    require_port(5432, "PostgreSQL")
    if shutil.which("psql") is None:
        missing("psql", "apt-get install postgresql-client")
    env = installed("nats")
    _fresh_shop_database()
    with PrivateNats(tmp_path / "js") as nats_server:
        text = (ROOT / "README.md").read_text()
        text = text[text.index("## Install") :]  # the blocks above are for this repository's CI
        text = text.replace("nats://127.0.0.1:4222", nats_server.url)
        blocks = _blocks(text)
        kinds = [lang for lang, _ in blocks if lang in ("bash", "python")]
        assert kinds == ["bash", "python", "bash", "bash", "python"], kinds
        install, write, configure, relay, consume = [c for k, c in blocks if k in kinds]
        environ: dict[str, str] = {}

        def shell(code: str) -> str:
            envfile = project / ".env.json"
            wrapped = (
                f"set -euo pipefail\n{code}\n"
                f"python -c 'import json, os; print(json.dumps(dict(os.environ)))' > {envfile}"
            )
            done = env.run(["bash", "-c", wrapped], cwd=project, timeout=600, **environ)
            assert done.returncode == 0, f"README shell block failed:\n{code}\n{done.stderr}"
            environ.update(json.loads(envfile.read_text()))
            return done.stdout

        shell(install)
        assert environ["OUTBOX_DATABASE_URL"] == "postgresql://shop@127.0.0.1:5432/shop"
        done = env.run([str(env.python), "-c", write], cwd=project, **environ)
        assert done.returncode == 0, done.stderr
        checked = shell(configure)
        assert "topic orders -> orders: ok, stream ORDERS (created at start)" in checked
        background = {"cwd": project, "env": env.environ(**environ), "text": True,
                      "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}  # fmt: skip
        relay_proc = subprocess.Popen(["bash", "-c", relay], **background)
        consumer = None
        try:
            deadline = time.monotonic() + 60
            # the reader starts the consumer once the relay runs (it has made the stream)
            while _published() != 1 and relay_proc.poll() is None:
                assert time.monotonic() < deadline, "not published within 60 s"
                time.sleep(0.2)  # another process's database: nothing to wait on but a poll
            consumer = subprocess.Popen([str(env.python), "-c", consume], **background)
            while _invoices() != ["42"]:
                if relay_proc.poll() is not None or consumer.poll() is not None:  # failed
                    break
                assert time.monotonic() < deadline, "no invoice within 60 s"
                time.sleep(0.2)  # another process's database: nothing to wait on but a poll
            status = env.run(["outbox", "status"], cwd=project, **environ)
        finally:
            relay_code, relay_out = _stop(relay_proc, signal.SIGTERM)
            _, consumer_out = _stop(consumer, signal.SIGINT) if consumer else (0, "")
    assert _invoices() == ["42"], f"relay:\n{relay_out}\nconsumer:\n{consumer_out}"
    assert status.returncode == 0, status.stderr
    assert f"{nats_server.url}, reachable since" in status.stdout
    assert relay_code == 0, relay_out
    assert re.search(r"relay \S+ started: mode polling, broker nats://", relay_out), relay_out
    assert re.search(r"relay \S+ stopped", relay_out), relay_out
