"""One relay process for many databases (relay/_fleet.py): fifty tenant databases on one
server, one of them down, delivered to NATS; a database added by a reload; a copied
database's origin refused until it has its own; a database removed stops cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from outbox.envelope import HEADER_KEY, HEADER_ORIGIN, HEADER_SEQ
from relay.brokers.memory import MemoryPublisher
from relay.cli import make_publisher
from relay.fleet import Fleet, FleetConfig, FleetMetrics, load_fleet
from tests.relay.broker_helpers import nats_stream, need
from tests.relay.relay_helpers import await_for, wait_for, write
from tests.support.harness import PgServer
from tests.support.server_process import free_port

#: per database: keys x messages per key
KEYS, PER_KEY = 3, 4
SECRET = "s3cret-fleet-pw"
#: databases created or dropped at once
_AT_ONCE = 4


@pytest.fixture
def tenants(pg_server: PgServer, template_db: str) -> Iterator[TenantFactory]:
    factory = TenantFactory(pg_server, template_db)
    try:
        yield factory
    finally:
        factory.drop_all()


class TenantFactory:
    """Databases cloned from the migrated template (so they share its origin until told)."""

    def __init__(self, server: PgServer, template: str) -> None:
        self.server = server
        self.template = template
        self.prefix = f"outbox_f{uuid.uuid4().hex[:6]}_"
        self.names: list[str] = []

    def create(self, n: int) -> list[str]:
        names = [f"{self.prefix}{len(self.names) + i:02d}" for i in range(n)]
        self.names += names

        def clone(name: str) -> None:
            with psycopg.connect(self.server.admin_url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(name), sql.Identifier(self.template)
                    )
                )

        with ThreadPoolExecutor(_AT_ONCE) as pool:
            list(pool.map(clone, names))
        return names

    def url(self, name: str) -> str:
        return self.server.url(name)

    def identify(self, name: str, origin: str | None = None) -> None:
        with psycopg.connect(self.url(name), autocommit=True) as conn:
            conn.execute("UPDATE outbox_identity SET origin = %s", (origin or name,))

    def fill(self, name: str) -> None:
        write(self.url(name), [("orders", f"k{k}") for _ in range(PER_KEY) for k in range(KEYS)])

    def connections(self) -> dict[str, int]:
        with psycopg.connect(self.server.admin_url) as conn:
            rows = conn.execute(
                "SELECT datname, count(*) AS n FROM pg_stat_activity "
                "WHERE datname LIKE %s GROUP BY datname",
                (self.prefix + "%",),
            ).fetchall()
        return {name: n for name, n in rows}

    def drop_all(self) -> None:
        with ThreadPoolExecutor(_AT_ONCE) as pool:
            list(pool.map(self.server.drop_database, self.names))


def fleet_file(
    path: Path, broker: str, databases: Sequence[tuple[str, str]], subject: str | None = None
) -> Path:
    """A relay's file listing ``databases`` (name, URL); topic orders to ``subject``."""
    lines = [
        "listen = false",
        "watch = false",
        "max_in_flight = 1",
        "poll_interval = 0.2",
        "heartbeat_interval = 1.0",
        "shutdown_timeout = 5.0",
        "[broker]",
        f'url = "{broker}"',
        *(["[broker.destinations]", f'orders = "{subject}"'] if subject else []),
        "[fleet]",
        "max_concurrent = 8",
        "database_connections = 1",
        "retry_max = 1.0",
        "connect_timeout = 3.0",
    ]
    for name, url in databases:
        lines += ["[[databases]]", f'name = "{name}"', f'url = "{url}"']
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.asynccontextmanager
async def serving(config: FleetConfig, path: Path, **kw: Any) -> AsyncIterator[Fleet]:
    fleet = Fleet(config, make_publisher(config.base), load=lambda: _reload(path), **kw)
    task = asyncio.create_task(fleet.run())
    try:
        yield fleet
    finally:
        fleet.stop()
        await asyncio.wait_for(task, 30)


def _reload(path: Path) -> FleetConfig:
    config = load_fleet(path)
    assert config is not None
    return config


