"""outbox.fastapi and the example services, run for real.

The example app (examples/fastapi_orders) is served by uvicorn on a free port in a thread,
driven over HTTP with httpx, and the database is checked afterwards: a request that returns
commits its row and its message, one that raises leaves neither, a commit that fails is the
request's answer, and the consumer in the app's lifespan processes the message and stops
cleanly with the server. consumer_lifespan's start-up and crash handling are checked with
small consumers whose failures the test triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import fastapi
import httpx
import psycopg
import pytest
import uvicorn
from fastapi import FastAPI, HTTPException
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from inbox.testing import wait_until_processed
from outbox import ConfigurationError, publish
from outbox._migrate import sqlalchemy_url
from outbox.fastapi import consumer_lifespan, transactional_session
from tests.support.ledger import record
from tests.support.poll import wait_for

ROOT = Path(__file__).resolve().parents[2]
ORDER = {"order_id": "A-1", "item": "book", "quantity": 2}


# ---- serving an app for real ---------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn whose ``up`` event is set once it listens, or has given up starting."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.up.set()

    def run_in_thread(self) -> None:
        try:
            self.run()
        finally:
            self.up.set()


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` (lifespan included) on a free port of 127.0.0.1; yields its base URL.
    On exit the server shuts down (the app's lifespan ends) and its thread is joined."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning")
    server = _Server(config)
    thread = threading.Thread(target=server.run_in_thread, name="uvicorn", daemon=True)
    thread.start()
    assert server.up.wait(60), "uvicorn did not start within 60 s"
    try:
        assert server.started, "uvicorn did not start: the app's lifespan failed (see the log)"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)
        assert not thread.is_alive(), "uvicorn did not shut down within 60 s"


@pytest.fixture
def orders_app(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """examples/fastapi_orders/app.py (the repository root is not on sys.path by itself)."""
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module("examples.fastapi_orders.app")


def rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query, params).fetchall()


def committed_ids(url: str) -> list[uuid.UUID]:
    """The ids of the messages committed: in the ledger, where every writer puts them, or
    already numbered into outbox_messages by a relay (one snapshot: never in both)."""
    both = "SELECT id FROM outbox_wal_pending UNION ALL SELECT id FROM outbox_messages"
    return [r[0] for r in rows(url, both)]


def outbox_rows(url: str) -> list[tuple[Any, ...]]:
    """outbox_messages, once what the ledger holds is numbered: here, as a relay does, or by
    the relay the app runs (which then leaves it to that relay)."""
    record(url)
    wait_for(
        lambda: rows(url, "SELECT count(*) FROM outbox_wal_pending") == [(0,)],
        what="the ledger to be numbered",
    )
    return rows(url, "SELECT id, topic, key, payload, headers FROM outbox_messages ORDER BY seq")


# ---- the example service -------------------------------------------------------------------


def test_a_request_commits_its_order_and_its_message(
    orders_app: ModuleType, database_url: str
) -> None:
    with serving(orders_app.create_app(database_url)) as base:
        response = httpx.post(f"{base}/orders", json=ORDER, timeout=30)
        assert response.status_code == 201, response.text
        message_id = uuid.UUID(response.json()["message_id"])
        # committed before the response was sent: visible now, from another connection
        assert rows(database_url, "SELECT id, item, quantity FROM orders") == [("A-1", "book", 2)]
        assert committed_ids(database_url) == [message_id]
        [(id_, topic, key, payload, headers)] = outbox_rows(database_url)
    assert (id_, topic, key) == (message_id, "orders", "A-1")
    assert json.loads(payload) == {"event": "OrderPlaced", **ORDER}
    assert headers == {"type": "OrderPlaced"}


def test_a_request_that_raises_writes_and_publishes_nothing(
    orders_app: ModuleType, database_url: str
) -> None:
    with serving(orders_app.create_app(database_url)) as base:
        failed = httpx.post(f"{base}/orders", params={"fail": 1}, json=ORDER, timeout=30)
        assert failed.status_code == 409, failed.text
        assert "nothing was written" in failed.json()["detail"]
        assert rows(database_url, "SELECT id FROM orders") == []
        assert outbox_rows(database_url) == []
        # the app still works, and only the order that succeeded reaches the consumer
        ok = httpx.post(f"{base}/orders", json={**ORDER, "order_id": "B-2"}, timeout=30)
        assert ok.status_code == 201, ok.text
        message_id = uuid.UUID(ok.json()["message_id"])
        wait_until_processed(
            database_url, consumer=orders_app.CONSUMER, ids=[message_id], timeout=30
        )
    assert rows(database_url, "SELECT id FROM orders") == [("B-2",)]
    assert [r[:3] for r in outbox_rows(database_url)] == [(message_id, "orders", "B-2")]
    assert rows(database_url, "SELECT order_id FROM order_confirmations") == [("B-2",)]


def test_a_commit_that_fails_is_the_answer_and_rolls_the_message_back(
    orders_app: ModuleType, database_url: str
) -> None:
    # The endpoint adds the order without flushing it: its INSERT runs at commit, in the
    # dependency's exit. The duplicate is only found there, so the 409 proves the commit ran
    # before the response was sent.
    with serving(orders_app.create_app(database_url)) as base:
        first = httpx.post(f"{base}/orders", json=ORDER, timeout=30)
        again = httpx.post(f"{base}/orders", json={**ORDER, "item": "pen"}, timeout=30)
    assert first.status_code == 201, first.text
    assert again.status_code == 409, again.text
    assert again.json() == {"detail": "the order already exists: nothing was written"}
    assert rows(database_url, "SELECT id, item FROM orders") == [("A-1", "book")]
    [(id_, _, _, payload, _)] = outbox_rows(database_url)
    assert id_ == uuid.UUID(first.json()["message_id"])
    assert json.loads(payload)["item"] == "book"


def test_the_consumer_runs_beside_the_app_and_stops_with_it(
    orders_app: ModuleType, database_url: str
) -> None:
    app = orders_app.create_app(database_url)
    with serving(app) as base:
        assert httpx.get(f"{base}/health", timeout=30).json() == {"consumers_running": True}
        assert app.state.consumer.ready.is_set()
        response = httpx.post(f"{base}/orders", json=ORDER, timeout=30)
        assert response.status_code == 201, response.text
        message_id = uuid.UUID(response.json()["message_id"])
        wait_until_processed(
            database_url, consumer=orders_app.CONSUMER, ids=[message_id], timeout=30
        )
        assert rows(database_url, "SELECT order_id, message_id FROM order_confirmations") == [
            ("A-1", message_id)
        ]
        assert not any(task.done() for task in app.state.tasks)
    # the server has shut down: the lifespan stopped the relay and the consumer, and each
    # run() returned on its own (not cancelled, no exception)
    assert app.state.consumer.stopping
    for task in app.state.tasks:
        assert task.done()
        assert not task.cancelled()
        assert task.exception() is None
    assert rows(database_url, "SELECT consumer, status FROM inbox_messages") == [
        (orders_app.CONSUMER, "processed")
    ]
    assert rows(database_url, "SELECT status FROM outbox_messages") == [("published",)]


# ---- the plain psycopg example ---------------------------------------------------------------


def test_psycopg_example(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    example = importlib.import_module("examples.psycopg_orders")
    example.create_tables(database_url)

    message_id = example.place_order(database_url, "A-1", "book", 2)
    with pytest.raises(example.Rejected, match="nothing was written"):
        example.place_order(database_url, "B-2", "pen", 1, fail=True)
    with pytest.raises(psycopg.errors.UniqueViolation):
        example.place_order(database_url, "A-1", "pen", 1)

    assert rows(database_url, "SELECT id, item, quantity FROM orders") == [("A-1", "book", 2)]
    [(id_, topic, key, payload, headers)] = outbox_rows(database_url)
    assert (id_, topic, key) == (message_id, "orders", "A-1")
    assert json.loads(payload) == {"event": "OrderPlaced", **ORDER}
    assert headers == {"type": "OrderPlaced"}


# ---- transactional_session with a sync Session -----------------------------------------------


def test_sync_session_commits_on_return_and_rolls_back_on_raise(database_url: str) -> None:
    engine = create_engine(sqlalchemy_url(database_url))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE notes (body text PRIMARY KEY)"))
    app = FastAPI()
    tx = transactional_session(sessionmaker(engine))  # as a default: see the example for Annotated

    @app.post("/notes/{body}", status_code=201)
    def add_note(body: str, session: Session = tx, fail: bool = False) -> dict[str, str]:
        session.execute(text("INSERT INTO notes (body) VALUES (:body)"), {"body": body})
        message_id = publish(session, topic="notes", key=body, payload={"body": body})
        if fail:
            raise HTTPException(422, "rejected")
        return {"message_id": str(message_id)}

    try:
        with serving(app) as base:
            ok = httpx.post(f"{base}/notes/kept", timeout=30)
            failed = httpx.post(f"{base}/notes/dropped", params={"fail": 1}, timeout=30)
    finally:
        engine.dispose()
    assert (ok.status_code, failed.status_code) == (201, 422)
    assert rows(database_url, "SELECT body FROM notes") == [("kept",)]
    assert [r[:3] for r in outbox_rows(database_url)] == [
        (uuid.UUID(ok.json()["message_id"]), "notes", "kept")
    ]


def test_transactional_session_refuses_what_it_cannot_use(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with pytest.raises(ConfigurationError, match="async_sessionmaker or sessionmaker"):
            transactional_session(engine)  # type: ignore[arg-type]
        monkeypatch.setattr(fastapi, "__version__", "0.120.4")
        with pytest.raises(ConfigurationError, match=r"0\.121\.1 or later"):
            transactional_session(sessionmaker(engine))
    finally:
        engine.dispose()


def test_fastapi_is_optional() -> None:
    # sys.modules["fastapi"] = None makes `import fastapi` fail, as when it is not installed
    script = (
        "import sys; sys.modules['fastapi'] = None\n"
        "import outbox, outbox.fastapi\n"
        "from sqlalchemy.orm import sessionmaker\n"
        "try:\n"
        "    outbox.fastapi.transactional_session(sessionmaker())\n"
        "except outbox.ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "needs FastAPI: pip install 'outbox-inbox[fastapi]'" in done.stdout, done.stderr


# ---- consumer_lifespan ---------------------------------------------------------------------


class Consumer:
    """A consumer the test drives: ready when ``go`` is set, crashes when ``crash`` is."""

    def __init__(self, *, fail_at_start: bool = False) -> None:
        self.fail_at_start = fail_at_start
        self.ready = asyncio.Event()
        self.go = asyncio.Event()
        self.crash = asyncio.Event()
        self.stop_requested = asyncio.Event()
        self.returned = False

    def stop(self) -> None:
        self.stop_requested.set()

    async def run(self) -> None:
        if self.fail_at_start:
            raise OSError("cannot reach the broker")
        await self.go.wait()
        self.ready.set()
        stop = asyncio.create_task(self.stop_requested.wait())
        crash = asyncio.create_task(self.crash.wait())
        await asyncio.wait({stop, crash}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        crash.cancel()
        if self.crash.is_set():
            raise RuntimeError("consumer crashed")
        self.returned = True


def test_consumer_lifespan_waits_for_ready_and_stops_cleanly() -> None:
    async def go() -> Consumer:
        consumer = Consumer()
        asyncio.get_running_loop().call_soon(consumer.go.set)
        async with consumer_lifespan(consumer) as tasks:
            assert consumer.ready.is_set()  # entered only once the consumer was receiving
            assert not tasks[0].done()
            assert not consumer.stop_requested.is_set()
        assert tasks[0].done()
        return consumer

    consumer = asyncio.run(go())
    assert consumer.stop_requested.is_set()
    assert consumer.returned


def test_consumer_lifespan_reraises_a_crash_on_exit() -> None:
    crashing, other = Consumer(), Consumer()

    async def serve() -> None:
        crashing.go.set()
        other.go.set()
        async with consumer_lifespan(crashing, other) as tasks:
            crashing.crash.set()
            await asyncio.wait([tasks[0]])  # it crashed while the app was serving
            assert not tasks[1].done()

    with pytest.raises(RuntimeError, match="consumer crashed"):
        asyncio.run(serve())
    assert other.stop_requested.is_set()
    assert other.returned  # the other consumer was still stopped cleanly


def test_consumer_lifespan_reraises_several_crashes_as_a_group() -> None:
    async def go() -> None:
        first, second = Consumer(), Consumer()
        first.go.set()
        second.go.set()
        async with consumer_lifespan(first, second) as tasks:
            first.crash.set()
            second.crash.set()
            await asyncio.wait(tasks)

    with pytest.raises(ExceptionGroup) as raised:
        asyncio.run(go())
    assert [str(e) for e in raised.value.exceptions] == ["consumer crashed"] * 2


def test_consumer_lifespan_fails_the_start_when_a_consumer_cannot_start() -> None:
    async def go() -> Consumer:
        other, broken = Consumer(), Consumer(fail_at_start=True)
        other.go.set()
        with pytest.raises(OSError, match="cannot reach the broker"):
            async with consumer_lifespan(other, broken):
                pytest.fail("the body ran although a consumer never started")
        return other

    other = asyncio.run(go())
    assert other.stop_requested.is_set()
    assert other.returned


def test_consumer_lifespan_times_out_when_a_consumer_is_never_ready() -> None:
    async def go() -> tuple[Consumer, Consumer]:
        started, stuck = Consumer(), Consumer()  # stuck.go is never set: it ignores stop()
        started.go.set()
        with pytest.raises(TimeoutError, match=r"Consumer #1 was not ready within 0\.2"):
            async with consumer_lifespan(started, stuck, ready_timeout=0.2):
                pytest.fail("the body ran although a consumer was never ready")
        return started, stuck

    started, stuck = asyncio.run(go())
    assert started.returned  # stopped cleanly
    assert stuck.stop_requested.is_set()
    assert not stuck.returned  # still starting: cancelled


def test_consumer_lifespan_refuses_what_it_cannot_run() -> None:
    async def go() -> None:
        async with consumer_lifespan(object()):  # type: ignore[arg-type]
            pass

    with pytest.raises(ConfigurationError, match="argument 0 is a object"):
        asyncio.run(go())


def test_a_relay_that_cannot_start_fails_the_app_start(empty_database_url: str) -> None:
    # the relay's tables are missing: the relay raises at once, and the app must not serve
    from outbox.exceptions import SchemaNotInstalledError
    from relay import Relay, RelayConfig
    from relay.brokers.memory import MemoryPublisher

    async def start() -> None:
        relay = Relay(RelayConfig(database_url=empty_database_url), MemoryPublisher())
        async with consumer_lifespan(relay, ready_timeout=30):
            pytest.fail("the app started serving with a relay that cannot start")

    with pytest.raises(SchemaNotInstalledError, match="migrate upgrade"):
        asyncio.run(start())


def test_the_app_starts_once_the_relay_is_publishing(database_url: str) -> None:
    from relay import Relay, RelayConfig
    from relay.brokers.memory import MemoryPublisher

    async def start() -> bool:
        relay = Relay(RelayConfig(database_url=database_url), MemoryPublisher())
        async with consumer_lifespan(relay) as tasks:
            ready = relay.ready.is_set() and not tasks[0].done()
        return ready

    assert asyncio.run(start())
