"""A sentinel password, in every form a secret takes, driven through every failure path: it
appears nowhere in stdout, stderr, logs or pages. Every CLI command, on a database that is
unreachable, unknown, missing or malformed, prints one line (never a traceback) and exits 2.

The CLI runs as a subprocess (``python -m outbox.cli``, what the ``outbox`` script runs), on
the real PostgreSQL and brokers: what an operator sees is what is checked.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.support.ledger import record
from tests.support.server_process import free_port

OUTBOX = [sys.executable, "-m", "outbox.cli"]
SENTINEL = "Sntl" + uuid.uuid4().hex[:12] + "pw"

#: every way a database password is written (libpq URL user-info and query, conninfo strings)
DB_FORMS: dict[str, Callable[[str, str, str], str]] = {
    "url user-info": lambda h, p, d: f"postgresql://postgres:{SENTINEL}@{h}:{p}/{d}",
    "url ?password=": lambda h, p, d: f"postgresql://postgres@{h}:{p}/{d}?password={SENTINEL}",
    "url ?sslpassword=": lambda h, p, d: (
        f"postgresql://postgres:{SENTINEL}@{h}:{p}/{d}?sslpassword={SENTINEL}"
    ),
    "conninfo": lambda h, p, d: f"host={h} port={p} dbname={d} user=postgres password={SENTINEL}",
    "conninfo quoted": lambda h, p, d: (
        f"host={h} port={p} dbname={d} user=postgres password='{SENTINEL} x\\'y'"
    ),
}

#: the commands that take --url, with the arguments each needs to get as far as the database
COMMANDS: list[list[str]] = [
    ["migrate", "upgrade"],
    ["migrate", "downgrade", "base"],
    ["migrate", "current"],
    ["migrate", "grants", "--relay", "relay_role", "--apply"],
    ["status"],
    ["status", "--json"],
    ["capture", "status"],
    ["capture", "enable"],
    ["dead", "list"],
    ["dead", "retry", "--all"],
    ["dead", "audit"],
    ["retention", "--older-than", "60"],
    ["inbox", "held"],
    ["inbox", "blocked"],
    ["inbox", "purge", "--older-than-days", "30"],
    ["inbox", "dead", "audit"],
    ["trace", "01a21b99-9f89-7090-80b0-2636a2646ce7"],
    ["replay", "--topic", "orders", "--to", "late", "--broker", "memory:"],
]


def _server(database_url: str) -> tuple[str, str]:
    params = conninfo_to_dict(database_url)
    return str(params.get("host") or "127.0.0.1"), str(params.get("port") or 5432)


def _failures(database_url: str) -> dict[str, tuple[str, str, str]]:
    """(host, port, dbname) of each kind of unusable database."""
    host, port = _server(database_url)
    return {
        "refused": ("127.0.0.1", "1", "x"),
        "unknown host": ("no-such-host.invalid", "5432", "x"),
        "missing database": (host, port, f"no_such_db_{uuid.uuid4().hex[:6]}"),
        "login refused": (host, port, "postgres"),  # the forms' user is replaced below
        "malformed": (host, "99999", "x"),
    }


def _url(form: str, failure: str, where: tuple[str, str, str]) -> str:
    url = DB_FORMS[form](*where)
    if failure == "login refused":  # trust auth accepts any password: refuse the user instead
        url = url.replace("postgres:", "no_such_role_x:").replace("postgres@", "no_such_role_x@")
        url = url.replace("user=postgres", "user=no_such_role_x")
    return url


def _run(args: Sequence[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OUTBOX, *args], capture_output=True, text=True, timeout=timeout, env=_env()
    )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
    env.pop("DATABASE_URL", None)
    return env


def _assert_one_clean_line(done: subprocess.CompletedProcess[str], what: str) -> None:
    output = done.stdout + done.stderr
    assert SENTINEL not in output, f"{what}: the secret leaked:\n{output}"
    assert "Traceback" not in output, f"{what}: a traceback:\n{output}"
    assert done.returncode == 2, f"{what}: exit {done.returncode}:\n{output}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, f"{what}:\n{done.stderr}"
    assert lines[0].startswith("error: "), f"{what}:\n{done.stderr}"


def _in_parallel(jobs: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    with ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def test_every_command_on_every_unusable_database_is_one_line_without_the_secret(
    database_url: str,
) -> None:
    failures = list(_failures(database_url).items())
    forms = list(DB_FORMS)
    jobs: dict[str, Callable[[], Any]] = {}
    # every form through the failures that quote the most (migrate showed the conninfo string)
    for form in forms:
        for failure, where in failures:
            if failure in ("missing database", "malformed", "login refused"):
                url = _url(form, failure, where)
                jobs[f"migrate upgrade / {form} / {failure}"] = (
                    lambda url=url: _run(["migrate", "upgrade", "--url", url])
                )
    # every command through three of the failures, the failures and the forms taken in turn
    # (each command meets each kind of failure in some form across the matrix's rows)
    for i, command in enumerate(COMMANDS):
        for j in range(3):
            failure, where = failures[(i + j) % len(failures)]
            form = forms[(i + 2 * j) % len(forms)]
            url = _url(form, failure, where)
            jobs[f"{' '.join(command)} / {form} / {failure}"] = (
                lambda command=command, url=url: _run([*command, "--url", url])
            )
    results = _in_parallel(jobs)
    for what, done in results.items():
        _assert_one_clean_line(done, what)
    hints = {
        what.rsplit(" / ", 1)[1]: done.stderr for what, done in results.items()
    }  # one example of each failure's line
    assert "check the database name in --url" in hints["missing database"]
    assert "cannot reach the database" in hints["refused"]
    assert "check --url" in hints["malformed"]
    assert "check the user and password in --url" in hints["login refused"]


def test_a_secret_in_a_usage_error_is_masked() -> None:
    # an unquoted conninfo string: click refuses its extra words, quoting them
    done = _run(["status", "--url", "host=127.0.0.1", f"password={SENTINEL}"])
    assert done.returncode == 2
    assert SENTINEL not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


@contextlib.contextmanager
def _process(args: Sequence[str], rest: list[str]) -> Iterator[subprocess.Popen[str]]:
    """``outbox ARGS`` running until the block ends (then SIGTERM); what it printed after the
    block's reads is appended to ``rest``."""
    proc = subprocess.Popen(
        [*OUTBOX, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env()
    )
    assert proc.stdout is not None
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.set_blocking(proc.stdout.fileno(), True)
        rest.append(proc.stdout.read() or "")
        proc.stdout.close()


def _read_until(proc: subprocess.Popen[str], wanted: str, seconds: float) -> str:
    """The process's output up to the first line containing ``wanted`` (or its end)."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            seen.append(line)
            if wanted in line:
                break
            continue
        if proc.poll() is not None:
            seen.append(proc.stdout.read() or "")
            break
        time.sleep(0.05)  # a pipe has no condition to await without a reader thread
    return "".join(seen)


def _relay_output(args: Sequence[str], wanted: str, seconds: float = 60) -> tuple[str, int]:
    """Run ``outbox relay ARGS`` until it logs ``wanted``, stop it; (all its output, status)."""
    rest: list[str] = []
    with _process(["relay", "--poll-interval", "0.2", *args], rest) as proc:
        head = _read_until(proc, wanted, seconds)
    return head + "".join(rest), proc.returncode


@pytest.mark.parametrize("failure", ["missing database", "malformed", "no such role"])
def test_a_relay_on_a_database_that_can_never_answer_says_so_and_exits(
    database_url: str, failure: str
) -> None:
    host, port = _server(database_url)
    url = {
        "missing database": DB_FORMS["url user-info"](host, port, "no_such_db_relay"),
        "malformed": DB_FORMS["conninfo quoted"](host, "99999", "x"),
        "no such role": f"postgresql://no_such_role_x:{SENTINEL}@{host}:{port}/postgres",
    }[failure]
    done = subprocess.run(
        [*OUTBOX, "relay", "--url", url, "--broker", f"redis://:{SENTINEL}@127.0.0.1:1/0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    _assert_one_clean_line(done, f"relay / {failure}")
    assert "psycopg.pool" not in done.stderr
    hint = {
        "missing database": "check the database name in --url",
        "malformed": "check --url",
        "no such role": "check the user and password",
    }[failure]
    assert hint in done.stderr


def test_a_relay_waits_for_a_database_that_can_heal_with_one_line_per_state(
    database_url: str,
) -> None:
    # refused: it keeps retrying with backoff, one warning for the outage (not one per attempt)
    url = DB_FORMS["conninfo"]("127.0.0.1", "1", "x")
    rest: list[str] = []
    with _process(["relay", "--url", url, "--broker", "stdout:"], rest) as proc:
        first = _read_until(proc, "database unreachable", 30)
        assert "database unreachable" in first, first
        # about 6 attempts in the next 3 s (backoff 0.1 s, doubling, at most 5 s)
        more = _read_until(proc, "never printed", 3)
        assert proc.poll() is None, "a database that can heal must not end the relay"
    output = first + more + "".join(rest)
    assert SENTINEL not in output
    assert output.count("database unreachable") == 1, output
    assert "psycopg.pool" not in output
    assert "Traceback" not in output


BROKER_URLS = {
    "nats user:password": f"nats://relay:{SENTINEL}@127.0.0.1:{{port}}",
    "nats token": f"nats://{SENTINEL}@127.0.0.1:{{port}}",
    "amqp": f"amqp://relay:{SENTINEL}@127.0.0.1:{{port}}/",
    "kafka SASL": f"kafka://relay:{SENTINEL}@127.0.0.1:{{port}}?mechanism=SCRAM-SHA-256",
    "redis": f"redis://:{SENTINEL}@127.0.0.1:{{port}}/0",
    "rediss": f"rediss://default:{SENTINEL}@127.0.0.1:{{port}}/0",
    "mqtt": f"mqtt://relay:{SENTINEL}@127.0.0.1:{{port}}",
}
BROKER_URLS["amqp1"] = f"amqp1://relay:{SENTINEL}@127.0.0.1:{{port}}"


def test_every_broker_unreachable_logs_no_secret(database_url: str) -> None:
    pytest.importorskip("nats")
    port = free_port()  # nothing listens there
    jobs = {
        name: (
            lambda broker=broker: _relay_output(
                ["--url", database_url, "--broker", broker.format(port=port)],
                "connecting to the broker failed",
            )
        )
        for name, broker in BROKER_URLS.items()
    }
    for name, (output, _status) in _in_parallel(jobs).items():
        assert "connecting to the broker failed" in output, f"{name}:\n{output}"
        assert SENTINEL not in output, f"{name}: the secret leaked:\n{output}"
        assert "Traceback" not in output, f"{name}:\n{output}"


def test_a_broker_that_refuses_the_login_logs_no_secret(database_url: str) -> None:
    """Real servers that answer: RabbitMQ refuses the login; Redis, without a password set,
    refuses the AUTH. Their clients' errors quote neither the password nor the URL."""
    from tests.support.services import reachable

    jobs: dict[str, Callable[[], tuple[str, int]]] = {}
    if reachable(5672):
        jobs["amqp"] = lambda: _relay_output(
            ["--url", database_url, "--broker", f"amqp://relay:{SENTINEL}@127.0.0.1:5672/"],
            "connecting to the broker failed",
        )
    if reachable(6379):
        jobs["redis"] = lambda: _relay_output(
            ["--url", database_url, "--broker", f"redis://someone:{SENTINEL}@127.0.0.1:6379/0"],
            "connecting to the broker failed",
        )
    if importlib.util.find_spec("proton") is not None:  # AMQP 1.0: the private node refuses
        from tests.support.amqp1_broker import node

        amqp1 = f"amqp1://relay:{SENTINEL}@127.0.0.1:{node().port}"
        jobs["amqp1"] = lambda: _relay_output(
            ["--url", database_url, "--broker", amqp1], "connecting to the broker failed"
        )
    if not jobs:
        pytest.skip("neither RabbitMQ nor Redis runs here")
    for name, (output, _status) in _in_parallel(jobs).items():
        assert "connecting to the broker failed" in output, f"{name}:\n{output}"
        assert SENTINEL not in output, f"{name}: the secret leaked:\n{output}"


def _get(url: str) -> str:
    """The page at ``url`` (an error page too), once the server listens (within 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                return str(response.read().decode())
        except urllib.error.HTTPError as error:
            return str(error.read().decode())
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # uvicorn binds its port after the command's first line


def test_the_console_on_an_unreachable_database_shows_no_secret() -> None:
    pytest.importorskip("uvicorn")

    def one(form: Callable[[str, str, str], str]) -> tuple[str, str]:
        port = free_port()
        url = form("127.0.0.1", "1", "x")
        rest: list[str] = []
        with _process(["console", "--url", url, "--port", str(port)], rest) as proc:
            started = _read_until(proc, "outbox console on", 60)
            assert "outbox console on" in started, started
            pages = "".join(_get(f"http://127.0.0.1:{port}{p}") for p in ("/", "/dead"))
        return pages, started + "".join(rest)

    results = _in_parallel({name: (lambda f=form: one(f)) for name, form in DB_FORMS.items()})
    for name, (pages, output) in results.items():
        assert "cannot be reached" in pages, f"{name}:\n{pages[:2000]}"
        assert SENTINEL not in pages, f"{name}: the secret is on the page"
        assert SENTINEL not in output, f"{name}: the secret is in the output:\n{output}"


def test_the_spark_sources_never_show_their_password(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from outbox.exceptions import ConfigurationError
    from spark_ingest._config import Source
    from spark_ingest._errors import SourceError
    from spark_ingest._sources import connect

    for url in (
        f"jdbc:postgresql://app:{SENTINEL}@127.0.0.1:5432/x",
        f"postgresql://app:{SENTINEL}@127.0.0.1:99999/x",
        f"postgresql://app:{SENTINEL}@[::1/x",
    ):
        with pytest.raises(ConfigurationError) as refused:
            Source("outbox", url)
        assert SENTINEL not in str(refused.value), str(refused.value)

    monkeypatch.setenv("SENTINEL_PW", SENTINEL)
    (tmp_path / "pw").write_text(SENTINEL)
    for source in (
        Source("outbox", "jdbc:postgresql://127.0.0.1:1/x", user="app", password_env="SENTINEL_PW"),
        Source("inbox", "postgresql://app@127.0.0.1:1/x", password_file=str(tmp_path / "pw")),
    ):
        assert SENTINEL not in repr(source)
        with pytest.raises((SourceError, psycopg.Error)) as failed:
            connect(source)
        assert SENTINEL not in str(failed.value)


def test_listings_escape_control_characters(database_url: str) -> None:
    from outbox import Message, publish_batch

    hostile = "k\x1b[2J\x1b]0;owned\x07\x9b"
    with psycopg.connect(database_url) as conn:
        dead_id, pending_id = publish_batch(
            conn,
            [Message(topic="orders", key="a", payload={}), Message(topic="t", key="b", payload={})],
            wakeup=False,
        )
        conn.commit()
        record(database_url)  # numbered into outbox_messages, as a relay does
        conn.execute(
            "UPDATE outbox_messages SET status = 'dead', key = %s, last_error = %s WHERE id = %s",
            (hostile, f"boom {hostile}", dead_id),
        )
        conn.execute(
            "UPDATE outbox_messages SET topic = %s WHERE id = %s", (f"t{hostile}", pending_id)
        )
        conn.commit()
    listed = _run(["dead", "list", "--url", database_url])
    assert listed.returncode == 0, listed.stderr
    [line] = listed.stdout.splitlines()
    assert "\x1b" not in listed.stdout
    assert "\x9b" not in listed.stdout
    assert "\x07" not in line
    assert "k\\x1b[2J\\x1b]0;owned\\x07\\x9b" in line
    status = _run(["status", "--url", database_url])
    assert status.returncode == 0, status.stderr
    assert "\x1b" not in status.stdout
    assert "\x9b" not in status.stdout
    assert "tk\\x1b[2J" in status.stdout


def test_reconcile_on_unusable_sources_is_one_line_without_the_secret(database_url: str) -> None:
    host, port = _server(database_url)
    env = {**_env(), "SENTINEL_PW": SENTINEL}
    runs = {
        "refused": ["--outbox", "jdbc:postgresql://127.0.0.1:1/x?user=app"],
        "missing database": ["--outbox", f"jdbc:postgresql://{host}:{port}/no_such_db_r"],
        "password in the URL": ["--outbox", f"jdbc:postgresql://app:{SENTINEL}@{host}:{port}/x"],
        "malformed": ["--outbox", f"postgresql://app:{SENTINEL}@{host}:99999/x"],
    }

    def one(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*OUTBOX, "reconcile", *args, "--inbox", f"jdbc:postgresql://{host}:{port}/y",
             "--subscribe", "orders=c1", "--no-record", "--password-env", "SENTINEL_PW"],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip

    for what, done in _in_parallel({k: (lambda a=a: one(a)) for k, a in runs.items()}).items():
        _assert_one_clean_line(done, f"reconcile / {what}")


#: a password with each character the redactor must not stop at, and non-ASCII
HOSTILE_PASSWORDS = {
    c: f"Sntl{uuid.uuid4().hex[:6]}{c}q7{c}pw"
    for c in ["'", '"', "<", ">", "`", " ", "%", "@", ":", "/", "#", "?", "&", "é"]
}


def test_hostile_passwords_in_stored_errors_show_nowhere(database_url: str) -> None:
    """A broker error quoting a URL with a password that holds a quote, a bracket, a blank,
    ``%@:/#?&`` or non-ASCII: stored by the relay masked; shown masked by ``dead list``,
    ``status``, ``trace`` and every console page, also when an older relay (or the inbox)
    stored it raw."""
    import asyncio
    from urllib.parse import quote

    import httpx
    from psycopg_pool import ConnectionPool

    from inbox import HandlerRunner, Outcome
    from outbox import Message, publish_batch
    from outbox.envelope import Envelope
    from relay import Relay
    from relay.exceptions import PermanentPublishError
    from tests.console.console_helpers import serve
    from tests.relay.relay_helpers import FakePublisher, await_for, config, running

    tags = [p[4:10] for p in HOSTILE_PASSWORDS.values()]
    urls = [f"amqp://relay:{p}@broker.internal:5672/" for p in HOSTILE_PASSWORDS.values()]
    with psycopg.connect(database_url) as conn:
        ids = publish_batch(
            conn, [Message("orders", f"k{i}", {}) for i in range(len(urls))], wakeup=False
        )
        [raw_id] = publish_batch(conn, [Message("orders", "raw", {})], wakeup=False)
        conn.commit()
        record(database_url)  # numbered into outbox_messages, as a relay does
        # an older relay's row: the error stored as the broker said it
        conn.execute(
            "UPDATE outbox_messages SET status = 'dead', attempts = 1, last_error = %s "
            "WHERE id = %s",
            ("PermanentPublishError: " + " ".join(urls), raw_id),
        )
        conn.commit()
    by_id = dict(zip(ids, urls, strict=True))
    publisher = FakePublisher()
    publisher.fail = lambda env: PermanentPublishError(f"refused by {by_id[env.id]}")
    relay_url = f"amqp://relay:{quote(HOSTILE_PASSWORDS['%'], safe='')}@broker.internal:5672/"
    relay = Relay(config(database_url, broker_url=relay_url), publisher)

    async def dead_letter() -> None:
        async with running(relay):
            await await_for(
                lambda: _dead_count(database_url) == len(ids) + 1, what="every row dead"
            )

    asyncio.run(dead_letter())
    with psycopg.connect(database_url) as conn:
        stored = [r[0] for r in conn.execute("SELECT last_error FROM outbox_messages")]
    for tag in tags:
        assert not any(tag in (e or "") for e in stored if e and "refused by" in e), stored

    # the inbox stores a handler's error as it is; the held page shows it
    def handler(_conn: Any, msg: Any) -> None:
        raise ValueError("cannot reach " + " ".join(urls))

    with ConnectionPool(database_url, min_size=1, max_size=2, open=True) as pool:
        runner = HandlerRunner(
            pool, handler, consumer="billing", ordered=True, max_attempts=1, on_dead="hold"
        )
        env = Envelope(id=uuid.uuid4(), topic="orders", key="K", seq=1, payload=b"{}")
        assert runner.handle(env).outcome is Outcome.DEAD

    outputs = {
        "dead list": _run(["dead", "list", "--url", database_url]),
        "status": _run(["status", "--url", database_url]),
        "status --json": _run(["status", "--json", "--url", database_url]),
        "trace": _run(["trace", str(raw_id), "--url", database_url]),
        "trace --json": _run(["trace", str(raw_id), "--json", "--url", database_url]),
        "inbox held": _run(["inbox", "held", "--url", database_url]),
    }
    for name, done in outputs.items():
        # trace exits 1 for a message an operator must act on
        assert done.returncode == (1 if name.startswith("trace") else 0), f"{name}: {done.stderr}"
        for tag in tags:
            assert tag not in done.stdout + done.stderr, f"{name}:\n{done.stdout}{done.stderr}"
    with serve(database_url) as base, httpx.Client(base_url=base) as client:
        paths = ["/", "/dead", f"/dead/{raw_id}", f"/dead/{ids[0]}", f"/messages/{raw_id}",
                 f"/messages/{raw_id}/journey", "/held", "/audit"]  # fmt: skip
        pages = {path: client.get(path) for path in paths}
    shown = [p for p, r in pages.items() if r.status_code == 200]
    assert {"/", "/dead", f"/dead/{raw_id}", "/held"} <= set(shown), pages
    for path, response in pages.items():
        for tag in tags:
            assert tag not in response.text, f"{path} shows the password"


@pytest.mark.parametrize("char", sorted(HOSTILE_PASSWORDS))
def test_the_spark_sources_never_show_a_hostile_password(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, char: str
) -> None:
    from urllib.parse import quote

    from outbox.exceptions import ConfigurationError
    from spark_ingest._config import Source
    from spark_ingest._errors import SourceError
    from spark_ingest._sources import connect

    password = HOSTILE_PASSWORDS[char]
    tag = password[4:10]
    for url in (
        f"jdbc:postgresql://app:{password}@127.0.0.1:5432/x",
        f"postgresql://app:{quote(password, safe='')}@127.0.0.1:99999/x",
    ):
        with pytest.raises(ConfigurationError) as refused:
            Source("outbox", url)
        assert tag not in str(refused.value), str(refused.value)
    monkeypatch.setenv("HOSTILE_PW", password)
    source = Source("outbox", "postgresql://app@127.0.0.1:1/x", password_env="HOSTILE_PW")
    assert tag not in repr(source)
    if char == "'":  # one connection attempt (the sentinel test above covers the others)
        with pytest.raises((SourceError, psycopg.Error)) as failed:
            connect(source)
        assert tag not in str(failed.value)


def test_a_hostile_broker_password_shows_in_no_relay_output(database_url: str) -> None:
    """One password holding every character above (percent-encoded in the URL, as a URL must
    carry it): the relay's output with the broker refusing the login (RabbitMQ, Redis) or
    unreachable (NATS), and its registration row in `outbox status`, show no part of it."""
    from urllib.parse import quote

    from tests.support.services import reachable

    password = "Sntl" + uuid.uuid4().hex[:6] + "".join(HOSTILE_PASSWORDS) + "pw"
    tag = password[4:10]
    encoded = quote(password, safe="")
    brokers = {"nats": f"nats://relay:{encoded}@127.0.0.1:{free_port()}"}
    if reachable(5672):
        brokers["amqp"] = f"amqp://relay:{encoded}@127.0.0.1:5672/"
    if reachable(6379):
        brokers["redis"] = f"redis://someone:{encoded}@127.0.0.1:6379/0"
    jobs = {
        name: (
            lambda broker=broker: _relay_output(
                ["--url", database_url, "--broker", broker], "connecting to the broker failed"
            )
        )
        for name, broker in brokers.items()
    }
    for name, (output, _status) in _in_parallel(jobs).items():
        assert "connecting to the broker failed" in output, f"{name}:\n{output}"
        assert tag not in output, f"{name}: the password leaked:\n{output}"
        assert quote(password[10:], safe="") not in output
    status = _run(["status", "--json", "--url", database_url])
    assert tag not in status.stdout + status.stderr


@pytest.fixture(scope="module")
def scram_server() -> Iterator[tuple[str, int]]:
    """A private PostgreSQL that asks role ``app`` for its password (scram-sha-256); yields
    the superuser's URL and the port."""
    import shutil
    import tempfile

    from tests.support.harness import logical_server
    from tests.support.services import missing

    # not under pytest's tmp_path: the server may run as another user, who must reach it
    workdir = Path(tempfile.mkdtemp(prefix="outbox-scram-"))
    server = logical_server(str(workdir))
    if server is None:
        missing("PostgreSQL server binaries", "apt-get install postgresql")
    assert server is not None
    try:
        port = int(conninfo_to_dict(server.admin_url)["port"])
        hba = workdir / "data" / "pg_hba.conf"
        hba.write_text("host all app 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            conn.execute("CREATE ROLE app LOGIN")
            conn.execute("SELECT pg_reload_conf()")
        yield server.admin_url, port
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_wrong_hostile_password_is_one_line_without_it(
    scram_server: tuple[str, int],
) -> None:
    """The role's password, and the wrong one given, hold a quote, a bracket, a backtick, a
    blank, ``%@:/#?&`` and non-ASCII; the server refuses the login: each form of the URL
    gives one line, with no part of either password."""
    from urllib.parse import quote

    admin, port = scram_server
    chars = "".join(HOSTILE_PASSWORDS)
    password = f"Sntl{uuid.uuid4().hex[:6]}{chars}q7pw"
    wrong = f"Sntl{uuid.uuid4().hex[:6]}{chars}Q8pw"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE app PASSWORD {}").format(sql.Literal(password)))
    quoted = "'" + wrong.replace("\\", "\\\\").replace("'", "\\'") + "'"
    forms = {
        "url": f"postgresql://app:{quote(wrong, safe='')}@127.0.0.1:{port}/postgres",
        "url ?password=": f"postgresql://app@127.0.0.1:{port}/postgres?password="
        + quote(wrong, safe=""),
        "conninfo": f"host=127.0.0.1 port={port} dbname=postgres user=app password={quoted}",
    }
    jobs = {name: (lambda url=url: _run(["status", "--url", url])) for name, url in forms.items()}
    for name, done in _in_parallel(jobs).items():
        output = done.stdout + done.stderr
        assert done.returncode == 2, f"{name}: {output}"
        assert len(output.strip().splitlines()) == 1, f"{name}: {output}"
        assert "password authentication failed" in output, f"{name}: {output}"
        for secret in (password, wrong):
            assert secret[4:10] not in output, f"{name}: a password leaked: {output}"


def _dead_count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_messages WHERE status = 'dead'").fetchone()
    assert row is not None
    return int(row[0])


def test_claim_check_store_credentials_appear_in_no_log_error_or_repr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An S3 claim check store given the sentinel as its secret key (and in its endpoint's
    user-info), unreachable: the relay's failed upload and the consumer's failed download
    show neither, in their errors, their log lines or the store's repr."""
    import asyncio
    import logging

    from tests.support.services import import_or_missing

    import_or_missing("boto3", "aws")
    from inbox import ClaimCheckResolver
    from inbox.exceptions import ClaimCheckStoreError
    from outbox._redact import install_log_redaction
    from outbox.claimcheck import ClaimCheck, S3Store
    from outbox.envelope import Envelope
    from relay import ClaimCheckPublisher
    from tests.relay.relay_helpers import FakePublisher

    endpoint = f"http://ak:{SENTINEL}@127.0.0.1:{free_port()}"
    store = S3Store("b", region="us-east-1", endpoint_url=endpoint, access_key_id="AKIDEXAMPLE",
                    secret_access_key=SENTINEL)  # fmt: skip
    env = Envelope(uuid.uuid4(), "docs", "k", 1, b"x" * 100)
    caplog.set_level(logging.DEBUG)  # botocore's debug lines too
    install_log_redaction(caplog.handler)  # what the relay and the CLI install on theirs

    async def go() -> tuple[str, str]:
        pub = ClaimCheckPublisher(FakePublisher(), ClaimCheck(store, threshold=10),
                                  upload_timeout=20)  # fmt: skip
        (upload_error,) = await pub.publish_batch([env])
        assert upload_error is not None
        ref = ClaimCheck(store).reference(env, "outbox/docs/x")
        reference = Envelope(env.id, "docs", "k", 1, ref.to_bytes(),
                             "application/vnd.outbox.claim-check+json")  # fmt: skip
        with pytest.raises(ClaimCheckStoreError) as caught:
            await ClaimCheckResolver(store).resolve(reference)
        return str(upload_error), f"{caught.value} {caught.value.__cause__!r}"

    upload, download = asyncio.run(go())
    for what, text in [("upload error", upload), ("download error", download),
                       ("repr", repr(store)), ("logs", caplog.text)]:  # fmt: skip
        assert SENTINEL not in text, f"{what}: the secret leaked:\n{text}"
    assert "claim check upload" in upload