def in_key_order_once(messages: Sequence[tuple[str, str, int]]) -> None:
    """Each (origin, key) has seqs 1..PER_KEY, once each, in that order."""
    by_key: dict[tuple[str, str], list[int]] = {}
    for origin, key, seq in messages:
        by_key.setdefault((origin, key), []).append(seq)
    wrong = {k: s for k, s in by_key.items() if s != list(range(1, PER_KEY + 1))}
    assert wrong == {}, f"out of order or repeated: {dict(list(wrong.items())[:3])}"


def test_fifty_databases_one_down_to_nats_and_one_added_by_reload(
    tenants: TenantFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    need(4222, "NATS")
    asyncio.run(_fifty(tenants, tmp_path, caplog))


async def _fifty(tenants: TenantFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="relay")
    started = time.monotonic()
    names = tenants.create(50)
    for name in names[:49]:
        tenants.identify(name)
        tenants.fill(name)
    created = time.monotonic() - started
    down = make_url(tenants.url(names[49])).set(
        database=f"{tenants.prefix}missing", password=SECRET
    )
    listed = [(n, tenants.url(n)) for n in names[:49]]
    listed.append(("tenant-down", down.render_as_string(hide_password=False)))
    async with nats_stream("fleet") as (js, stream, subject):
        path = fleet_file(tmp_path / "fleet.toml", "nats://127.0.0.1:4222", listed, subject)
        config = load_fleet(path)
        assert config is not None
        metrics = FleetMetrics.prometheus()
        async with serving(config, path, metrics=metrics) as fleet:
            expected = 49 * KEYS * PER_KEY
            await await_for(lambda: _stored(js, stream, expected), within=40,
                            what=f"{expected} messages in the stream")  # fmt: skip
            delivered = time.monotonic() - started - created
            states = fleet.states()
            assert states["tenant-down"]["state"] == "paused"
            assert "does not exist" in states["tenant-down"]["reason"]
            assert {s["state"] for n, s in states.items() if n != "tenant-down"} == {"running"}
            used = tenants.connections()
            # database_connections = 1: one connection per database, the down one none
            assert set(used.values()) == {1}, used
            assert len(used) == 49, used
            # a database added by a reload is served
            added = tenants.create(1)[0]
            tenants.identify(added)
            tenants.fill(added)
            listed.append(("tenant-added", tenants.url(added)))
            fleet_file(path, "nats://127.0.0.1:4222", listed, subject)
            fleet.request_reload()
            await await_for(lambda: _stored(js, stream, expected + KEYS * PER_KEY), within=20,
                            what="the added database's messages")  # fmt: skip
            from prometheus_client import generate_latest

            registry = metrics.registry
            assert registry is not None
            counted = 'outbox_relay_published_total{database="tenant-added",topic="orders"} 12.0'
            # counted once marked, a moment after the broker has them
            await await_for(lambda: counted in generate_latest(registry).decode(),
                            what="the added database's messages counted")  # fmt: skip
            text = generate_latest(registry).decode()
        messages = await _read(js, stream)
    assert len(messages) == 50 * KEYS * PER_KEY
    in_key_order_once(messages)
    assert {o for o, _, _ in messages} == {*names[:49], added}
    assert 'outbox_relay_database_up{database="tenant-down"} 0.0' in text
    assert f'outbox_relay_database_up{{database="{names[0]}"}} 1.0' in text
    assert "postgresql://" not in text
    lines = [r.getMessage() for r in caplog.records]
    paused = [line for line in lines if "database tenant-down paused" in line]
    assert paused, lines[-20:]
    assert "does not exist" in paused[0]
    assert not any(SECRET in line for line in lines)
    assert any(getattr(r, "database", None) == names[3] for r in caplog.records)
    assert any("added tenant-added; removed none; restarted none" in line for line in lines)
    assert sum("database tenant-down paused" in line for line in lines) == 1  # once per reason
    print(f"\n50 databases: created and filled in {created:.1f}s, delivered {delivered:.1f}s after "
          f"the relay started; connections per database {set(used.values())}")  # fmt: skip


async def _stored(js: Any, stream: str, n: int) -> bool:
    info = await js.stream_info(stream)
    return bool(info.state.messages >= n)


async def _read(js: Any, stream: str) -> list[tuple[str, str, int]]:
    info = await js.stream_info(stream)
    out = []
    for n in range(1, info.state.messages + 1):
        h = (await js.get_msg(stream, n)).headers
        out.append((h[HEADER_ORIGIN], h[HEADER_KEY], int(h[HEADER_SEQ])))
    return out


def _published(fleet: Fleet) -> list[tuple[str, str, int]]:
    inner = fleet.publisher.inner
    assert isinstance(inner, MemoryPublisher)
    return [(e.origin or "", e.key, e.seq) for e in inner.published()]


def test_a_copied_origin_is_refused_until_it_has_its_own_and_removal_stops_cleanly(
    tenants: TenantFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    empty_database_url: str,
) -> None:  # fmt: skip
    asyncio.run(_copied(tenants, tmp_path, caplog, empty_database_url))


async def _copied(
    tenants: TenantFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture, bare_url: str
) -> None:
    caplog.set_level(logging.INFO, logger="relay")
    a, b, c = tenants.create(3)  # all three carry the template's origin
    for name in (a, b, c):
        tenants.fill(name)
    listed = [("a", tenants.url(a)), ("b", tenants.url(b)), ("c", tenants.url(c)),
              ("bare", bare_url)]  # fmt: skip
    path = fleet_file(tmp_path / "fleet.toml", "memory:", listed)
    # c's own origin comes from its table
    own = f'url = "{tenants.url(c)}"'
    path.write_text(path.read_text().replace(own, f'{own}\norigin = "tenant-c"'))
    config = load_fleet(path)
    assert config is not None
    async with serving(config, path) as fleet:
        await await_for(lambda: len(_published(fleet)) == 2 * KEYS * PER_KEY, within=20,
                        what="a's and c's messages")  # fmt: skip
        # a and b share one origin: whichever connects first keeps it, the other pauses
        await await_for(lambda: _paused(fleet, "a", "b") is not None, what="a or b paused")
        states = fleet.states()
        paused, kept = _paused(fleet, "a", "b") or ("", "")
        assert states[kept]["state"] != "paused", states
        assert f"database '{kept}''s too" in states[paused]["reason"]
        assert "outbox tables are missing" in states["bare"]["reason"]
        assert {o for o, _, _ in _published(fleet)} - {"tenant-c"} == {_origin(tenants, a)}
        tenants.identify({"a": a, "b": b}[paused], f"tenant-{paused}")  # the fix the line names
        await await_for(lambda: len(_published(fleet)) == 3 * KEYS * PER_KEY, within=20,
                        what="the paused one's messages once it has its own origin")  # fmt: skip
        fleet_file(path, "memory:", listed[:2])  # c and bare removed
        fleet.request_reload()
        await await_for(lambda: set(fleet.states()) == {"a", "b"}, what="c stopped")
        in_key_order_once(_published(fleet))
    with psycopg.connect(tenants.url(c)) as conn:
        relays = conn.execute("SELECT count(*) FROM outbox_relays").fetchone()
    assert relays == (0,)  # unregistered when it stopped
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"database {paused} paused" in line and "UPDATE outbox_identity" in line
               for line in lines)  # fmt: skip
    assert any("removed c, bare" in line for line in lines)


def _paused(fleet: Fleet, one: str, other: str) -> tuple[str, str] | None:
    """(paused, kept) when exactly one of the two is paused, else None."""
    states = fleet.states()
    paused = [n for n in (one, other) if states[n]["state"] == "paused"]
    if len(paused) != 1:
        return None
    return paused[0], other if paused[0] == one else one


def _origin(tenants: TenantFactory, name: str) -> str:
    with psycopg.connect(tenants.url(name)) as conn:
        row = conn.execute("SELECT origin FROM outbox_identity").fetchone()
    assert row is not None
    return str(row[0])


def test_a_fleet_file_is_checked_whole() -> None:
    """A [[databases]] table's bad name, unknown key or bad override is one line naming it."""
    from outbox.exceptions import ConfigurationError

    cases = {
        '[[databases]]\nname = "a b"\nurl = "postgresql:///x"': "name must be letters",
        '[[databases]]\nname = "a"\nurl = "postgresql:///x"\nbatch = 3': "unknown setting 'batch'",
        '[[databases]]\nname = "a"\nurl = "postgresql:///x"\nmax_in_flight = 0':
            "[[databases]] 'a': max_in_flight must be an integer >= 1",
        '[[databases]]\nname = "a"\nurl = "postgresql:///x"\n[[databases]]\nname = "a"\n'
        'url = "postgresql:///y"': "the name 'a' is given twice",
        'database_url = "postgresql:///z"\n[[databases]]\nname = "a"\nurl = "postgresql:///x"':
            "database_url (or --url) is not used with it",
        '[fleet]\nmax_concurrent = 2': "no [[databases]] table",
        'databases = []\n[fleet]\nmax_concurrent = 0': "max_concurrent must be an integer >= 1",
    }  # fmt: skip
    import tempfile

    for text, said in cases.items():
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write('broker = "memory:"\n' + text + "\n")
        with pytest.raises(ConfigurationError) as err:
            load_fleet(f.name)
        assert said in str(err.value), (text, str(err.value))
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write('broker = "memory:"\ndatabases = []\n')
    config = load_fleet(f.name)
    assert config is not None
    assert config.databases == ()


def _lines(path: Path) -> list[tuple[str, str, int]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        headers = json.loads(line)["headers"]
        out.append((headers[HEADER_ORIGIN], headers[HEADER_KEY], int(headers[HEADER_SEQ])))
    return out


def test_the_command_reloads_on_sighup_names_each_database_and_status_lists_them(
    tenants: TenantFactory, tmp_path: Path
) -> None:
    """`outbox relay --config` with [[databases]]: lines name the database, metrics carry the
    label, SIGHUP adds one, `outbox status --config` shows each, SIGTERM stops them all."""
    a, b, c = tenants.create(3)
    for name in (a, b, c):
        tenants.identify(name)
        tenants.fill(name)
    out = tmp_path / "out.jsonl"
    listed = [("a", tenants.url(a)), ("b", tenants.url(b))]
    path = fleet_file(tmp_path / "fleet.toml", f"file:{out}", listed)
    port = free_port()
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "relay", "--config", str(path), "--metrics-port", str(port)],
            stderr=err,
        )
    try:
        wait_for(lambda: len(_lines(out)) == 2 * KEYS * PER_KEY, what="a's and b's messages")
        fleet_file(path, f"file:{out}", [*listed, ("c", tenants.url(c)), ("gone", _gone(tenants))])
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: len(_lines(out)) == 3 * KEYS * PER_KEY, what="c's messages")
        wait_for(lambda: "database gone paused" in stderr.read_text(), what="gone paused")
        counted = 'outbox_relay_published_total{database="c",topic="orders"} 12.0'
        wait_for(lambda: counted in _page(port), what="c's messages counted once marked")
        assert 'outbox_relay_database_up{database="gone"} 0.0' in _page(port)
        status = subprocess.run(
            [sys.executable, "-m", "relay", "status", "--config", str(path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert status.returncode == 1, status  # one database does not answer
        rows = {line.split()[0]: line for line in status.stdout.splitlines()[1:]}
        assert set(rows) == {"a", "b", "c", "gone"}
        assert rows["a"].split()[1:6] == ["0", "0", "0", "-", "1"]  # one live relay
        assert "DOES NOT ANSWER" in rows["gone"]
        assert "does not exist" in rows["gone"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    in_key_order_once(_lines(out))
    log = stderr.read_text()
    assert "relay[a]:" in log, log[-2000:]
    assert "relay[c]:" in log
    assert "added c, gone; removed none; restarted none" in log
    assert "stopped (every database)" in log
    assert SECRET not in log


def _page(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        return str(page.read().decode())


def _gone(tenants: TenantFactory) -> str:
    url = make_url(tenants.url(tenants.names[0])).set(database=f"{tenants.prefix}gone",
                                                       password=SECRET)  # fmt: skip
    return url.render_as_string(hide_password=False)


def test_the_how_to_file_loads(tmp_path: Path) -> None:
    """docs/how-to/tenants.md's relay.toml is a valid list of two databases."""
    page = (Path(__file__).parents[2] / "docs" / "how-to" / "tenants.md").read_text()
    block = page.split("# relay.toml  (outbox relay --config relay.toml)\n", 1)[1]
    path = tmp_path / "relay.toml"
    path.write_text(block.split("```", 1)[0])
    config = load_fleet(path)
    assert config is not None
    assert [e.name for e in config.databases] == ["tenant-a", "tenant-b"]
    assert config.configs["tenant-b"].schema == "outbox"
    assert config.configs["tenant-b"].max_in_flight == 4
    assert config.configs["tenant-a"].max_in_flight == 1
    assert config.settings.database_connections == 1


def test_two_processes_with_one_list_share_each_database(
    tenants: TenantFactory, tmp_path: Path
) -> None:
    """Two relay fleets with the same list: each database's leases split its work, every
    message is published once (by one of them)."""
    names = tenants.create(3)
    for name in names:
        tenants.identify(name)
        for _ in range(5):
            tenants.fill(name)
    path = fleet_file(tmp_path / "fleet.toml", "memory:", [(n, tenants.url(n)) for n in names])

    async def both() -> list[tuple[str, str, int]]:
        one, two = load_fleet(path), load_fleet(path)
        assert one is not None
        assert two is not None
        assert one.base.relay_id != two.base.relay_id
        async with serving(one, path) as first, serving(two, path) as second:
            total = 3 * 5 * KEYS * PER_KEY
            await await_for(lambda: len(_published(first)) + len(_published(second)) >= total,
                            what="every message")  # fmt: skip
            return _published(first) + _published(second)

    published = asyncio.run(both())
    assert len(published) == 3 * 5 * KEYS * PER_KEY
    assert len(set(published)) == len(published)  # (origin, key, seq): each once


def test_a_reload_that_does_not_load_keeps_the_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file broken between two reloads is refused in one line; the running list stays."""
    caplog.set_level(logging.INFO, logger="relay")
    path = tmp_path / "fleet.toml"
    path.write_text('broker = "memory:"\ndatabases = []\n')
    config = load_fleet(path)
    assert config is not None

    async def go() -> None:
        async with serving(config, path) as fleet:
            path.write_text('broker = "memory:"\n[[databases]]\nname = "x y"\nurl = "u"\n')
            fleet.request_reload()
            await await_for(lambda: any("reload refused" in r.getMessage()
                                        for r in caplog.records), what="the refusal")  # fmt: skip
            assert fleet.states() == {}
            assert not fleet.stopping

    asyncio.run(go())
    refused = next(r.getMessage() for r in caplog.records if "reload refused" in r.getMessage())
    assert "name must be letters" in refused
    assert "the 0 database(s) go on unchanged" in refused


def test_status_of_unusable_databases_names_their_table_and_shows_no_password(
    tmp_path: Path,
) -> None:
    """Each listed database that cannot be used is one line naming its [[databases]] url (never
    --url, which a fleet does not take), with no password in it."""
    config = tmp_path / "fleet.toml"
    config.write_text(
        '[broker]\nurl = "memory://"\n\n'
        '[[databases]]\nname = "norole"\n'
        'url = "postgresql://nobody:Fleet5ecret%40x@127.0.0.1:5432/postgres"\n\n'
        '[[databases]]\nname = "closed"\nurl = "postgresql://u:Fleet5ecret@127.0.0.1:1/x"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "status", "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Fleet5ecret" not in output
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    for name in ("norole", "closed"):
        assert "DOES NOT ANSWER" in lines[name], output
        assert "its [[databases]] url" in lines[name], output
        assert "--url" not in lines[name], output
